// The layout ops (declared here, defined in engine/ops/{permute,view,slice,batched_matmul}.cpp). Included by
// engine/ops.h. Tensors are contiguous row-major, so view and reshape share the input's storage and every
// other layout op writes a contiguous copy; every one of them is differentiable.
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace engine {

// out's axis i is input's axis dims[i] (each in [-rank, rank), each once; rank <= 8). A contiguous copy, the
// identity permutation included (so the result never aliases the input). Backward: the inverse permutation,
// added into the input's gradient.
Tensor permute(const Tensor& input, const std::vector<int64_t>& dims);
// permute swapping dim0 and dim1 (negative counted from the end); dim0 == dim1 is an identity copy.
Tensor transpose(const Tensor& input, int64_t dim0, int64_t dim1);

// The same storage under a new shape with the same element count; one extent may be -1, inferred (it must
// then divide evenly; with other extents multiplying to 0 it is ambiguous, an error). Unlike the member
// Tensor::reshape (one autograd identity for both), the result is a new tensor for autograd, whose gradient
// reaches the input through its own backward node: the gradient buffers keep each tensor's shape.
// view and reshape are the same op (every tensor is contiguous, so no reshape ever needs a copy); the two
// names are PyTorch's, and errors name the one called.
Tensor view(const Tensor& input, const Shape& shape);
Tensor reshape(const Tensor& input, const Shape& shape);

// A contiguous copy of input[start:end) along dim. start and end as Python slices: negative ones count from
// the end, and both clamp to [0, size], so an empty range (end <= start) gives an empty tensor with extent 0
// along dim. Backward adds the gradient into that region of the input's gradient.
Tensor slice(const Tensor& input, int64_t dim, int64_t start, int64_t end);
// The inputs joined along dim (negative from the end): the same rank, dtype and device, equal extents on
// every other dimension; an input may appear more than once, and extents of 0 are allowed. Backward hands each
// input its slice of the gradient (added, so an input used twice receives both).
Tensor concat(const std::vector<Tensor>& inputs, int64_t dim);

// Batched matmul: c (...,M,N) = op(a) op(b) over the leading (batch) dimensions, op(x) = x, or xᵀ (its last two
// dimensions swapped) when transposed. a is (...,M,K), or (...,K,M) with transpose_a; b is (...,K,N), or
// (...,N,K) with transpose_b, with the same batch dimensions as a, or 2-D: one matrix broadcast over a's
// batch. matmul(a, b, bool) (engine/ops.h) is this with a 2-D b and no transpose_a, and keeps its own path.
struct MatmulOptions {
    bool transpose_a = false;
    bool transpose_b = false;
};
Tensor matmul(const Tensor& a, const Tensor& b, MatmulOptions options);

} // namespace engine
