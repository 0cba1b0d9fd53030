// Layernorm over the last dimension, warp per row (CUDA twin of kernels/cpu/layernorm.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256; // 8 rows per block
constexpr int rows_per_block = block_size / warp_size;
constexpr float epsilon = 1e-5f; // cpu::layernorm_eps; that header is not included to keep the twins independent
} // namespace

// Two passes over the row (mean, then centred variance) rather than E[x^2]-E[x]^2, which cancels badly.
static __global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                                const float* weight, const float* bias, int N, int C) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return; // whole warps leave together, so the shuffles below stay full-warp
    const float* x = inp + int64_t(row) * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += warp_size) sum += x[i];
    const float row_mean = warp_sum(sum) / C;
    float squares = 0.0f;
    for (int i = lane; i < C; i += warp_size) {
        const float centred = x[i] - row_mean;
        squares += centred * centred;
    }
    const float row_rstd = rsqrtf(warp_sum(squares) / C + epsilon);
    float* y = out + int64_t(row) * C;
    for (int i = lane; i < C; i += warp_size) y[i] = (x[i] - row_mean) * row_rstd * weight[i] + bias[i];
    if (lane == 0) {
        mean[row] = row_mean;
        rstd[row] = row_rstd;
    }
}

// dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout.
static __global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                       const float* weight, const float* mean, const float* rstd,
                                                       int N, int C) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return;
    const float* x = inp + int64_t(row) * C;
    const float* dy = dout + int64_t(row) * C;
    const float row_mean = mean[row], row_rstd = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int i = lane; i < C; i += warp_size) {
        const float norm = (x[i] - row_mean) * row_rstd;
        const float dnorm = weight[i] * dy[i];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
    }
    const float dnorm_mean = warp_sum(dnorm_sum) / C;
    const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    float* dx = dinp + int64_t(row) * C;
    for (int i = lane; i < C; i += warp_size) {
        const float norm = (x[i] - row_mean) * row_rstd;
        const float dnorm = weight[i] * dy[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd;
    }
}

// Parameter gradients: one thread per column walking the rows in order, so the sums are deterministic and
// need no atomics; adjacent threads read adjacent columns.
static __global__ void layernorm_backward_parameters_kernel(float* dweight, float* dbias, const float* dout,
                                                            const float* inp, const float* mean, const float* rstd,
                                                            int N, int C) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= C) return;
    // Starting from the existing values and adding row by row follows the CPU loop's order exactly.
    float weight_sum = dweight[column], bias_sum = dbias[column];
    for (int row = 0; row < N; ++row) {
        const int64_t index = int64_t(row) * C + column;
        const float norm = (inp[index] - mean[row]) * rstd[row];
        weight_sum += norm * dout[index];
        bias_sum += dout[index];
    }
    dweight[column] = weight_sum;
    dbias[column] = bias_sum;
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    ENGINE_LAUNCH(layernorm_forward_kernel, ceil_div(N, rows_per_block), block_size, 0, stream, out, mean, rstd, inp,
                  weight, bias, N, C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    ENGINE_LAUNCH(layernorm_backward_input_kernel, ceil_div(N, rows_per_block), block_size, 0, stream, dinp, dout, inp,
                  weight, mean, rstd, N, C);
    ENGINE_LAUNCH(layernorm_backward_parameters_kernel, ceil_div(C, block_size), block_size, 0, stream, dweight, dbias,
                  dout, inp, mean, rstd, N, C);
}

} // namespace engine::kernels::cuda
