// sum, mean and max over one dimension, the reference for kernels/cuda/reduce_dimension.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace engine::kernels::cpu {

template <typename S>
void sum_over_dimension_forward(S* out, const S* inp, int64_t outer, int64_t size, int64_t inner,
                                Compute<S> scale) {
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t n = 0; n < inner; ++n) {
            const S* x = inp + o * size * inner + n;
            double total = 0.0;
            for (int64_t i = 0; i < size; ++i) total += static_cast<double>(widen(x[i * inner]));
            out[o * inner + n] = narrow<S>(static_cast<Compute<S>>(static_cast<double>(scale) * total));
        }
    }
}

template <typename S>
void sum_over_dimension_backward(S* dinp, const S* dout, int64_t outer, int64_t size, int64_t inner,
                                 Compute<S> scale) {
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < size; ++i) {
            S* dx = dinp + (o * size + i) * inner;
            const S* dy = dout + o * inner;
            for (int64_t n = 0; n < inner; ++n) dx[n] = narrow<S>(widen(dx[n]) + scale * widen(dy[n]));
        }
    }
}

template <typename S>
void max_over_dimension_forward(S* out, int32_t* indices, const S* inp, int64_t outer, int64_t size,
                                int64_t inner) {
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t n = 0; n < inner; ++n) {
            const S* x = inp + o * size * inner + n;
            Compute<S> best = widen(x[0]);
            int32_t best_index = 0;
            // Strictly greater: a tie keeps the first index. The first NaN wins and stays.
            for (int64_t i = 1; i < size && !std::isnan(best); ++i) {
                const Compute<S> value = widen(x[i * inner]);
                if (value > best || std::isnan(value)) {
                    best = value;
                    best_index = static_cast<int32_t>(i);
                }
            }
            out[o * inner + n] = narrow<S>(best);
            indices[o * inner + n] = best_index;
        }
    }
}

template <typename S>
void max_over_dimension_backward(S* dinp, const S* dout, const int32_t* indices, int64_t outer, int64_t size,
                                 int64_t inner) {
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t n = 0; n < inner; ++n) {
            S* dx = dinp + (o * size + indices[o * inner + n]) * inner + n;
            *dx = narrow<S>(widen(*dx) + widen(dout[o * inner + n]));
        }
    }
}

#define ENGINE_INSTANTIATE_REDUCE_DIMENSION(S)                                                                   \
    template void sum_over_dimension_forward<S>(S*, const S*, int64_t, int64_t, int64_t, Compute<S>);          \
    template void sum_over_dimension_backward<S>(S*, const S*, int64_t, int64_t, int64_t, Compute<S>);         \
    template void max_over_dimension_forward<S>(S*, int32_t*, const S*, int64_t, int64_t, int64_t);            \
    template void max_over_dimension_backward<S>(S*, const S*, const int32_t*, int64_t, int64_t, int64_t);
ENGINE_INSTANTIATE_REDUCE_DIMENSION(float)
ENGINE_INSTANTIATE_REDUCE_DIMENSION(double)
ENGINE_INSTANTIATE_REDUCE_DIMENSION(bfloat16)
#undef ENGINE_INSTANTIATE_REDUCE_DIMENSION

} // namespace engine::kernels::cpu
