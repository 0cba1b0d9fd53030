// The first columns of each row, copied out and their gradient added back: the twin of
// kernels/cuda/columns.cu. The padded vocabulary uses it to hand users (…,V) of (…,Vp) logits.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

template <typename T>
void first_columns_forward(T* out, const T* inp, int64_t N, int columns, int count) {
    for (int64_t n = 0; n < N; ++n)
        for (int c = 0; c < count; ++c) out[n * count + c] = inp[n * columns + c];
}

template <typename T>
void first_columns_backward(T* dinp, const T* dout, int64_t N, int columns, int count) {
    for (int64_t n = 0; n < N; ++n)
        for (int c = 0; c < count; ++c)
            dinp[n * columns + c] = narrow<T>(widen(dinp[n * columns + c]) + widen(dout[n * count + c]));
}

template void first_columns_forward<float>(float*, const float*, int64_t, int, int);
template void first_columns_forward<double>(double*, const double*, int64_t, int, int);
template void first_columns_backward<float>(float*, const float*, int64_t, int, int);
template void first_columns_backward<double>(double*, const double*, int64_t, int, int);
template void first_columns_forward<bfloat16>(bfloat16*, const bfloat16*, int64_t, int, int);
template void first_columns_backward<bfloat16>(bfloat16*, const bfloat16*, int64_t, int, int);

} // namespace engine::kernels::cpu
