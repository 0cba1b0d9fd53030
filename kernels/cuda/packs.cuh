// 128-bit loads and stores (four floats at once) with a scalar fallback, for the memory-bound kernels. A
// kernel is written once for a pack width of 1 or 4; the launcher picks 4 only where every pointer allows it.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"
#include "base/cuda/launch.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {

inline constexpr int vector_width = 4; // floats per 128-bit access
inline constexpr int vector_bytes = 16;

// `width` consecutive floats held in registers.
template <int width>
struct Pack {
    float value[width];
    __device__ __forceinline__ float& operator[](int index) { return value[index]; }
    __device__ __forceinline__ float operator[](int index) const { return value[index]; }
};

template <int width>
__device__ __forceinline__ Pack<width> load_pack(const float* source) {
    Pack<width> pack;
    if constexpr (width == vector_width) {
        const float4 vector = *reinterpret_cast<const float4*>(source);
        pack[0] = vector.x, pack[1] = vector.y, pack[2] = vector.z, pack[3] = vector.w;
    } else {
        static_assert(width == 1, "packs are 1 or 4 floats");
        pack[0] = *source;
    }
    return pack;
}

template <int width>
__device__ __forceinline__ void store_pack(float* destination, const Pack<width>& pack) {
    if constexpr (width == vector_width) {
        *reinterpret_cast<float4*>(destination) = make_float4(pack[0], pack[1], pack[2], pack[3]);
    } else {
        static_assert(width == 1, "packs are 1 or 4 floats");
        *destination = pack[0];
    }
}

// bf16 packs: 4 values in one 64-bit access, widened to float on load and rounded (to nearest even) on store,
// so a kernel written over Pack<width> serves both storage types.
template <int width>
__device__ __forceinline__ Pack<width> load_pack(const bfloat16* source) {
    Pack<width> pack;
    if constexpr (width == vector_width) {
        const uint2 vector = *reinterpret_cast<const uint2*>(source);
        pack[0] = float_from_bits(vector.x << 16), pack[1] = float_from_bits(vector.x & 0xffff0000u);
        pack[2] = float_from_bits(vector.y << 16), pack[3] = float_from_bits(vector.y & 0xffff0000u);
    } else {
        static_assert(width == 1, "packs are 1 or 4 values");
        pack[0] = to_float(*source);
    }
    return pack;
}

template <int width>
__device__ __forceinline__ void store_pack(bfloat16* destination, const Pack<width>& pack) {
    if constexpr (width == vector_width) {
        uint2 vector;
        vector.x = uint32_t(to_bfloat16(pack[0]).bits) | (uint32_t(to_bfloat16(pack[1]).bits) << 16);
        vector.y = uint32_t(to_bfloat16(pack[2]).bits) | (uint32_t(to_bfloat16(pack[3]).bits) << 16);
        *reinterpret_cast<uint2*>(destination) = vector;
    } else {
        static_assert(width == 1, "packs are 1 or 4 values");
        *destination = to_bfloat16(pack[0]);
    }
}

// Grid-stride over N floats in packs of `width`: `function.template operator()<count>(index)` handles the
// `count` floats from `index`. The N % width floats left over go one each to the grid's first threads, so
// every element sees the same per-element arithmetic whichever width the launcher chose.
template <int width, typename Function>
__device__ __forceinline__ void for_each_pack(int64_t N, Function function) {
    const int64_t packs = N / width;
    const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t pack = first; pack < packs; pack += stride) function.template operator()<width>(pack * width);
    if constexpr (width > 1) {
        if (first < N - packs * width) function.template operator()<1>(packs * width + first);
    }
}

// A warp tile of 32 x 4 floats, each lane holding 4: which of the tile's floats is lane `lane`'s k-th. With packs
// those are 4 adjacent floats; with scalars lane + 32k, so each of the warp's scalar loads is still one
// contiguous 128-byte line.
template <int width>
__device__ __forceinline__ int lane_tile_offset(int lane, int k) {
    return width == vector_width ? lane * vector_width + k : lane + 32 * k;
}

// True when every non-null pointer can take 128-bit accesses. The engine's allocations are 16-byte aligned
// (256 on a GPU), but an argument may point into the middle of one.
template <typename... Pointers>
inline bool vector_aligned(Pointers... pointers) {
    return ((reinterpret_cast<uintptr_t>(pointers) % vector_bytes == 0) && ...);
}

} // namespace engine::kernels::cuda

// Launches the grid-stride `kernel<vector_width>` when `vectorized` (the launcher checked vector_aligned), else
// `kernel<1>`, with the capped elementwise grid over N floats. A macro because ENGINE_LAUNCH names the kernel.
#define ENGINE_LAUNCH_PACKED(kernel, vectorized, N, block_size, stream, ...)                                   \
    do {                                                                                                     \
        using ::engine::kernels::cuda::elementwise_grid;                                                     \
        using ::engine::kernels::cuda::vector_width;                                                         \
        if (vectorized)                                                                                      \
            ENGINE_LAUNCH(kernel<vector_width>, elementwise_grid(N, block_size, vector_width), block_size, 0, \
                          stream, __VA_ARGS__);                                                              \
        else ENGINE_LAUNCH(kernel<1>, elementwise_grid(N, block_size), block_size, 0, stream, __VA_ARGS__);  \
    } while (0)

// ENGINE_LAUNCH_PACKED for a kernel templated on its storage type first: `kernel<T, width>`.
#define ENGINE_LAUNCH_PACKED_TYPED(kernel, T, vectorized, N, block_size, stream, ...)                          \
    do {                                                                                                     \
        using ::engine::kernels::cuda::elementwise_grid;                                                     \
        using ::engine::kernels::cuda::vector_width;                                                         \
        if (vectorized)                                                                                      \
            ENGINE_LAUNCH((kernel<T, vector_width>), elementwise_grid(N, block_size, vector_width), block_size, \
                          0, stream, __VA_ARGS__);                                                           \
        else ENGINE_LAUNCH((kernel<T, 1>), elementwise_grid(N, block_size), block_size, 0, stream, __VA_ARGS__); \
    } while (0)
