// Bias broadcast add and its column-sum gradient (CUDA twin of kernels/cpu/bias.cpp). The gradient is a
// deterministic two-pass reduction: float partials per (row chunk, 128-column tile), then a fixed-order column
// pass (kernels/cuda/column_sums.cuh). Storage float or bf16 (out, bias, dout); the partials and dbias are float.
#include "base/cuda/launch.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int row_lanes = block_size / warp_size;          // rows a block reads at once
constexpr int columns_per_lane = vector_width;             // 4 columns per thread on either path
constexpr int tile_columns = warp_size * columns_per_lane; // 128 columns per block
constexpr int minimum_rows_per_chunk = row_lanes;

int backward_tiles(int OC) { return ceil_div(OC, tile_columns); }

// As many chunks as keep about target_reduction_blocks blocks busy over all tiles: a function of N and OC.
int backward_chunks(int N, int OC, int& rows_per_chunk) {
    const int tiles = backward_tiles(OC);
    const int max_chunks = target_reduction_blocks / tiles > 1 ? target_reduction_blocks / tiles : 1;
    return row_chunk_count(N, minimum_rows_per_chunk, max_chunks, rows_per_chunk);
}

} // namespace

int bias_backward_workspace_count(int N, int OC) {
    int rows_per_chunk = 0;
    return backward_chunks(N, OC, rows_per_chunk) * OC;
}

template <typename T>
static __global__ void bias_add_forward_kernel(T* out, const T* bias, int OC, int64_t count) {
    for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        out[index] = narrow<T>(widen(out[index]) + widen(bias[index % OC]));
    }
}

// Block (tile, chunk): each thread sums 4 columns over rows row_lane, row_lane + 8, ... of the chunk in float;
// the block then adds its 8 row lanes in order into partials (chunks, OC).
template <typename T, int width>
static __global__ void bias_backward_partials_kernel(float* partials, const T* dout, int N, int OC,
                                                     int rows_per_chunk) {
    ENGINE_DYNAMIC_SHARED(float, lane_sums); // (row_lanes, tile_columns)
    const int lane = threadIdx.x % warp_size, row_lane = threadIdx.x / warp_size;
    const int tile_start = blockIdx.x * tile_columns;
    const int first_row = blockIdx.y * rows_per_chunk, end_row = min(N, first_row + rows_per_chunk);
    float sums[columns_per_lane] = {};
    for (int row = first_row + row_lane; row < end_row; row += row_lanes) {
        const T* dout_row = dout + int64_t(row) * OC + tile_start;
        if constexpr (width == vector_width) {
            if (tile_start + lane * vector_width < OC) { // OC % 4 == 0: a pack is wholly in or out
                const Pack<vector_width> values = load_pack<vector_width>(dout_row + lane * vector_width);
                for (int k = 0; k < vector_width; ++k) sums[k] += values[k];
            }
        } else {
            for (int k = 0; k < columns_per_lane; ++k) {
                const int column = lane_tile_offset<width>(lane, k);
                if (tile_start + column < OC) sums[k] += widen(dout_row[column]);
            }
        }
    }
    for (int k = 0; k < columns_per_lane; ++k)
        lane_sums[row_lane * tile_columns + lane_tile_offset<width>(lane, k)] = sums[k];
    __syncthreads();
    for (int column = threadIdx.x; column < tile_columns; column += blockDim.x) {
        if (tile_start + column >= OC) continue;
        float sum = 0.0f;
        for (int r = 0; r < row_lanes; ++r) sum += lane_sums[r * tile_columns + column];
        partials[int64_t(blockIdx.y) * OC + tile_start + column] = sum;
    }
}

template <typename T>
static void launch_bias_add_forward(T* out, const T* bias, int N, int OC, cudaStream_t stream) {
    const int64_t count = int64_t(N) * OC;
    if (count == 0) return;
    ENGINE_LAUNCH(bias_add_forward_kernel<T>, elementwise_grid(count, block_size), block_size, 0, stream, out, bias,
                  OC, count);
}

void bias_add_forward(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
    launch_bias_add_forward(out, bias, N, OC, stream);
}
void bias_add_forward(bfloat16* out, const bfloat16* bias, int N, int OC, cudaStream_t stream) {
    launch_bias_add_forward(out, bias, N, OC, stream);
}

template <typename T>
static void launch_bias_backward(float* dbias, float* partials_workspace, const T* dout, int N, int OC,
                                 cudaStream_t stream) {
    if (N == 0 || OC == 0) return;
    int rows_per_chunk = 0;
    const int chunks = backward_chunks(N, OC, rows_per_chunk);
    const dim3 grid(backward_tiles(OC), chunks);
    constexpr size_t shared_bytes = row_lanes * tile_columns * sizeof(float);
    if (OC % vector_width == 0 && vector_aligned(dout))
        ENGINE_LAUNCH((bias_backward_partials_kernel<T, vector_width>), grid, block_size, shared_bytes, stream,
                      partials_workspace, dout, N, OC, rows_per_chunk);
    else
        ENGINE_LAUNCH((bias_backward_partials_kernel<T, 1>), grid, block_size, shared_bytes, stream,
                      partials_workspace, dout, N, OC, rows_per_chunk);
    add_column_partials(dbias, nullptr, partials_workspace, chunks, OC, OC, stream);
}

void bias_backward(float* dbias, float* partials_workspace, const float* dout, int N, int OC, cudaStream_t stream) {
    launch_bias_backward(dbias, partials_workspace, dout, N, OC, stream);
}
void bias_backward(float* dbias, float* partials_workspace, const bfloat16* dout, int N, int OC,
                   cudaStream_t stream) {
    launch_bias_backward(dbias, partials_workspace, dout, N, OC, stream);
}

} // namespace engine::kernels::cuda
