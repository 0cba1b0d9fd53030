// RMS normalisation over the last dimension (Llama), the reference for kernels/cuda/rms_norm.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <cmath>

namespace engine::kernels::cpu {

template <typename S>
void rms_norm_forward(S* out, Compute<S>* rstd, const S* inp, const S* weight, int N, int C, double eps) {
    using T = Compute<S>;
    // Rows are independent: chunks of rows on threads, each row's arithmetic as in a single-threaded loop.
    parallel_for(N, items_per_chunk(C, row_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            const S* x = inp + n * C;
            S* y = out + n * C;
            double squares = 0.0;
            for (int c = 0; c < C; ++c) {
                const double value = static_cast<double>(widen(x[c]));
                squares += value * value;
            }
            const T row_rstd = static_cast<T>(1.0 / std::sqrt(squares / C + eps));
            for (int c = 0; c < C; ++c) {
                // LlamaRMSNorm: weight * (x * rstd).to(input dtype), so bf16 rounds the normalised value first.
                const T norm = widen(narrow<S>(widen(x[c]) * row_rstd));
                y[c] = narrow<S>(widen(weight[c]) * norm);
            }
            rstd[n] = row_rstd;
        }
    });
}

template <typename S>
void rms_norm_backward(S* dinp, Compute<S>* dweight, const S* dout, const S* inp, const S* weight,
                       const Compute<S>* rstd, int N, int C) {
    using T = Compute<S>;
    // As layernorm_backward: dinp by row chunks, dweight by column chunks that walk the rows in order.
    parallel_for(N, items_per_chunk(C, row_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            const S* x = inp + n * C;
            const S* dy = dout + n * C;
            S* dx = dinp + n * C;
            const T row_rstd = rstd[n];
            double dnorm_norm_sum = 0.0;
            for (int c = 0; c < C; ++c) {
                const T norm = widen(x[c]) * row_rstd;
                dnorm_norm_sum += static_cast<double>(widen(weight[c]) * widen(dy[c])) * static_cast<double>(norm);
            }
            const T dnorm_norm_mean = static_cast<T>(dnorm_norm_sum / C);
            for (int c = 0; c < C; ++c) {
                const T norm = widen(x[c]) * row_rstd;
                const T gradient = widen(dy[c]);
                dx[c] = narrow<S>(widen(dx[c]) + (widen(weight[c]) * gradient - norm * dnorm_norm_mean) * row_rstd);
            }
        }
    });
    parallel_for(C, columns_per_chunk(N), [&](int64_t first_column, int64_t end_column) {
        for (int64_t n = 0; n < N; ++n) {
            const S* x = inp + n * C;
            const S* dy = dout + n * C;
            const T row_rstd = rstd[n];
            for (int64_t c = first_column; c < end_column; ++c) {
                const T norm = widen(x[c]) * row_rstd;
                // The weight multiplied the rounded norm in forward, so its gradient takes that one.
                dweight[c] += widen(dy[c]) * widen(narrow<S>(norm));
            }
        }
    });
}

template void rms_norm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rms_norm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rms_norm_forward<bfloat16>(bfloat16*, float*, const bfloat16*, const bfloat16*, int, int, double);
template void rms_norm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int,
                                       int);
template void rms_norm_backward<double>(double*, double*, const double*, const double*, const double*,
                                        const double*, int, int);
template void rms_norm_backward<bfloat16>(bfloat16*, float*, const bfloat16*, const bfloat16*, const bfloat16*,
                                          const float*, int, int);

} // namespace engine::kernels::cpu
