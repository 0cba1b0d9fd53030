// Layer normalisation over the last dimension, the reference for kernels/cuda/layernorm.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace engine::kernels::cpu {

// T is the storage type, C_ its compute type (float for bf16): every element is widened on load and the
// outputs round once on store; mean, rstd and the parameter gradients stay in C_.
template <typename T>
void layernorm_forward(T* out, Compute<T>* mean, Compute<T>* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C) {
    using C_ = Compute<T>;
    // Rows are independent: chunks of rows on threads, each row's arithmetic as in a single-threaded loop.
    parallel_for(N, items_per_chunk(C, row_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
    for (int64_t n = first_row; n < end_row; ++n) {
        const T* x = inp + n * C;
        T* y = out + n * C;
        // The row sums in lane_sum's eight chains, not one (the chain's add latency was the kernel's cost).
        const double row_mean = lane_sum(C, [&](int64_t c) { return static_cast<double>(widen(x[c])); }) / C;
        // Two passes (centre, then square) rather than E[x^2] - E[x]^2, which cancels badly when the mean is large.
        const double squares = lane_sum(C, [&](int64_t c) {
            const double centred = static_cast<double>(widen(x[c])) - row_mean;
            return centred * centred;
        });
        const double variance = squares / C; // biased, as in PyTorch's LayerNorm
        const C_ row_rstd = static_cast<C_>(1.0 / std::sqrt(variance + layernorm_eps));
        const C_ row_mean_t = static_cast<C_>(row_mean);
        for (int c = 0; c < C; ++c) {
            const C_ norm = (widen(x[c]) - row_mean_t) * row_rstd;
            y[c] = narrow<T>(norm * widen(weight[c]) + widen(bias[c]));
        }
        mean[n] = row_mean_t;
        rstd[n] = row_rstd;
    }
    });
}

template <typename T>
void layernorm_backward(T* dinp, Compute<T>* dweight, Compute<T>* dbias, const T* dout, const T* inp, const T* weight,
                        const Compute<T>* mean, const Compute<T>* rstd, int N, int C) {
    using C_ = Compute<T>;
    // Two passes, so that each can be split without changing any element's arithmetic: dinp by rows (a row's two
    // means, then its elements), the parameter gradients by columns (each column summed over rows 0..N-1 in order,
    // the order of the single loop this replaced). The normalised value is recomputed by the same expression.
    parallel_for(N, items_per_chunk(C, row_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            const T* x = inp + n * C;
            const T* dy = dout + n * C;
            T* dx = dinp + n * C;
            const C_ row_mean = mean[n];
            const C_ row_rstd = rstd[n];

            // The two row means the input gradient needs: mean(dnorm) and mean(dnorm * norm).
            const double dnorm_sum =
                lane_sum(C, [&](int64_t c) { return static_cast<double>(widen(weight[c]) * widen(dy[c])); });
            const double dnorm_norm_sum = lane_sum(C, [&](int64_t c) {
                const C_ norm = (widen(x[c]) - row_mean) * row_rstd;
                const C_ dnorm = widen(weight[c]) * widen(dy[c]);
                return static_cast<double>(dnorm) * static_cast<double>(norm);
            });
            const C_ dnorm_mean = static_cast<C_>(dnorm_sum / C);
            const C_ dnorm_norm_mean = static_cast<C_>(dnorm_norm_sum / C);

            for (int c = 0; c < C; ++c) {
                const C_ norm = (widen(x[c]) - row_mean) * row_rstd;
                const C_ dnorm = widen(weight[c]) * widen(dy[c]);
                dx[c] = narrow<T>(widen(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd);
            }
        }
    });
    // Column chunks walk the rows in order, each row's segment contiguous (no strided column walk).
    parallel_for(C, columns_per_chunk(N), [&](int64_t first_column, int64_t end_column) {
        for (int64_t n = 0; n < N; ++n) {
            const T* x = inp + n * C;
            const T* dy = dout + n * C;
            const C_ row_mean = mean[n];
            const C_ row_rstd = rstd[n];
            for (int64_t c = first_column; c < end_column; ++c) {
                const C_ norm = (widen(x[c]) - row_mean) * row_rstd;
                const C_ gradient = widen(dy[c]);
                dbias[c] += gradient;
                dweight[c] += norm * gradient;
            }
        }
    });
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int,
                                        int);
template void layernorm_forward<bfloat16>(bfloat16*, float*, float*, const bfloat16*, const bfloat16*, const bfloat16*,
                                          int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int, int);
template void layernorm_backward<bfloat16>(bfloat16*, float*, float*, const bfloat16*, const bfloat16*,
                                           const bfloat16*, const float*, const float*, int, int);

} // namespace engine::kernels::cpu
