// Fused SwiGLU, silu(gate) * up, the reference for kernels/cuda/swiglu.cu.
#include "kernels/common/pointwise_functions.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename S>
void swiglu_forward(S* out, const S* gate, const S* up, int64_t N) {
    using C = Compute<S>;
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
            out[i] = narrow<S>(unary_value<C>(UnaryFunction::silu, widen(gate[i])) * widen(up[i]));
    });
}

template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t N) {
    using C = Compute<S>;
    parallel_for(N, costly_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const C g = widen(gate[i]), gradient = widen(dout[i]);
            // silu' is pointwise_functions.h's, from the input (silu's backward reads its input).
            if (dgate) {
                const C slope = unary_derivative<C>(UnaryFunction::silu, g);
                dgate[i] = narrow<S>(widen(dgate[i]) + gradient * widen(up[i]) * slope);
            }
            if (dup) dup[i] = narrow<S>(widen(dup[i]) + gradient * unary_value<C>(UnaryFunction::silu, g));
        }
    });
}

#define ENGINE_INSTANTIATE_SWIGLU(S)                                                                         \
    template void swiglu_forward<S>(S*, const S*, const S*, int64_t);                                        \
    template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, int64_t);
ENGINE_INSTANTIATE_SWIGLU(float)
ENGINE_INSTANTIATE_SWIGLU(double)
ENGINE_INSTANTIATE_SWIGLU(bfloat16)
#undef ENGINE_INSTANTIATE_SWIGLU

} // namespace engine::kernels::cpu
