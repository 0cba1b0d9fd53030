// GELU with the GPT-2 tanh approximation, the reference for kernels/cuda/gelu.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace engine::kernels::cpu {

namespace {
constexpr double sqrt_2_over_pi = 0.7978845608028654; // sqrt(2 / pi)
constexpr double cubic_coefficient = 0.044715;
} // namespace

// Storage type S, arithmetic in T = Compute<S> (float for bf16), one rounding on each store.
template <typename S>
void gelu_forward(S* out, const S* inp, int64_t N) {
    using T = Compute<S>;
    const T s = static_cast<T>(sqrt_2_over_pi);
    const T a = static_cast<T>(cubic_coefficient);
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const T x = widen(inp[i]);
            out[i] = narrow<S>(T(0.5) * x * (T(1) + std::tanh(s * (x + a * x * x * x))));
        }
    });
}

template <typename S>
void gelu_backward(S* dinp, const S* dout, const S* inp, int64_t N) {
    using T = Compute<S>;
    const T s = static_cast<T>(sqrt_2_over_pi);
    const T a = static_cast<T>(cubic_coefficient);
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const T x = widen(inp[i]);
            const T tanh_value = std::tanh(s * (x + a * x * x * x));
            // d tanh(u)/du = 1 - tanh(u)^2, and du/dx = s * (1 + 3 a x^2).
            const T sech_squared = T(1) - tanh_value * tanh_value;
            const T local_gradient =
                T(0.5) * (T(1) + tanh_value) + T(0.5) * x * sech_squared * s * (T(1) + T(3) * a * x * x);
            dinp[i] = narrow<S>(widen(dinp[i]) + local_gradient * widen(dout[i]));
        }
    });
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);
template void gelu_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t);
template void gelu_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t);

} // namespace engine::kernels::cpu
