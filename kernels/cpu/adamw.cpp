// AdamW parameter update with PyTorch semantics, the reference for kernels/cuda/adamw.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace engine::kernels::cpu {

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t N, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float bias_correction1, float bias_correction2, float grad_scale) {
    // Hyperparameters arrive as float; converting once keeps the per-element arithmetic in T, which for
    // float is the same operation sequence as the CUDA twin.
    const T learning_rate = static_cast<T>(lr);
    const T b1 = static_cast<T>(beta1);
    const T b2 = static_cast<T>(beta2);
    const T epsilon = static_cast<T>(eps);
    const T decay = static_cast<T>(weight_decay);
    const T correction1 = static_cast<T>(bias_correction1);
    const T correction2 = static_cast<T>(bias_correction2);
    const T gradient_scale = static_cast<T>(grad_scale);
    for (int64_t i = 0; i < N; ++i) {
        const T gradient = grad[i] * gradient_scale;
        T parameter = param[i];
        parameter -= learning_rate * decay * parameter; // decoupled decay acts on the pre-update parameter
        const T first_moment = b1 * m[i] + (T(1) - b1) * gradient;
        const T second_moment = b2 * v[i] + (T(1) - b2) * gradient * gradient;
        m[i] = first_moment;
        v[i] = second_moment;
        parameter -= learning_rate * (first_moment / correction1) / (std::sqrt(second_moment / correction2) + epsilon);
        param[i] = parameter;
    }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float, float, float, float,
                                  float, float, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float, float, float, float,
                                   float, float, float, float);

} // namespace engine::kernels::cpu
