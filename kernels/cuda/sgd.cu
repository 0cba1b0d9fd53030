// SGD with momentum, PyTorch semantics without dampening or Nesterov (CUDA twin of kernels/cpu/sgd.cpp), with
// 128-bit accesses when the pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <int width>
static __global__ void sgd_update_kernel(float* param, const float* grad, float* momentum_buffer, int64_t N,
                                         float lr, float momentum, float weight_decay, float grad_scale) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> gradients = load_pack<count>(grad + index);
        Pack<count> parameters = load_pack<count>(param + index), buffers = load_pack<count>(momentum_buffer + index);
        for (int k = 0; k < count; ++k) {
            const float parameter = parameters[k];
            const float gradient = grad_scale * gradients[k] + weight_decay * parameter;
            buffers[k] = momentum * buffers[k] + gradient;
            parameters[k] = parameter - lr * buffers[k];
        }
        store_pack<count>(momentum_buffer + index, buffers);
        store_pack<count>(param + index, parameters);
    });
}

void sgd_update(float* param, const float* grad, float* momentum_buffer, int64_t N, float lr, float momentum,
                float weight_decay, float grad_scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(sgd_update_kernel, vector_aligned(param, grad, momentum_buffer), N, block_size, stream, param,
                         grad, momentum_buffer, N, lr, momentum, weight_decay, grad_scale);
}

} // namespace engine::kernels::cuda
