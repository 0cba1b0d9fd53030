// AdamW parameter update with PyTorch semantics, the reference for kernels/cuda/adamw.cu: one tensor, or a list
// of them with the step's epilogue (the bf16 working copy written and the gradient zeroed) in the same pass.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace engine::kernels::cpu {

namespace {

// The hyperparameters in T, passed by value so that the loop below holds them in registers: captured by
// reference in a lambda they would be reloaded after every store (a store to T may alias a T), and the loop
// would not vectorise.
template <typename T>
struct AdamwConstants {
    T learning_rate, b1, b2, epsilon, decay, correction1, correction2, gradient_scale;
};

template <typename T>
void adamw_elements(T* param, const T* grad, T* m, T* v, int64_t begin, int64_t end, const AdamwConstants<T> k) {
    for (int64_t i = begin; i < end; ++i) {
        const T gradient = grad[i] * k.gradient_scale;
        T parameter = param[i];
        parameter -= k.learning_rate * k.decay * parameter; // decoupled decay acts on the pre-update parameter
        const T first_moment = k.b1 * m[i] + (T(1) - k.b1) * gradient;
        const T second_moment = k.b2 * v[i] + (T(1) - k.b2) * gradient * gradient;
        m[i] = first_moment;
        v[i] = second_moment;
        parameter -= k.learning_rate * (first_moment / k.correction1) /
                     (std::sqrt(second_moment / k.correction2) + k.epsilon);
        param[i] = parameter;
    }
}

} // namespace

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t N, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float bias_correction1, float bias_correction2, float grad_scale) {
    // Hyperparameters arrive as float; converting once keeps the per-element arithmetic in T, which for
    // float is the same operation sequence as the CUDA twin.
    const AdamwConstants<T> constants{static_cast<T>(lr),           static_cast<T>(beta1),
                                      static_cast<T>(beta2),        static_cast<T>(eps),
                                      static_cast<T>(weight_decay), static_cast<T>(bias_correction1),
                                      static_cast<T>(bias_correction2), static_cast<T>(grad_scale)};
    // Each element's update is its own; chunks of elements on threads. Vectorised (sqrtps, divps; the kernels
    // build with -fno-math-errno) an element takes about 1 ns, so a chunk is four costly ones.
    parallel_for(N, costly_elements_per_chunk * 4, [&](int64_t begin, int64_t end) {
        adamw_elements(param, grad, m, v, begin, end, constants);
    });
}

template <typename Scalar>
void adamw_update_list(const AdamWTensor<Scalar>* tensors, int tensor_count, bool zero_gradients, float lr, float beta1,
                       float beta2, float eps, float bias_correction1, float bias_correction2, float grad_scale) {
    for (int index = 0; index < tensor_count; ++index) {
        const AdamWTensor<Scalar>& tensor = tensors[index];
        const AdamwConstants<Scalar> constants{static_cast<Scalar>(lr),
                                               static_cast<Scalar>(beta1),
                                               static_cast<Scalar>(beta2),
                                               static_cast<Scalar>(eps),
                                               static_cast<Scalar>(tensor.weight_decay),
                                               static_cast<Scalar>(bias_correction1),
                                               static_cast<Scalar>(bias_correction2),
                                               static_cast<Scalar>(grad_scale)};
        // The epilogue's loops run on the chunk the update has just left in cache; apart from it, so that the
        // update's loop vectorises as adamw_update's does.
        parallel_for(tensor.count, costly_elements_per_chunk * 4, [&](int64_t begin, int64_t end) {
            adamw_elements(tensor.parameter, tensor.gradient, tensor.exp_avg, tensor.exp_avg_sq, begin, end, constants);
            if (tensor.working_copy != nullptr)
                for (int64_t i = begin; i < end; ++i)
                    tensor.working_copy[i] = to_bfloat16(static_cast<float>(tensor.parameter[i]));
            if (zero_gradients)
                for (int64_t i = begin; i < end; ++i) tensor.gradient[i] = Scalar(0);
        });
    }
}

template void adamw_update_list<float>(const AdamWTensor<float>*, int, bool, float, float, float, float, float, float,
                                       float);
template void adamw_update_list<double>(const AdamWTensor<double>*, int, bool, float, float, float, float, float, float,
                                        float);
template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float, float, float, float,
                                  float, float, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float, float, float, float,
                                   float, float, float, float);

} // namespace engine::kernels::cpu
