// What layernorm.cu and rms_norm.cu share: the launch scaffolding and the layout of the backward's column sums.
// Both run a warp per row, so a row's sums are warp shuffles with no block barrier (the forward puts 8 rows in a
// 256-thread block). Backward is two passes so that the parameter gradients need no float atomics: one fused
// row pass writes dinp and, from the same read of dout and inp, leaves float partials of `sums` column sums per
// row chunk (layernorm 2: dweight then dbias; rms_norm 1: dweight), then column_sums.cuh adds each column's
// partials in chunk order. Every size here (warps, chunks, shared bytes) is a function of N and C alone, so the
// partials' layout and summation order, and with them the bits, never depend on the pointers or the schedule.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "base/cuda/check.h"
#include "base/cuda/launch.h"
#include "base/error.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda::norm_passes {

inline constexpr int forward_block_size = 256; // 8 rows per block
inline constexpr int forward_rows_per_block = forward_block_size / warp_size;
inline constexpr int max_backward_warps = 8;
inline constexpr int default_shared_bytes = 48 * 1024;    // the dynamic shared memory a kernel gets without opting in
inline constexpr int max_optin_shared_bytes = 227 * 1024; // sm_90's per-block maximum

// Backward keeps, per warp, `sums` floats per column in shared memory: as many warps as fit in the default
// 48 KiB (8 up to C = 768 with 2 sums, C = 1536 with 1), at least one.
template <int sums>
int backward_warps(int C) {
    const int fitting = default_shared_bytes / (sums * C * int(sizeof(float)));
    return std::clamp(fitting, 1, max_backward_warps);
}
template <int sums>
size_t backward_shared_bytes(int C) {
    return size_t(backward_warps<sums>(C)) * sums * C * sizeof(float);
}
template <int sums>
int backward_chunks(int N, int C, int& rows_per_chunk) {
    return row_chunk_count(N, backward_warps<sums>(C), target_reduction_blocks, rows_per_chunk);
}
// Floats of the partials (chunks, sums, C).
template <int sums>
int backward_workspace_count(int N, int C) {
    int rows_per_chunk = 0;
    return backward_chunks<sums>(N, C, rows_per_chunk) * sums * C;
}

// Rows move in 128-bit packs when C % 4 == 0 and every pointer is 16-byte aligned, else as scalars.
template <typename... Pointers>
bool vectorizable(int C, Pointers... pointers) {
    return C % vector_width == 0 && vector_aligned(pointers...);
}

// The backward row pass: one block of backward_warps(C) warps per row chunk.
struct BackwardRows {
    int chunks = 0;
    int rows_per_chunk = 0;
    int threads = 0;
    size_t shared_bytes = 0; // (warps, sums, C) floats
};
template <int sums>
BackwardRows backward_rows(const char* op, int N, int C) {
    ENGINE_CHECK(backward_shared_bytes<sums>(C) <= size_t(max_optin_shared_bytes),
                 op << ": C = " << C << " needs " << backward_shared_bytes<sums>(C)
                    << " bytes of shared memory per block, more than sm_90's " << max_optin_shared_bytes);
    BackwardRows rows;
    rows.chunks = backward_chunks<sums>(N, C, rows.rows_per_chunk);
    rows.threads = backward_warps<sums>(C) * warp_size;
    rows.shared_bytes = backward_shared_bytes<sums>(C);
    return rows;
}

// Inside the row kernel: zeroes this warp's `sums` column sums (sums, C), each lane the columns it adds to later.
template <int sums, int width>
__device__ inline void zero_warp_sums(float* warp_sum, int C, int lane) {
    for (int i = lane * width; i < C; i += warp_size * width) {
        for (int s = 0; s < sums; ++s) store_pack<width>(warp_sum + s * C + i, Pack<width>{});
    }
}

// Inside the row kernel, after its rows: adds the warps' sums (warps, sums, C) in warp order into this block's
// chunk of the partials (chunks, sums, C).
template <int sums>
__device__ inline void store_chunk_partials(float* partials, const float* warp_sums, int C) {
    __syncthreads(); // every warp's sums are complete
    const int warps = blockDim.x / warp_size;
    float* chunk_partials = partials + int64_t(blockIdx.x) * sums * C; // (sums, C)
    for (int column = threadIdx.x; column < sums * C; column += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < warps; ++w) sum += warp_sums[int64_t(w) * sums * C + column];
        chunk_partials[column] = sum;
    }
}

// The second pass: (chunks, sums, C) partials into first (C) and, with 2 sums, second (C).
template <int sums>
void add_partials(float* first, float* second, const float* partials, const BackwardRows& rows, int C,
                  cudaStream_t stream) {
    add_column_partials(first, second, partials, rows.chunks, C, sums * C, stream);
}

} // namespace engine::kernels::cuda::norm_passes

// Launches kernel<T, vector_width> when `vectorized`, else kernel<T, 1>: macros, as ENGINE_LAUNCH itself, so that a
// failed launch names the kernel and the calling file and line.
// The forward over N rows, a warp per row.
#define ENGINE_LAUNCH_NORM_FORWARD(kernel, T, vectorized, N, stream, ...)                                   \
    do {                                                                                                     \
        using ::engine::kernels::cuda::vector_width;                                                         \
        namespace norm = ::engine::kernels::cuda::norm_passes;                                               \
        const int norm_blocks = ::engine::kernels::cuda::ceil_div((N), norm::forward_rows_per_block);        \
        if (vectorized)                                                                                      \
            ENGINE_LAUNCH((kernel<T, vector_width>), norm_blocks, norm::forward_block_size, 0, stream,       \
                          __VA_ARGS__);                                                                      \
        else ENGINE_LAUNCH((kernel<T, 1>), norm_blocks, norm::forward_block_size, 0, stream, __VA_ARGS__);   \
    } while (0)
// The backward row pass over `rows` (a norm_passes::BackwardRows). Past 48 KiB of shared memory (C > 6144 with 2
// sums, C > 12288 with 1: one warp's sums alone) the kernel opts in first.
#define ENGINE_LAUNCH_NORM_BACKWARD(kernel, T, vectorized, rows, stream, ...)                               \
    do {                                                                                                     \
        using ::engine::kernels::cuda::vector_width;                                                         \
        if (vectorized) ENGINE_LAUNCH_NORM_BACKWARD_AT(kernel, T, vector_width, rows, stream, __VA_ARGS__);  \
        else ENGINE_LAUNCH_NORM_BACKWARD_AT(kernel, T, 1, rows, stream, __VA_ARGS__);                        \
    } while (0)
#define ENGINE_LAUNCH_NORM_BACKWARD_AT(kernel, T, width, rows, stream, ...)                                 \
    do {                                                                                                     \
        if ((rows).shared_bytes > size_t(::engine::kernels::cuda::norm_passes::default_shared_bytes))        \
            CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&kernel<T, width>),                \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,                     \
                                            static_cast<int>((rows).shared_bytes)));                         \
        ENGINE_LAUNCH((kernel<T, width>), (rows).chunks, (rows).threads, (rows).shared_bytes, stream,        \
                      __VA_ARGS__);                                                                          \
    } while (0)
