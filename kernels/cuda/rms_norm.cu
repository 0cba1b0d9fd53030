// RMS normalisation over the last dimension, warp per row (CUDA twin of kernels/cpu/rms_norm.cpp). Rows move
// in 128-bit packs when C % 4 == 0 and every pointer is 16-byte aligned. Backward is one fused row pass (dinp
// plus per-block dweight partials in shared memory) and the fixed-order column pass of kernels/cuda/column_sums.cuh,
// so dweight is bitwise reproducible. Bounded by memory bandwidth (forward reads the row twice, from L1/L2 the
// second time). Storage T is float or bf16; rstd, partials and dweight are float.
#include <algorithm>

#include "base/cuda/launch.h"
#include "base/error.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int forward_block_size = 256; // 8 rows per block
constexpr int forward_rows_per_block = forward_block_size / warp_size;
constexpr int max_backward_warps = 8;
constexpr int default_shared_bytes = 48 * 1024;    // the dynamic shared memory a kernel gets without opting in
constexpr int max_optin_shared_bytes = 227 * 1024; // sm_90's per-block maximum

// Backward keeps one float per column per warp for dweight in shared memory: as many warps as fit in the
// default 48 KiB (8 up to C = 1536), at least one. A function of C alone, so the partials' layout and
// summation order never depend on the pointers or the schedule.
int backward_warps(int C) {
    const int fitting = default_shared_bytes / (C * int(sizeof(float)));
    return std::clamp(fitting, 1, max_backward_warps);
}
size_t backward_shared_bytes(int C) { return size_t(backward_warps(C)) * C * sizeof(float); }
int backward_chunks(int N, int C, int& rows_per_chunk) {
    return row_chunk_count(N, backward_warps(C), target_reduction_blocks, rows_per_chunk);
}
} // namespace

int rms_norm_backward_workspace_count(int N, int C) {
    int rows_per_chunk = 0;
    return backward_chunks(N, C, rows_per_chunk) * C;
}

// LlamaRMSNorm rounds the normalised value to the storage type before the weight multiplies it.
template <typename T>
static __device__ __forceinline__ float rounded_to(float value) {
    return widen(narrow<T>(value));
}

template <typename T, int width>
static __global__ void rms_norm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                                               float eps) {
    const int row = blockIdx.x * forward_rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return; // whole warps leave together, so the shuffles below stay full-warp
    const T* x = inp + int64_t(row) * C;
    float squares = 0.0f;
    for (int i = lane * width; i < C; i += warp_size * width) {
        const Pack<width> values = load_pack<width>(x + i);
        for (int k = 0; k < width; ++k) squares += values[k] * values[k];
    }
    const float row_rstd = rsqrtf(warp_sum(squares) / C + eps);
    T* y = out + int64_t(row) * C;
    for (int i = lane * width; i < C; i += warp_size * width) {
        Pack<width> values = load_pack<width>(x + i);
        const Pack<width> scales = load_pack<width>(weight + i);
        for (int k = 0; k < width; ++k) values[k] = scales[k] * rounded_to<T>(values[k] * row_rstd);
        store_pack<width>(y + i, values);
    }
    if (lane == 0) rstd[row] = row_rstd;
}

// One block per row chunk, one warp per row: dinp += rstd * (dnorm - norm * mean(dnorm * norm)), dnorm =
// weight * dout, and, in the same read, each warp adds dout * round(norm) into its own shared column sums (a
// column belongs to one lane of the warp). Then the block adds its warps' sums in warp order into its chunk's
// partials (chunks, C).
template <typename T, int width>
static __global__ void rms_norm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                                                const T* weight, const float* rstd, int N, int C, int rows_per_chunk) {
    ENGINE_DYNAMIC_SHARED(float, warp_sums); // (warps, C)
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int warps = blockDim.x / warp_size;
    float* dweight_sum = warp_sums + int64_t(warp) * C; // (C) this warp's
    for (int i = lane * width; i < C; i += warp_size * width) store_pack<width>(dweight_sum + i, Pack<width>{});
    const int first_row = blockIdx.x * rows_per_chunk;
    const int end_row = min(N, first_row + rows_per_chunk);
    for (int row = first_row + warp; row < end_row; row += warps) { // uniform per warp: shuffles stay full-warp
        const T* x = inp + int64_t(row) * C;
        const T* dy = dout + int64_t(row) * C;
        const float row_rstd = rstd[row];
        float dnorm_norm_sum = 0.0f;
        for (int i = lane * width; i < C; i += warp_size * width) {
            const Pack<width> values = load_pack<width>(x + i), gradients = load_pack<width>(dy + i);
            const Pack<width> scales = load_pack<width>(weight + i);
            for (int k = 0; k < width; ++k) dnorm_norm_sum += scales[k] * gradients[k] * (values[k] * row_rstd);
        }
        const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
        T* dx = dinp + int64_t(row) * C;
        for (int i = lane * width; i < C; i += warp_size * width) {
            const Pack<width> values = load_pack<width>(x + i), gradients = load_pack<width>(dy + i);
            const Pack<width> scales = load_pack<width>(weight + i);
            Pack<width> input_gradients = load_pack<width>(dx + i);
            Pack<width> weight_sums = load_pack<width>(dweight_sum + i);
            for (int k = 0; k < width; ++k) {
                const float norm = values[k] * row_rstd;
                input_gradients[k] += (scales[k] * gradients[k] - norm * dnorm_norm_mean) * row_rstd;
                weight_sums[k] += gradients[k] * rounded_to<T>(norm);
            }
            store_pack<width>(dx + i, input_gradients);
            store_pack<width>(dweight_sum + i, weight_sums);
        }
    }
    __syncthreads(); // every warp's sums are complete
    float* chunk_partials = partials + int64_t(blockIdx.x) * C; // (C)
    for (int column = threadIdx.x; column < C; column += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < warps; ++w) sum += warp_sums[int64_t(w) * C + column];
        chunk_partials[column] = sum;
    }
}

