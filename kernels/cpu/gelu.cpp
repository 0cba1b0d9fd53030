// GELU with the GPT-2 tanh approximation, the reference for kernels/cuda/gelu.cu. f32 and bf16 run the SIMD loop
// of vector_math.h (Highway's tanh; bf16 widened to f32 for it and rounded once on store); f64 keeps the scalar
// libm loop, the specification the float64 gradchecks use.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace engine::kernels::cpu {

namespace {
constexpr double sqrt_2_over_pi = 0.7978845608028654; // sqrt(2 / pi)
constexpr double cubic_coefficient = 0.044715;

// bf16 through the f32 SIMD loop, a block at a time in f32 scratch on the stack.
constexpr int64_t bf16_block = 512;

void widen_block(float* out, const bfloat16* in, int64_t count) {
    for (int64_t i = 0; i < count; ++i) out[i] = to_float(in[i]);
}
} // namespace

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t N) {
    if constexpr (std::is_same_v<S, float>) {
        // ~0.1 ns an element in AVX-512 vectors: the cheap chunk size.
        parallel_for(N, cheap_elements_per_chunk,
                     [&](int64_t begin, int64_t end) { simd::gelu_forward(out + begin, inp + begin, end - begin); });
    } else if constexpr (std::is_same_v<S, bfloat16>) {
        parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
            float x[bf16_block], y[bf16_block];
            for (int64_t first = begin; first < end; first += bf16_block) {
                const int64_t count = std::min(bf16_block, end - first);
                widen_block(x, inp + first, count);
                simd::gelu_forward(y, x, count);
                for (int64_t i = 0; i < count; ++i) out[first + i] = to_bfloat16(y[i]);
            }
        });
    } else {
        const double s = sqrt_2_over_pi, a = cubic_coefficient;
        parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const double x = inp[i];
                out[i] = 0.5 * x * (1.0 + std::tanh(s * (x + a * x * x * x)));
            }
        });
    }
}

template <typename S>
void gelu_backward(S* dinp, const S* dout, const S* inp, int64_t N, bool accumulate) {
    if constexpr (std::is_same_v<S, float>) {
        parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
            simd::gelu_backward(dinp + begin, dout + begin, inp + begin, end - begin, accumulate);
        });
    } else if constexpr (std::is_same_v<S, bfloat16>) {
        parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
            float x[bf16_block], dy[bf16_block], dx[bf16_block];
            for (int64_t first = begin; first < end; first += bf16_block) {
                const int64_t count = std::min(bf16_block, end - first);
                widen_block(x, inp + first, count);
                widen_block(dy, dout + first, count);
                if (accumulate) widen_block(dx, dinp + first, count);
                simd::gelu_backward(dx, dy, x, count, accumulate);
                for (int64_t i = 0; i < count; ++i) dinp[first + i] = to_bfloat16(dx[i]);
            }
        });
    } else {
        const double s = sqrt_2_over_pi, a = cubic_coefficient;
        parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const double x = inp[i];
                const double tanh_value = std::tanh(s * (x + a * x * x * x));
                // d tanh(u)/du = 1 - tanh(u)^2, and du/dx = s * (1 + 3 a x^2).
                const double sech_squared = 1.0 - tanh_value * tanh_value;
                const double local_gradient =
                    0.5 * (1.0 + tanh_value) + 0.5 * x * sech_squared * s * (1.0 + 3.0 * a * x * x);
                dinp[i] = (accumulate ? dinp[i] : 0.0) + local_gradient * dout[i];
            }
        });
    }
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, bool);
template void gelu_backward<double>(double*, const double*, const double*, int64_t, bool);
template void gelu_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t);
template void gelu_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t, bool);

} // namespace engine::kernels::cpu
