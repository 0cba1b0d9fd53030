// The unary pointwise functions (relu, silu, tanh, sigmoid, exp, log), the reference for kernels/cuda/unary.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename S>
void unary_forward(S* out, const S* inp, int64_t N, UnaryFunction function) {
    using T = Compute<S>;
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = narrow<S>(unary_value<T>(function, widen(inp[i])));
    });
}

template <typename S>
void unary_backward(S* dinp, const S* dout, const S* saved, int64_t N, UnaryFunction function) {
    using T = Compute<S>;
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
            dinp[i] = narrow<S>(widen(dinp[i]) + unary_derivative<T>(function, widen(saved[i])) * widen(dout[i]));
    });
}

#define ENGINE_INSTANTIATE_UNARY(S)                                                                          \
    template void unary_forward<S>(S*, const S*, int64_t, UnaryFunction);                                    \
    template void unary_backward<S>(S*, const S*, const S*, int64_t, UnaryFunction);
ENGINE_INSTANTIATE_UNARY(float)
ENGINE_INSTANTIATE_UNARY(double)
ENGINE_INSTANTIATE_UNARY(bfloat16)
#undef ENGINE_INSTANTIATE_UNARY

} // namespace engine::kernels::cpu
