// permute and transpose: a contiguous copy with the axes reordered; backward permutes the gradient back.
#include <sstream>
#include <string>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/dimensions.h"
#include "engine/ops/layout_checks.h"

namespace engine {
using namespace detail;
namespace {

std::string dims_string(const std::vector<int64_t>& dims) {
    std::ostringstream text;
    text << "(";
    for (size_t axis = 0; axis < dims.size(); ++axis) text << (axis ? "," : "") << dims[axis];
    text << ")";
    return text.str();
}

// dims normalized to [0, rank), checked to name every axis once.
std::vector<int64_t> checked_permutation(const char* op, const Tensor& input, const std::vector<int64_t>& dims) {
    const Shape& shape = input.shape();
    check_layout_dtype(op, input);
    ENGINE_CHECK(dims.size() == shape.size(), op << ": " << dims.size() << " dims " << dims_string(dims)
                                                 << " for shape " << shape_string(shape) << " of rank "
                                                 << shape.size());
    ENGINE_CHECK(input.dim() <= kernels::cpu::max_permute_rank,
                 op << ": shape " << shape_string(shape) << " has rank " << input.dim() << "; at most "
                    << kernels::cpu::max_permute_rank << " are supported");
    std::vector<int64_t> normalized(dims.size());
    std::vector<bool> seen(dims.size(), false);
    for (size_t axis = 0; axis < dims.size(); ++axis) {
        const int64_t dim = normalize_dimension(op, dims[axis], shape);
        ENGINE_CHECK(!seen[static_cast<size_t>(dim)], op << ": dims " << dims_string(dims) << " name dimension "
                                                         << dim << " twice (shape " << shape_string(shape) << ")");
        seen[static_cast<size_t>(dim)] = true;
        normalized[axis] = dim;
    }
    return normalized;
}

Tensor permute_checked(const char* op, const Tensor& input, const std::vector<int64_t>& dims) {
    const Shape shape = input.shape();
    const int rank = static_cast<int>(shape.size());
    Shape out_shape(shape.size());
    for (size_t axis = 0; axis < dims.size(); ++axis) out_shape[axis] = shape[static_cast<size_t>(dims[axis])];
    Tensor out = Tensor::empty(out_shape, input.dtype(), input.device()); // the permuted shape
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::permute_forward<T>(out.data<T>(), input.data<T>(), shape.data(), dims.data(), rank);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::permute_forward(out.data<T>(), input.data<T>(), shape.data(), dims.data(), rank,
                                           cuda::compute_stream());
        });
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // the permuted shape
        Tensor dinput = context.input_grad(input_target);
        if (!dinput.defined()) return;
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::permute_backward<T>(dinput.data<T>(), dout.data<T>(), shape.data(), dims.data(), rank);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::permute_backward(dinput.data<T>(), dout.data<T>(), shape.data(), dims.data(), rank,
                                                cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace

Tensor permute(const Tensor& input, const std::vector<int64_t>& dims) {
    constexpr const char* op = "permute";
    return permute_checked(op, input, checked_permutation(op, input, dims));
}

Tensor transpose(const Tensor& input, int64_t dim0, int64_t dim1) {
    constexpr const char* op = "transpose";
    const int64_t first = normalize_dimension(op, dim0, input.shape());
    const int64_t second = normalize_dimension(op, dim1, input.shape());
    std::vector<int64_t> dims(input.shape().size());
    for (size_t axis = 0; axis < dims.size(); ++axis) dims[axis] = static_cast<int64_t>(axis);
    std::swap(dims[static_cast<size_t>(first)], dims[static_cast<size_t>(second)]);
    return permute_checked(op, input, checked_permutation(op, input, dims));
}

} // namespace engine
