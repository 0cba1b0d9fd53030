// GELU, tanh approximation as in GPT-2 (CUDA twin of kernels/cpu/gelu.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr float sqrt_2_over_pi = 0.7978845608028654f;
constexpr float cubic_coefficient = 0.044715f;
} // namespace

static __global__ void gelu_forward_kernel(float* out, const float* inp, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + cubic_coefficient * x * x * x)));
    }
}

static __global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* inp, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float x = inp[i];
        const float tanh_argument = sqrt_2_over_pi * (x + cubic_coefficient * x * x * x);
        const float tanh_value = tanhf(tanh_argument);
        const float sech_squared = 1.0f - tanh_value * tanh_value;
        const float local_gradient = 0.5f * (1.0f + tanh_value) +
                                     0.5f * x * sech_squared * sqrt_2_over_pi *
                                         (1.0f + 3.0f * cubic_coefficient * x * x);
        dinp[i] += local_gradient * dout[i];
    }
}

void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(gelu_forward_kernel, elementwise_grid(N, block_size), block_size, 0, stream, out, inp, N);
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(gelu_backward_kernel, elementwise_grid(N, block_size), block_size, 0, stream, dinp, dout, inp, N);
}

} // namespace engine::kernels::cuda
