// Layer normalisation over the last dimension, the reference for kernels/cuda/layernorm.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace engine::kernels::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C) {
    for (int n = 0; n < N; ++n) {
        const T* x = inp + static_cast<int64_t>(n) * C;
        T* y = out + static_cast<int64_t>(n) * C;
        double sum = 0.0;
        for (int c = 0; c < C; ++c) sum += static_cast<double>(x[c]);
        const double row_mean = sum / C;
        // Two passes (centre, then square) rather than E[x^2] - E[x]^2, which cancels badly when the mean is large.
        double squares = 0.0;
        for (int c = 0; c < C; ++c) {
            const double centred = static_cast<double>(x[c]) - row_mean;
            squares += centred * centred;
        }
        const double variance = squares / C; // biased, as in PyTorch's LayerNorm
        const T row_rstd = static_cast<T>(1.0 / std::sqrt(variance + layernorm_eps));
        const T row_mean_t = static_cast<T>(row_mean);
        for (int c = 0; c < C; ++c) {
            const T norm = (x[c] - row_mean_t) * row_rstd;
            y[c] = norm * weight[c] + bias[c];
        }
        mean[n] = row_mean_t;
        rstd[n] = row_rstd;
    }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int N, int C) {
    for (int n = 0; n < N; ++n) {
        const T* x = inp + static_cast<int64_t>(n) * C;
        const T* dy = dout + static_cast<int64_t>(n) * C;
        T* dx = dinp + static_cast<int64_t>(n) * C;
        const T row_mean = mean[n];
        const T row_rstd = rstd[n];

        // The two row means the input gradient needs: mean(dnorm) and mean(dnorm * norm).
        double dnorm_sum = 0.0;
        double dnorm_norm_sum = 0.0;
        for (int c = 0; c < C; ++c) {
            const T norm = (x[c] - row_mean) * row_rstd;
            const T dnorm = weight[c] * dy[c];
            dnorm_sum += static_cast<double>(dnorm);
            dnorm_norm_sum += static_cast<double>(dnorm) * static_cast<double>(norm);
        }
        const T dnorm_mean = static_cast<T>(dnorm_sum / C);
        const T dnorm_norm_mean = static_cast<T>(dnorm_norm_sum / C);

        for (int c = 0; c < C; ++c) {
            const T norm = (x[c] - row_mean) * row_rstd;
            const T dnorm = weight[c] * dy[c];
            dbias[c] += dy[c];
            dweight[c] += norm * dy[c];
            dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * row_rstd;
        }
    }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int,
                                        int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int, int);

} // namespace engine::kernels::cpu
