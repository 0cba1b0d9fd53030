// Grid sizing for the CUDA launchers: how many blocks cover a count, and the capped grid of the grid-stride
// elementwise kernels.
#pragma once

#include <cstdint>

namespace engine::kernels::cuda {

// Grid sizes: the number of `denominator`-sized pieces that cover `numerator` items.
constexpr int ceil_div(int64_t numerator, int64_t denominator) {
    return static_cast<int>((numerator + denominator - 1) / denominator);
}

// Elementwise kernels loop grid-stride, so their grid is capped here rather than growing with N: the cap
// keeps grids valid for N beyond 2^31 and is large enough to fill every SM many times over.
// Each thread handles `width` consecutive floats per step (4 with 128-bit accesses). Computed in int64, so a
// count past 2^31 blocks caps instead of overflowing.
inline constexpr int max_elementwise_blocks = 65535;
constexpr int elementwise_grid(int64_t count, int block_size, int width = 1) {
    const int64_t per_block = int64_t(block_size) * width;
    const int64_t blocks = (count + per_block - 1) / per_block;
    return blocks < 1 ? 1 : (blocks > max_elementwise_blocks ? max_elementwise_blocks : static_cast<int>(blocks));
}

} // namespace engine::kernels::cuda
