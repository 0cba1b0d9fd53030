// slice and concat as block copies over (outer, size, inner), the reference for kernels/cuda/slice.cu. Each
// of the four kernels moves `outer` rows of length * inner contiguous elements between a wide buffer (size
// along the dimension) and a narrow one (length).
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

namespace {

// narrow (outer, length, inner) and wide (outer, size, inner) at [start, start+length): to_wide copies
// narrow into wide, else wide into narrow; accumulate adds instead of overwriting.
template <bool to_wide, bool accumulate, typename Scalar, typename Source>
void copy_blocks(Scalar* destination, const Source* source, int64_t outer, int64_t size, int64_t inner,
                 int64_t start, int64_t length) {
    const int64_t row = length * inner;
    for (int64_t o = 0; o < outer; ++o) {
        const int64_t wide = (o * size + start) * inner, narrow_offset = o * row;
        Scalar* out = destination + (to_wide ? wide : narrow_offset);
        const Source* in = source + (to_wide ? narrow_offset : wide);
        for (int64_t i = 0; i < row; ++i) {
            if constexpr (accumulate) out[i] = narrow<Scalar>(widen(out[i]) + widen(in[i]));
            else out[i] = in[i];
        }
    }
}

} // namespace

template <typename Scalar>
void slice_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                   int64_t length) {
    copy_blocks<false, false>(out, inp, outer, size, inner, start, length);
}
template <typename Scalar>
void slice_backward(Scalar* dinp, const Scalar* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length) {
    copy_blocks<true, true>(dinp, dout, outer, size, inner, start, length);
}
template <typename Scalar>
void concat_forward(Scalar* out, const Scalar* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length) {
    copy_blocks<true, false>(out, inp, outer, size, inner, start, length);
}
template <typename Scalar>
void concat_backward(Scalar* dinp, const Scalar* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                     int64_t length) {
    copy_blocks<false, true>(dinp, dout, outer, size, inner, start, length);
}

#define ENGINE_SLICE_INSTANTIATE(kernel, Scalar)                                                             \
    template void kernel<Scalar>(Scalar*, const Scalar*, int64_t, int64_t, int64_t, int64_t, int64_t);
#define ENGINE_SLICE_INSTANTIATE_ALL(Scalar)                                                                 \
    ENGINE_SLICE_INSTANTIATE(slice_forward, Scalar)                                                          \
    ENGINE_SLICE_INSTANTIATE(slice_backward, Scalar)                                                         \
    ENGINE_SLICE_INSTANTIATE(concat_forward, Scalar)                                                         \
    ENGINE_SLICE_INSTANTIATE(concat_backward, Scalar)
ENGINE_SLICE_INSTANTIATE_ALL(float)
ENGINE_SLICE_INSTANTIATE_ALL(double)
ENGINE_SLICE_INSTANTIATE_ALL(bfloat16)
#undef ENGINE_SLICE_INSTANTIATE_ALL
#undef ENGINE_SLICE_INSTANTIATE

} // namespace engine::kernels::cpu
