// The second pass shared by the parameter-gradient reductions (layernorm's dweight/dbias, bias's dbias): the
// first pass leaves one float partial per (row chunk, column); this adds each column's partials in chunk order
// and accumulates (+=) the total into the gradient. Fixed orders throughout, so the result is bitwise
// reproducible run to run, whatever the schedule.
#pragma once

#include "base/cuda/headers.h"

namespace engine::kernels::cuda {

// About four resident blocks on each of an H200's 132 SMs: enough row chunks to fill the GPU while the
// partials stay a few MiB.
inline constexpr int target_reduction_blocks = 512;

// Splits N rows into at most `max_chunks` chunks of at least `minimum_rows` rows, none empty: a function of
// its arguments alone, never of the schedule. Returns the chunk count; `rows_per_chunk` gets the chunk length.
int row_chunk_count(int N, int minimum_rows, int max_chunks, int& rows_per_chunk);

// partials (chunks, columns); column c < first_columns goes to first[c], the rest to second[c - first_columns].
void add_column_partials(float* first, float* second, const float* partials, int chunks, int first_columns,
                         int columns, cudaStream_t stream);

} // namespace engine::kernels::cuda
