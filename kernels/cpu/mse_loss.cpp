// Mean squared error, the reference for kernels/cuda/mse_loss.cu.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

template <typename S>
void squared_error_forward(S* out, const S* inp, const S* target, int64_t N) {
    for (int64_t i = 0; i < N; ++i) {
        const Compute<S> difference = widen(inp[i]) - widen(target[i]);
        out[i] = narrow<S>(difference * difference);
    }
}

template <typename S>
void mse_loss_forward(Compute<S>* out, const S* inp, const S* target, int64_t N, Compute<S> scale) {
    double total = 0.0;
    for (int64_t i = 0; i < N; ++i) {
        const double difference = static_cast<double>(widen(inp[i])) - static_cast<double>(widen(target[i]));
        total += difference * difference;
    }
    out[0] = static_cast<Compute<S>>(static_cast<double>(scale) * total);
}

namespace {
// g = 2 (inp - target) gradient(i); dinp += g, dtarget -= g.
template <typename S, typename Gradient>
void add_squared_error_gradients(S* dinp, S* dtarget, const S* inp, const S* target, int64_t N, Gradient gradient) {
    for (int64_t i = 0; i < N; ++i) {
        const Compute<S> g = Compute<S>(2) * (widen(inp[i]) - widen(target[i])) * gradient(i);
        if (dinp) dinp[i] = narrow<S>(widen(dinp[i]) + g);
        if (dtarget) dtarget[i] = narrow<S>(widen(dtarget[i]) - g);
    }
}
} // namespace

template <typename S>
void squared_error_backward(S* dinp, S* dtarget, const S* dout, const S* inp, const S* target, int64_t N) {
    add_squared_error_gradients(dinp, dtarget, inp, target, N, [&](int64_t i) { return widen(dout[i]); });
}

template <typename S>
void mse_loss_backward(S* dinp, S* dtarget, const Compute<S>* dout, const S* inp, const S* target, int64_t N,
                       Compute<S> scale) {
    const Compute<S> gradient = scale * dout[0];
    add_squared_error_gradients(dinp, dtarget, inp, target, N, [&](int64_t) { return gradient; });
}

#define ENGINE_INSTANTIATE_MSE_LOSS(S)                                                                           \
    template void squared_error_forward<S>(S*, const S*, const S*, int64_t);                                   \
    template void mse_loss_forward<S>(Compute<S>*, const S*, const S*, int64_t, Compute<S>);                   \
    template void squared_error_backward<S>(S*, S*, const S*, const S*, const S*, int64_t);                    \
    template void mse_loss_backward<S>(S*, S*, const Compute<S>*, const S*, const S*, int64_t, Compute<S>);
ENGINE_INSTANTIATE_MSE_LOSS(float)
ENGINE_INSTANTIATE_MSE_LOSS(double)
ENGINE_INSTANTIATE_MSE_LOSS(bfloat16)
#undef ENGINE_INSTANTIATE_MSE_LOSS

} // namespace engine::kernels::cpu
