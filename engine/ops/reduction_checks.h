// The checks and shapes the reductions ops share (engine/ops/reductions*.cpp): each throws naming the op and
// the tensor before anything is allocated.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "engine/ops/dimensions.h"
#include "engine/tensor.h"

namespace engine::detail {

// A defined floating tensor with a kernel on its device (f32, f64, bf16 on the CPU; f32, bf16 on CUDA).
inline void check_reducible(const char* op, const char* what, const Tensor& tensor) {
    ENGINE_CHECK(tensor.defined(), op << ": " << what << " is undefined");
    const DType dtype = tensor.dtype();
    ENGINE_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                 op << ": " << what << " " << tensor.describe() << " is not floating point (f32, f64 or bf16)");
    ENGINE_CHECK(tensor.device() == Device::cpu || dtype != DType::f64,
                 op << ": " << what << " " << tensor.describe() << ": CUDA kernels take f32 or bf16");
}

// The input split around a checked dimension; `nonempty` requires the dimension to have elements (a max or
// softmax over nothing has no value).
inline AroundDimension checked_around_dimension(const char* op, const Tensor& input, int64_t dim, bool nonempty) {
    check_reducible(op, "input", input);
    const int64_t axis = normalize_dimension(op, dim, input.shape());
    const AroundDimension split = around_dimension(input.shape(), axis);
    ENGINE_CHECK(!nonempty || split.size > 0 || split.outer * split.inner == 0,
                 op << ": dimension " << dim << " of " << input.describe() << " is empty");
    ENGINE_CHECK(split.size <= 2147483647,
                 op << ": dimension " << dim << " of " << input.describe() << " is longer than 2^31-1");
    return split;
}

// The shape after reducing `dim`: kept as 1, or removed (a rank-1 input then gives (1), as sum(input) does).
inline Shape reduced_shape(const Shape& shape, int64_t dim, bool keepdim) {
    const int64_t axis = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
    Shape result;
    for (int64_t index = 0; index < static_cast<int64_t>(shape.size()); ++index) {
        if (index != axis) result.push_back(shape[static_cast<size_t>(index)]);
        else if (keepdim) result.push_back(1);
    }
    if (result.empty()) result.push_back(1);
    return result;
}

} // namespace engine::detail
