// permute (axis reordering as a contiguous copy), the reference for kernels/cuda/permute.cu: one walk over the
// output in order, reading the input through its strides.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

namespace {

// out = inp with axes reordered (dims), or with accumulate, out += that.
template <bool accumulate, typename Scalar>
void permute_copy(Scalar* out, const Scalar* inp, const int64_t* shape, const int64_t* dims, int rank) {
    int64_t input_strides[max_permute_rank];
    int64_t stride = 1;
    for (int axis = rank - 1; axis >= 0; --axis) {
        input_strides[axis] = stride;
        stride *= shape[axis];
    }
    const int64_t count = stride;
    if (count == 0) return;
    int64_t out_extents[max_permute_rank], strides[max_permute_rank], index[max_permute_rank] = {};
    for (int axis = 0; axis < rank; ++axis) {
        out_extents[axis] = shape[dims[axis]];
        strides[axis] = input_strides[dims[axis]]; // the input step of one step along out's axis
    }
    int64_t offset = 0; // into inp, of out element `position`
    for (int64_t position = 0; position < count; ++position) {
        if constexpr (accumulate) out[position] = narrow<Scalar>(widen(out[position]) + widen(inp[offset]));
        else out[position] = inp[offset];
        for (int axis = rank - 1; axis >= 0; --axis) { // the odometer: the last axis turns fastest
            offset += strides[axis];
            if (++index[axis] < out_extents[axis]) break;
            offset -= strides[axis] * out_extents[axis];
            index[axis] = 0;
        }
    }
}

} // namespace

template <typename Scalar>
void permute_forward(Scalar* out, const Scalar* inp, const int64_t* shape, const int64_t* dims, int rank) {
    permute_copy<false>(out, inp, shape, dims, rank);
}

// The inverse permutation over dout's shape, so the walk runs over dinp in order.
template <typename Scalar>
void permute_backward(Scalar* dinp, const Scalar* dout, const int64_t* shape, const int64_t* dims, int rank) {
    int64_t out_shape[max_permute_rank] = {}, inverse[max_permute_rank] = {};
    for (int axis = 0; axis < rank; ++axis) {
        out_shape[axis] = shape[dims[axis]];
        inverse[dims[axis]] = axis;
    }
    permute_copy<true>(dinp, dout, out_shape, inverse, rank);
}

#define ENGINE_PERMUTE_INSTANTIATE(Scalar)                                                                   \
    template void permute_forward<Scalar>(Scalar*, const Scalar*, const int64_t*, const int64_t*, int);      \
    template void permute_backward<Scalar>(Scalar*, const Scalar*, const int64_t*, const int64_t*, int);
ENGINE_PERMUTE_INSTANTIATE(float)
ENGINE_PERMUTE_INSTANTIATE(double)
ENGINE_PERMUTE_INSTANTIATE(bfloat16)
#undef ENGINE_PERMUTE_INSTANTIATE

} // namespace engine::kernels::cpu
