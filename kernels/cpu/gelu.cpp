// GELU with the GPT-2 tanh approximation, the reference for kernels/cuda/gelu.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace engine::kernels::cpu {

namespace {
constexpr double sqrt_2_over_pi = 0.7978845608028654; // sqrt(2 / pi)
constexpr double cubic_coefficient = 0.044715;
} // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t N) {
    const T s = static_cast<T>(sqrt_2_over_pi);
    const T a = static_cast<T>(cubic_coefficient);
    for (int64_t i = 0; i < N; ++i) {
        const T x = inp[i];
        out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + a * x * x * x)));
    }
}

template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, int64_t N) {
    const T s = static_cast<T>(sqrt_2_over_pi);
    const T a = static_cast<T>(cubic_coefficient);
    for (int64_t i = 0; i < N; ++i) {
        const T x = inp[i];
        const T tanh_value = std::tanh(s * (x + a * x * x * x));
        // d tanh(u)/du = 1 - tanh(u)^2, and du/dx = s * (1 + 3 a x^2).
        const T sech_squared = T(1) - tanh_value * tanh_value;
        const T local_gradient =
            T(0.5) * (T(1) + tanh_value) + T(0.5) * x * sech_squared * s * (T(1) + T(3) * a * x * x);
        dinp[i] += local_gradient * dout[i];
    }
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

} // namespace engine::kernels::cpu
