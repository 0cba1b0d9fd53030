// The association of the gradient norm's sum of squares, which kernels/cpu/reduce.cpp and its CUDA twin
// kernels/cuda/reduce.cu both follow, so that the norm has the same bits on the host and on the device
// (and with the model state on the host, in either tier: docs/MEMORY.md). Per tensor: chunks of
// sum_of_squares_chunk elements; in a chunk, lane l (of sum_of_squares_lanes) adds the squares (in f64) of
// elements l, l+8, l+16, ... in order from 0.0, and the chunk's sum is 0.0 + lane 0 + ... + lane 7; the
// tensor's sum is 0.0 + its chunks in order; a list's is 0.0 + its tensors in order. Squares of f32 values
// are exact in f64, so only the additions round, at these points on both sides.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ENGINE_SUM_ORDER_FUNCTION __host__ __device__ inline
#else
#define ENGINE_SUM_ORDER_FUNCTION inline
#endif

namespace engine::kernels {

inline constexpr int64_t sum_of_squares_chunk = int64_t(1) << 16;
inline constexpr int sum_of_squares_lanes = 8;

// The chunks of a tensor of `count` elements (an empty tensor has none).
ENGINE_SUM_ORDER_FUNCTION int64_t sum_of_squares_chunks(int64_t count) {
    return (count + sum_of_squares_chunk - 1) / sum_of_squares_chunk;
}

} // namespace engine::kernels
