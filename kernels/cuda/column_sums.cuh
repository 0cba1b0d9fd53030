// The second pass shared by the parameter-gradient reductions (layernorm's dweight/dbias, rms_norm's dweight,
// bias's dbias): the first pass leaves one float partial per (row chunk, column); this adds each column's partials
// in chunk order and accumulates (+=) the total into the gradient. Fixed orders throughout, so the result is
// bitwise reproducible run to run, whatever the schedule. A helper of those three launchers, not an op, so it has
// no CPU twin and no .cu of its own: each including file gets its own copy of the kernel.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/cuda/launch.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {

// About four resident blocks on each of an H200's 132 SMs: enough row chunks to fill the GPU while the
// partials stay a few MiB.
inline constexpr int target_reduction_blocks = 512;

// Splits N rows into at most `max_chunks` chunks of at least `minimum_rows` rows, none empty: a function of
// its arguments alone, never of the schedule. Returns the chunk count; `rows_per_chunk` gets the chunk length.
inline int row_chunk_count(int N, int minimum_rows, int max_chunks, int& rows_per_chunk) {
    const int wanted = ceil_div(N, minimum_rows);
    const int chunks = wanted < 1 ? 1 : (wanted > max_chunks ? max_chunks : wanted);
    rows_per_chunk = ceil_div(N, chunks);
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    const int used = ceil_div(N, rows_per_chunk); // rounding up the length may leave the last chunks empty
    return used < 1 ? 1 : used;
}

// Threads that split one column's chunks before a fixed-order combine.
inline constexpr int column_chunk_lanes = 8;

// A block owns 32 adjacent columns (coalesced reads of each chunk's row of partials); its 8 chunk lanes take
// chunks lane, lane+8, ... and lane 0 adds the 8 sums in order.
static __global__ void add_column_partials_kernel(float* first, float* second, const float* partials, int chunks,
                                                  int first_columns, int columns) {
    __shared__ float lane_sums[column_chunk_lanes][warp_size];
    const int column_in_tile = threadIdx.x % warp_size, chunk_lane = threadIdx.x / warp_size;
    const int column = blockIdx.x * warp_size + column_in_tile;
    float sum = 0.0f;
    if (column < columns) {
        for (int chunk = chunk_lane; chunk < chunks; chunk += column_chunk_lanes)
            sum += partials[int64_t(chunk) * columns + column];
    }
    lane_sums[chunk_lane][column_in_tile] = sum;
    __syncthreads();
    if (chunk_lane != 0 || column >= columns) return;
    float total = 0.0f;
    for (int lane = 0; lane < column_chunk_lanes; ++lane) total += lane_sums[lane][column_in_tile];
    if (column < first_columns) first[column] += total;
    else second[column - first_columns] += total;
}

// partials (chunks, columns); column c < first_columns goes to first[c], the rest to second[c - first_columns].
// static, as its kernel: each file's launcher launches that file's copy.
static inline void add_column_partials(float* first, float* second, const float* partials, int chunks,
                                       int first_columns, int columns, cudaStream_t stream) {
    if (columns == 0) return;
    ENGINE_LAUNCH(add_column_partials_kernel, ceil_div(columns, warp_size), warp_size * column_chunk_lanes, 0, stream,
                  first, second, partials, chunks, first_columns, columns);
}

} // namespace engine::kernels::cuda
