// Layernorm over the last dimension, warp per row (CUDA twin of kernels/cpu/layernorm.cpp). Rows move in
// 128-bit packs when C % 4 == 0 and every pointer is 16-byte aligned. Backward is one fused row pass (dinp
// plus per-block dweight/dbias partials) and a fixed-order column pass; the launch scaffolding, shared with
// rms_norm.cu, is kernels/cuda/norm_passes.cuh. Storage T is float or bf16 (out, inp, weight, bias, dinp, dout);
// statistics, partials and dweight/dbias are float.
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/norm_passes.cuh"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr float epsilon = 1e-5f; // cpu::layernorm_eps; that header is not included to keep the twins independent
// Backward keeps two float sums per column (dweight, then dbias) per warp: 8 warps up to C = 768.
constexpr int column_sums_kept = 2;
} // namespace

int layernorm_backward_workspace_count(int N, int C) {
    return norm_passes::backward_workspace_count<column_sums_kept>(N, C);
}

// Two passes over the row (mean, then centred variance) rather than E[x^2]-E[x]^2, which cancels badly.
template <typename T, int width>
static __global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                                const T* bias, int N, int C) {
    const int row = blockIdx.x * norm_passes::forward_rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return; // whole warps leave together, so the shuffles below stay full-warp
    const T* x = inp + int64_t(row) * C;
    float sum = 0.0f;
    for (int i = lane * width; i < C; i += warp_size * width) {
        const Pack<width> values = load_pack<width>(x + i);
        for (int k = 0; k < width; ++k) sum += values[k];
    }
    const float row_mean = warp_sum(sum) / C;
    float squares = 0.0f;
    for (int i = lane * width; i < C; i += warp_size * width) {
        const Pack<width> values = load_pack<width>(x + i);
        for (int k = 0; k < width; ++k) {
            const float centred = values[k] - row_mean;
            squares += centred * centred;
        }
    }
    const float row_rstd = rsqrtf(warp_sum(squares) / C + epsilon);
    T* y = out + int64_t(row) * C;
    for (int i = lane * width; i < C; i += warp_size * width) {
        Pack<width> values = load_pack<width>(x + i);
        const Pack<width> scales = load_pack<width>(weight + i), shifts = load_pack<width>(bias + i);
        for (int k = 0; k < width; ++k) values[k] = (values[k] - row_mean) * row_rstd * scales[k] + shifts[k];
        store_pack<width>(y + i, values);
    }
    if (lane == 0) {
        mean[row] = row_mean;
        rstd[row] = row_rstd;
    }
}

// One block per row chunk, one warp per row (rows warp, warp + warps, ... of the chunk):
//   dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout,
// and, fused into the same read of dout and inp, each warp adds norm * dout and dout into its own shared
// column sums. Within a warp a column belongs to one lane, so no two threads add to one sum. Then the block
// adds its warps' sums in warp order into its chunk's partials (chunks, 2, C): dweight's C, then dbias's C.
template <typename T, int width>
static __global__ void layernorm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                                                 const T* weight, const float* mean, const float* rstd, int N, int C,
                                                 int rows_per_chunk) {
    ENGINE_DYNAMIC_SHARED(float, warp_sums); // (warps, 2, C)
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int warps = blockDim.x / warp_size;
    float* dweight_sum = warp_sums + int64_t(warp) * 2 * C; // (C) this warp's
    float* dbias_sum = dweight_sum + C;                     // (C) this warp's
    norm_passes::zero_warp_sums<column_sums_kept, width>(dweight_sum, C, lane);
    const int first_row = blockIdx.x * rows_per_chunk;
    const int end_row = min(N, first_row + rows_per_chunk);
    for (int row = first_row + warp; row < end_row; row += warps) { // uniform per warp: shuffles stay full-warp
        const T* x = inp + int64_t(row) * C;
        const T* dy = dout + int64_t(row) * C;
        const float row_mean = mean[row], row_rstd = rstd[row];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        for (int i = lane * width; i < C; i += warp_size * width) {
            const Pack<width> values = load_pack<width>(x + i), gradients = load_pack<width>(dy + i);
            const Pack<width> scales = load_pack<width>(weight + i);
            for (int k = 0; k < width; ++k) {
                const float norm = (values[k] - row_mean) * row_rstd;
                const float dnorm = scales[k] * gradients[k];
                dnorm_sum += dnorm;
                dnorm_norm_sum += dnorm * norm;
            }
        }
        const float dnorm_mean = warp_sum(dnorm_sum) / C;
        const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
        T* dx = dinp + int64_t(row) * C;
        for (int i = lane * width; i < C; i += warp_size * width) {
            const Pack<width> values = load_pack<width>(x + i), gradients = load_pack<width>(dy + i);
            const Pack<width> scales = load_pack<width>(weight + i);
            Pack<width> input_gradients = load_pack<width>(dx + i);
            Pack<width> weight_sums = load_pack<width>(dweight_sum + i), bias_sums = load_pack<width>(dbias_sum + i);
            for (int k = 0; k < width; ++k) {
                const float norm = (values[k] - row_mean) * row_rstd;
                const float dnorm = scales[k] * gradients[k];
                input_gradients[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd;
                weight_sums[k] += norm * gradients[k];
                bias_sums[k] += gradients[k];
            }
            store_pack<width>(dx + i, input_gradients);
            store_pack<width>(dweight_sum + i, weight_sums);
            store_pack<width>(dbias_sum + i, bias_sums);
        }
    }
    norm_passes::store_chunk_partials<column_sums_kept>(partials, warp_sums, C);
}

template <typename T>
static void launch_layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                     int N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    ENGINE_LAUNCH_NORM_FORWARD(layernorm_forward_kernel, T, norm_passes::vectorizable(C, out, inp, weight, bias), N,
                               stream, out, mean, rstd, inp, weight, bias, N, C);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream) {
    launch_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream);
}
void layernorm_forward(bfloat16* out, float* mean, float* rstd, const bfloat16* inp, const bfloat16* weight,
                       const bfloat16* bias, int N, int C, cudaStream_t stream) {
    launch_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream);
}

template <typename T>
static void launch_layernorm_backward_passes(T* dinp, float* dweight, float* dbias, float* partials_workspace,
                                             const T* dout, const T* inp, const T* weight, const float* mean,
                                             const float* rstd, int N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    const norm_passes::BackwardRows rows = norm_passes::backward_rows<column_sums_kept>("layernorm_backward", N, C);
    ENGINE_LAUNCH_NORM_BACKWARD(layernorm_backward_kernel, T, norm_passes::vectorizable(C, dinp, dout, inp, weight),
                                rows, stream, dinp, partials_workspace, dout, inp, weight, mean, rstd, N, C,
                                rows.rows_per_chunk);
    norm_passes::add_partials<column_sums_kept>(dweight, dbias, partials_workspace, rows, C, stream);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, float* partials_workspace, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream) {
    launch_layernorm_backward_passes(dinp, dweight, dbias, partials_workspace, dout, inp, weight, mean, rstd, N, C,
                                     stream);
}
void layernorm_backward(bfloat16* dinp, float* dweight, float* dbias, float* partials_workspace,
                        const bfloat16* dout, const bfloat16* inp, const bfloat16* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream) {
    launch_layernorm_backward_passes(dinp, dweight, dbias, partials_workspace, dout, inp, weight, mean, rstd, N, C,
                                     stream);
}

} // namespace engine::kernels::cuda
