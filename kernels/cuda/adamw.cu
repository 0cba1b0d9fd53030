// AdamW parameter update with PyTorch semantics (CUDA twin of kernels/cpu/adamw.cpp), with 128-bit accesses
// when the pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <int width>
static __global__ void adamw_update_kernel(float* param, const float* grad, float* m, float* v, int64_t N, float lr,
                                           float beta1, float beta2, float eps, float weight_decay,
                                           float bias_correction1, float bias_correction2, float grad_scale) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> gradients = load_pack<count>(grad + index);
        Pack<count> parameters = load_pack<count>(param + index), first = load_pack<count>(m + index),
                    second = load_pack<count>(v + index);
        for (int k = 0; k < count; ++k) {
            const float gradient = gradients[k] * grad_scale;
            float parameter = parameters[k];
            parameter -= lr * weight_decay * parameter; // decoupled decay acts on the pre-update parameter
            first[k] = beta1 * first[k] + (1.0f - beta1) * gradient;
            second[k] = beta2 * second[k] + (1.0f - beta2) * gradient * gradient;
            parameter -= lr * (first[k] / bias_correction1) / (sqrtf(second[k] / bias_correction2) + eps);
            parameters[k] = parameter;
        }
        store_pack<count>(m + index, first);
        store_pack<count>(v + index, second);
        store_pack<count>(param + index, parameters);
    });
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2,
                  float grad_scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(adamw_update_kernel, vector_aligned(param, grad, m, v), N, block_size, stream, param, grad, m,
                         v, N, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, grad_scale);
}

} // namespace engine::kernels::cuda
