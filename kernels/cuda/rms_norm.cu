// RMS normalisation over the last dimension, warp per row (CUDA twin of kernels/cpu/rms_norm.cpp). Rows move
// in 128-bit packs when C % 4 == 0 and every pointer is 16-byte aligned. Backward is one fused row pass (dinp
// plus per-block dweight partials in shared memory) and the fixed-order column pass, so dweight is bitwise
// reproducible; the launch scaffolding, shared with layernorm.cu, is kernels/cuda/norm_passes.cuh. Bounded by
// memory bandwidth (forward reads the row twice, from L1/L2 the second time). Storage T is float or bf16; rstd,
// partials and dweight are float.
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/norm_passes.cuh"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
// Backward keeps one float sum per column (dweight) per warp: 8 warps up to C = 1536.
constexpr int column_sums_kept = 1;
} // namespace

int rms_norm_backward_workspace_count(int N, int C) {
    return norm_passes::backward_workspace_count<column_sums_kept>(N, C);
}

// LlamaRMSNorm rounds the normalised value to the storage type before the weight multiplies it.
template <typename T>
static __device__ __forceinline__ float rounded_to(float value) {
    return widen(narrow<T>(value));
}

template <typename T, int width>
static __global__ void rms_norm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                                               float eps) {
    const int row = blockIdx.x * norm_passes::forward_rows_per_block + threadIdx.x / warp_size;
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
    norm_passes::zero_warp_sums<column_sums_kept, width>(dweight_sum, C, lane);
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
    norm_passes::store_chunk_partials<column_sums_kept>(partials, warp_sums, C);
}

template <typename T>
static void launch_rms_norm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                                    cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    ENGINE_LAUNCH_NORM_FORWARD(rms_norm_forward_kernel, T, norm_passes::vectorizable(C, out, inp, weight), N, stream,
                               out, rstd, inp, weight, N, C, eps);
}

template <typename T>
static void launch_rms_norm_backward(T* dinp, float* dweight, float* partials_workspace, const T* dout, const T* inp,
                                     const T* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    const norm_passes::BackwardRows rows = norm_passes::backward_rows<column_sums_kept>("rms_norm_backward", N, C);
    ENGINE_LAUNCH_NORM_BACKWARD(rms_norm_backward_kernel, T, norm_passes::vectorizable(C, dinp, dout, inp, weight),
                                rows, stream, dinp, partials_workspace, dout, inp, weight, rstd, N, C,
                                rows.rows_per_chunk);
    norm_passes::add_partials<column_sums_kept>(dweight, nullptr, partials_workspace, rows, C, stream);
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
