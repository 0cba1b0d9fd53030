// SGD with momentum, PyTorch semantics without dampening or Nesterov (CUDA twin of kernels/cpu/sgd.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void sgd_update_kernel(float* param, const float* grad, float* momentum_buffer, int64_t N,
                                         float lr, float momentum, float weight_decay, float grad_scale) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float parameter = param[i];
        const float gradient = grad_scale * grad[i] + weight_decay * parameter;
        const float buffer = momentum * momentum_buffer[i] + gradient;
        momentum_buffer[i] = buffer;
        param[i] = parameter - lr * buffer;
    }
}

void sgd_update(float* param, const float* grad, float* momentum_buffer, int64_t N, float lr, float momentum,
                float weight_decay, float grad_scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(sgd_update_kernel, elementwise_grid(N, block_size), block_size, 0, stream, param, grad,
                  momentum_buffer, N, lr, momentum, weight_decay, grad_scale);
}

} // namespace engine::kernels::cuda
