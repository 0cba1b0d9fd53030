// Rotary position embedding (Hugging Face's rotate-half layout), the reference for kernels/cuda/rope.cu.
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

// Two products, each rounded, then their sum: the order the CUDA twin spells out with __fmul_rn/__fadd_rn, so
// that the two round alike. Nothing may fuse a product into the sum: the build is ISO C++ (CMAKE_CXX_EXTENSIONS
// OFF), under which GCC does not contract across operations (-ffp-contract=off); a compiler that did would
// break the bitwise CPU/CUDA tests, which is how it would be noticed.
template <typename S>
void rope_forward(S* out, const S* inp, const Compute<S>* cos, const Compute<S>* sin, const int32_t* positions, int B,
                  int T, int H, int D) {
    using C = Compute<S>;
    const int half = D / 2;
    // Positions (b, t) are independent: chunks of them on threads.
    parallel_for(int64_t(B) * T, items_per_chunk(int64_t(H) * D, cheap_elements_per_chunk), [&](int64_t first, int64_t end) {
        for (int64_t position = first; position < end; ++position) {
            const int64_t b = position / T, t = position % T;
            const int64_t row = positions ? positions[position] : t; // the token's table row
            const C* c = cos + row * half;                           // (D/2)
            const C* s = sin + row * half;
            for (int h = 0; h < H; ++h) {
                const int64_t head = ((b * T + t) * H + h) * D;
                const S* x = inp + head; // (D)
                S* y = out + head;       // (D)
                for (int i = 0; i < half; ++i) {
                    const C first = widen(x[i]), second = widen(x[i + half]);
                    y[i] = narrow<S>(first * c[i] - second * s[i]);
                    y[i + half] = narrow<S>(second * c[i] + first * s[i]);
                }
            }
        }
    });
}

template <typename S>
void rope_backward(S* dinp, const S* dout, const Compute<S>* cos, const Compute<S>* sin, const int32_t* positions,
                   int B, int T, int H, int D) {
    using C = Compute<S>;
    const int half = D / 2;
    parallel_for(int64_t(B) * T, items_per_chunk(int64_t(H) * D, cheap_elements_per_chunk), [&](int64_t first, int64_t end) {
        for (int64_t position = first; position < end; ++position) {
            const int64_t b = position / T, t = position % T;
            const int64_t row = positions ? positions[position] : t;
            const C* c = cos + row * half;
            const C* s = sin + row * half;
            for (int h = 0; h < H; ++h) {
                const int64_t head = ((b * T + t) * H + h) * D;
                const S* dy = dout + head; // (D)
                S* dx = dinp + head;       // (D)
                for (int i = 0; i < half; ++i) {
                    const C first = widen(dy[i]), second = widen(dy[i + half]);
                    // The rotation's contribution first, then one += (one rounding for bf16).
                    const C first_gradient = first * c[i] + second * s[i];
                    const C second_gradient = second * c[i] - first * s[i];
                    dx[i] = narrow<S>(widen(dx[i]) + first_gradient);
                    dx[i + half] = narrow<S>(widen(dx[i + half]) + second_gradient);
                }
            }
        }
    });
}

#define ENGINE_INSTANTIATE_ROPE(S)                                                                                     \
    template void rope_forward<S>(S*, const S*, const Compute<S>*, const Compute<S>*, const int32_t*, int, int, int,   \
                                  int);                                                                                \
    template void rope_backward<S>(S*, const S*, const Compute<S>*, const Compute<S>*, const int32_t*, int, int, int,  \
                                   int);
ENGINE_INSTANTIATE_ROPE(float)
ENGINE_INSTANTIATE_ROPE(double)
ENGINE_INSTANTIATE_ROPE(bfloat16)
#undef ENGINE_INSTANTIATE_ROPE

} // namespace engine::kernels::cpu
