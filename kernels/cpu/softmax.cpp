// softmax and log_softmax over one dimension, the reference for kernels/cuda/softmax.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace engine::kernels::cpu {

namespace {

// One (outer, inner) column of `size` elements, `inner` apart. The max is subtracted before exp so that no
// term overflows; the sum of the exponentials runs in double. Columns are independent: chunks of them on threads.
template <typename S, bool logarithm>
void normalise_columns(S* out, const S* inp, int64_t outer, int64_t size, int64_t inner) {
    using T = Compute<S>;
    parallel_for(outer * inner, items_per_chunk(size, costly_elements_per_chunk), [&](int64_t first, int64_t end) {
        for (int64_t column = first; column < end; ++column) {
            const int64_t o = column / inner, n = column % inner;
            const S* x = inp + o * size * inner + n;
            S* y = out + o * size * inner + n;
            T maximum = widen(x[0]);
            for (int64_t i = 1; i < size; ++i) maximum = std::fmax(maximum, widen(x[i * inner]));
            double total = 0.0;
            for (int64_t i = 0; i < size; ++i) total += static_cast<double>(std::exp(widen(x[i * inner]) - maximum));
            if constexpr (logarithm) {
                // (x - max) - log(total): x - max is exact near the max, so no rounding at the scale of max.
                const T log_total = static_cast<T>(std::log(total));
                for (int64_t i = 0; i < size; ++i) y[i * inner] = narrow<S>((widen(x[i * inner]) - maximum) - log_total);
            } else {
                const T reciprocal = static_cast<T>(1.0 / total);
                for (int64_t i = 0; i < size; ++i)
                    y[i * inner] = narrow<S>(std::exp(widen(x[i * inner]) - maximum) * reciprocal);
            }
        }
    });
}

template <typename S, bool logarithm>
void normalise_columns_backward(S* dinp, const S* dout, const S* out, int64_t outer, int64_t size, int64_t inner) {
    using T = Compute<S>;
    parallel_for(outer * inner, items_per_chunk(size, costly_elements_per_chunk), [&](int64_t first, int64_t end) {
        for (int64_t column = first; column < end; ++column) {
            const int64_t o = column / inner, n = column % inner;
            const int64_t base = o * size * inner + n;
            const S* dy = dout + base;
            const S* y = out + base;
            S* dx = dinp + base;
            double total = 0.0; // softmax: sum(dy * y); log_softmax: sum(dy)
            for (int64_t i = 0; i < size; ++i) {
                const double gradient = static_cast<double>(widen(dy[i * inner]));
                total += logarithm ? gradient : gradient * static_cast<double>(widen(y[i * inner]));
            }
            const T row_total = static_cast<T>(total);
            for (int64_t i = 0; i < size; ++i) {
                const T gradient = widen(dy[i * inner]), value = widen(y[i * inner]);
                const T local = logarithm ? gradient - std::exp(value) * row_total : value * (gradient - row_total);
                dx[i * inner] = narrow<S>(widen(dx[i * inner]) + local);
            }
        }
    });
}

} // namespace

template <typename S>
void softmax_forward(S* out, const S* inp, int64_t outer, int64_t size, int64_t inner) {
    normalise_columns<S, false>(out, inp, outer, size, inner);
}
template <typename S>
void log_softmax_forward(S* out, const S* inp, int64_t outer, int64_t size, int64_t inner) {
    normalise_columns<S, true>(out, inp, outer, size, inner);
}
template <typename S>
void softmax_backward(S* dinp, const S* dout, const S* out, int64_t outer, int64_t size, int64_t inner) {
    normalise_columns_backward<S, false>(dinp, dout, out, outer, size, inner);
}
template <typename S>
void log_softmax_backward(S* dinp, const S* dout, const S* out, int64_t outer, int64_t size, int64_t inner) {
    normalise_columns_backward<S, true>(dinp, dout, out, outer, size, inner);
}

#define ENGINE_INSTANTIATE_SOFTMAX(S)                                                                            \
    template void softmax_forward<S>(S*, const S*, int64_t, int64_t, int64_t);                                 \
    template void log_softmax_forward<S>(S*, const S*, int64_t, int64_t, int64_t);                             \
    template void softmax_backward<S>(S*, const S*, const S*, int64_t, int64_t, int64_t);                      \
    template void log_softmax_backward<S>(S*, const S*, const S*, int64_t, int64_t, int64_t);
ENGINE_INSTANTIATE_SOFTMAX(float)
ENGINE_INSTANTIATE_SOFTMAX(double)
ENGINE_INSTANTIATE_SOFTMAX(bfloat16)
#undef ENGINE_INSTANTIATE_SOFTMAX

} // namespace engine::kernels::cpu
