// Warp- and block-level sums and maxima shared by the reduction kernels. Each returns the result to every
// participating thread, so callers need no extra broadcast.
#pragma once

#include "base/cuda/headers.h"

namespace engine::kernels::cuda {

inline constexpr int warp_size = 32;
inline constexpr unsigned full_warp_mask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) {
        value += __shfl_xor_sync(full_warp_mask, value, offset);
    }
    return value;
}

template <typename T>
__device__ __forceinline__ T warp_max(T value) {
    for (int offset = warp_size / 2; offset > 0; offset /= 2) {
        value = fmax(value, __shfl_xor_sync(full_warp_mask, value, offset));
    }
    return value;
}

// Requires blockDim.x to be a multiple of 32 (at most 1024) and every thread of the block to call it.
// `scratch` holds 32 values; it is safe to call twice in a row because of the leading barrier.
template <typename T, bool is_max>
__device__ T block_reduce(T value, T* scratch) {
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int warp_count = blockDim.x / warp_size;
    value = is_max ? warp_max(value) : warp_sum(value);
    __syncthreads(); // a previous call may still be reading scratch
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    T combined = lane < warp_count ? scratch[lane] : (is_max ? scratch[0] : T(0));
    combined = is_max ? warp_max(combined) : warp_sum(combined);
    return combined;
}

template <typename T>
__device__ T block_sum(T value, T* scratch) { return block_reduce<T, false>(value, scratch); }
template <typename T>
__device__ T block_max(T value, T* scratch) { return block_reduce<T, true>(value, scratch); }

} // namespace engine::kernels::cuda
