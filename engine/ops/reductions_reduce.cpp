// sum, mean and max over one dimension, keepdim or not, in the input's dtype. max saves its argmax (i32).
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/reduction_checks.h"

namespace engine {
using namespace detail;

namespace {

// sum (scale 1) and mean (scale 1/size) share their kernels.
Tensor scaled_sum(const char* op, const Tensor& input, int64_t dim, bool keepdim, bool average) {
    const AroundDimension split = checked_around_dimension(op, input, dim, false);
    const int64_t outer = split.outer, size = split.size, inner = split.inner;
    // mean over an empty dimension is 0 * (1/0) = NaN, as in PyTorch.
    const double scale = average ? 1.0 / static_cast<double>(size) : 1.0;
    Tensor out = Tensor::empty(reduced_shape(input.shape(), dim, keepdim), input.dtype(), input.device()); // (outer,inner)
    if (out.numel() > 0) {
        if (input.device() == Device::cpu) {
            dispatch_cpu(op, input.dtype(), [&]<typename T>() {
                kernels::cpu::sum_over_dimension_forward<T>(out.data<T>(), input.data<T>(), outer, size, inner,
                                                            static_cast<Compute<T>>(scale));
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
                kernels::cuda::sum_over_dimension_forward(out.data<T>(), input.data<T>(), outer, size, inner,
                                                          static_cast<float>(scale), cuda::compute_stream());
            });
        }
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        Tensor dinput = context.input_grad(input_target);
        if (!dinput.defined() || dinput.numel() == 0) return;
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::sum_over_dimension_backward<T>(dinput.data<T>(), dout.data<T>(), outer, size, inner,
                                                             static_cast<Compute<T>>(scale));
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::sum_over_dimension_backward(dinput.data<T>(), dout.data<T>(), outer, size, inner,
                                                           static_cast<float>(scale), cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace

Tensor sum(const Tensor& input, int64_t dim, bool keepdim) { return scaled_sum("sum", input, dim, keepdim, false); }
Tensor mean(const Tensor& input, int64_t dim, bool keepdim) { return scaled_sum("mean", input, dim, keepdim, true); }

Tensor max(const Tensor& input, int64_t dim, bool keepdim) {
    constexpr const char* op = "max";
    const AroundDimension split = checked_around_dimension(op, input, dim, true);
    const int64_t outer = split.outer, size = split.size, inner = split.inner;
    const Shape shape = reduced_shape(input.shape(), dim, keepdim);
    Tensor out = Tensor::empty(shape, input.dtype(), input.device());     // (outer,inner)
    Tensor indices = Tensor::empty(shape, DType::i32, input.device());    // (outer,inner) in [0,size)
    if (out.numel() > 0) {
        if (input.device() == Device::cpu) {
            dispatch_cpu(op, input.dtype(), [&]<typename T>() {
                kernels::cpu::max_over_dimension_forward<T>(out.data<T>(), indices.data<int32_t>(), input.data<T>(),
                                                            outer, size, inner);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
                kernels::cuda::max_over_dimension_forward(out.data<T>(), indices.data<int32_t>(), input.data<T>(),
                                                          outer, size, inner, cuda::compute_stream());
            });
        }
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out},
                [=, saved_indices = indices, output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dinput = context.input_grad(input_target);
                    if (!dinput.defined() || dout.numel() == 0) return;
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::max_over_dimension_backward<T>(dinput.data<T>(), dout.data<T>(),
                                                                         saved_indices.data<int32_t>(), outer, size,
                                                                         inner);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            kernels::cuda::max_over_dimension_backward(dinput.data<T>(), dout.data<T>(),
                                                                       saved_indices.data<int32_t>(), outer, size,
                                                                       inner, cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