template <typename T>
static void launch_rms_norm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                                    cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    const int blocks = ceil_div(N, forward_rows_per_block);
    if (C % vector_width == 0 && vector_aligned(out, inp, weight))
        ENGINE_LAUNCH((rms_norm_forward_kernel<T, vector_width>), blocks, forward_block_size, 0, stream, out, rstd, inp,
                      weight, N, C, eps);
    else
        ENGINE_LAUNCH((rms_norm_forward_kernel<T, 1>), blocks, forward_block_size, 0, stream, out, rstd, inp, weight, N,
                      C, eps);
}

template <typename T, int width>
static void launch_rms_norm_backward_rows(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                          const float* rstd, int N, int C, int chunks, int rows_per_chunk,
                                          cudaStream_t stream) {
    const size_t shared_bytes = backward_shared_bytes(C);
    if (shared_bytes > size_t(default_shared_bytes)) { // only for C > 12288: one warp's sums need the opt-in
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&rms_norm_backward_kernel<T, width>),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
    }
    ENGINE_LAUNCH((rms_norm_backward_kernel<T, width>), chunks, backward_warps(C) * warp_size, shared_bytes, stream,
                  dinp, partials, dout, inp, weight, rstd, N, C, rows_per_chunk);
}

template <typename T>
static void launch_rms_norm_backward(T* dinp, float* dweight, float* partials_workspace, const T* dout, const T* inp,
                                     const T* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    ENGINE_CHECK(backward_shared_bytes(C) <= size_t(max_optin_shared_bytes),
                 "rms_norm_backward: C = " << C << " needs " << backward_shared_bytes(C)
                                           << " bytes of shared memory per block, more than sm_90's "
                                           << max_optin_shared_bytes);
    int rows_per_chunk = 0;
    const int chunks = backward_chunks(N, C, rows_per_chunk);
    if (C % vector_width == 0 && vector_aligned(dinp, dout, inp, weight))
        launch_rms_norm_backward_rows<T, vector_width>(dinp, partials_workspace, dout, inp, weight, rstd, N, C, chunks,
                                                       rows_per_chunk, stream);
    else
        launch_rms_norm_backward_rows<T, 1>(dinp, partials_workspace, dout, inp, weight, rstd, N, C, chunks,
                                            rows_per_chunk, stream);
    add_column_partials(dweight, nullptr, partials_workspace, chunks, C, C, stream);
}

void rms_norm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                      cudaStream_t stream) {
    launch_rms_norm_forward(out, rstd, inp, weight, N, C, eps, stream);
}
void rms_norm_forward(bfloat16* out, float* rstd, const bfloat16* inp, const bfloat16* weight, int N, int C,
                      float eps, cudaStream_t stream) {
    launch_rms_norm_forward(out, rstd, inp, weight, N, C, eps, stream);
}
void rms_norm_backward(float* dinp, float* dweight, float* partials_workspace, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    launch_rms_norm_backward(dinp, dweight, partials_workspace, dout, inp, weight, rstd, N, C, stream);
}
void rms_norm_backward(bfloat16* dinp, float* dweight, float* partials_workspace, const bfloat16* dout,
                       const bfloat16* inp, const bfloat16* weight, const float* rstd, int N, int C,
                       cudaStream_t stream) {
    launch_rms_norm_backward(dinp, dweight, partials_workspace, dout, inp, weight, rstd, N, C, stream);
}

} // namespace engine::kernels::cuda
