// SGD with momentum, PyTorch semantics without dampening or Nesterov; the reference for kernels/cuda/sgd.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

namespace {

// Hyperparameters by value, so that the loop keeps them in registers and vectorises (see adamw.cpp).
template <typename T>
void sgd_elements(T* param, const T* grad, T* momentum_buffer, int64_t begin, int64_t end, const T learning_rate,
                  const T momentum_factor, const T decay, const T gradient_scale) {
    for (int64_t i = begin; i < end; ++i) {
        const T parameter = param[i];
        // Weight decay is coupled (added to the gradient), unlike AdamW, matching torch.optim.SGD.
        const T gradient = gradient_scale * grad[i] + decay * parameter;
        const T buffer = momentum_factor * momentum_buffer[i] + gradient;
        momentum_buffer[i] = buffer;
        param[i] = parameter - learning_rate * buffer;
    }
}

} // namespace

template <typename T>
void sgd_update(T* param, const T* grad, T* momentum_buffer, int64_t N, float lr, float momentum,
                float weight_decay, float grad_scale) {
    const T learning_rate = static_cast<T>(lr);
    const T momentum_factor = static_cast<T>(momentum);
    const T decay = static_cast<T>(weight_decay);
    const T gradient_scale = static_cast<T>(grad_scale);
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        sgd_elements(param, grad, momentum_buffer, begin, end, learning_rate, momentum_factor, decay, gradient_scale);
    });
}

template void sgd_update<float>(float*, const float*, float*, int64_t, float, float, float, float);
template void sgd_update<double>(double*, const double*, double*, int64_t, float, float, float, float);

} // namespace engine::kernels::cpu
