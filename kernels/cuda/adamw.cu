// AdamW parameter update with PyTorch semantics (CUDA twin of kernels/cpu/adamw.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void adamw_update_kernel(float* param, const float* grad, float* m, float* v, int64_t N, float lr,
                                           float beta1, float beta2, float eps, float weight_decay,
                                           float bias_correction1, float bias_correction2, float grad_scale) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float gradient = grad[i] * grad_scale;
        float parameter = param[i];
        parameter -= lr * weight_decay * parameter; // decoupled decay acts on the pre-update parameter
        const float first_moment = beta1 * m[i] + (1.0f - beta1) * gradient;
        const float second_moment = beta2 * v[i] + (1.0f - beta2) * gradient * gradient;
        m[i] = first_moment;
        v[i] = second_moment;
        parameter -= lr * (first_moment / bias_correction1) / (sqrtf(second_moment / bias_correction2) + eps);
        param[i] = parameter;
    }
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2,
                  float grad_scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(adamw_update_kernel, elementwise_grid(N, block_size), block_size, 0, stream, param, grad, m, v, N, lr,
                  beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, grad_scale);
}

} // namespace engine::kernels::cuda
