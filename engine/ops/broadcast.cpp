// add, sub, mul and div with NumPy broadcasting: shape checks, the layouts, forward, and a backward that sums
// each operand's gradient over the dimensions it was broadcast along. Equal shapes under add take the residual
// kernels, which write both gradients in one pass.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "kernels/common/broadcast_layout.h"

namespace engine {
using namespace detail;
using kernels::BinaryFunction;
namespace {

// The residual stream's a + b of equal shapes. Saves nothing; both inputs receive dout.
Tensor residual_add(const Tensor& a, const Tensor& b) {
    constexpr const char* op = "add";
    const int64_t count = a.numel();
    Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
    if (a.device() == Device::cpu) {
        dispatch_cpu(op, a.dtype(), [&]<typename T>() {
            kernels::cpu::residual_forward<T>(out.data<T>(), a.data<T>(), b.data<T>(), count);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, a.dtype(), [&]<typename T>() {
            kernels::cuda::residual_forward(out.data<T>(), a.data<T>(), b.data<T>(), count, cuda::compute_stream());
        });
    }
    GradTarget a_target(a), b_target(b);
    record_node(op, {&a, &b}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        // An input's first gradient is dout itself: copied into its fresh buffer, where a zero fill and the
        // kernel's addition would write it twice and read it once more. x + x: the second target finds the buffer
        // the first made (for a bf16 leaf, two workspaces that finish_node adds into its f32 buffer), and the
        // kernel adds dout into it, so x receives both contributions.
        // (dout may arrive in another shape of the same elements, as the kernel below reads it: flat.)
        const auto write_first = [&](const GradTarget& target) {
            const BackwardContext::WritableGradient gradient = context.input_grad_to_write(target);
            if (gradient.fresh)
                copy_bytes(gradient.buffer.raw_data(), gradient.buffer.device(), dout.raw_data(), dout.device(), dout.nbytes());
            return gradient;
        };
        const BackwardContext::WritableGradient to_a = write_first(a_target), to_b = write_first(b_target);
        const Tensor da = to_a.fresh ? Tensor() : to_a.buffer, db = to_b.fresh ? Tensor() : to_b.buffer;
        if (!da.defined() && !db.defined()) return;
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::residual_backward<T>(grad_pointer<T>(da), grad_pointer<T>(db), dout.data<T>(), count);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::residual_backward(grad_pointer<T>(da), grad_pointer<T>(db), dout.data<T>(), count,
                                                 cuda::compute_stream());
            });
        }
    });
    return out;
}

// Checks a and b and returns the broadcast output shape, naming the op and both shapes on any mismatch.
Shape checked_broadcast_shape(const char* op, const Tensor& a, const Tensor& b, kernels::BroadcastLayout& layout) {
    check_same_device(op, a, b);
    check_same_dtype(op, a, b);
    ENGINE_CHECK(is_floating(a.dtype()), op << ": expected floating-point tensors, got " << a.describe());
    bool compatible = false;
    const Shape out_shape = kernels::broadcast_shape(a.shape(), b.shape(), compatible);
    ENGINE_CHECK(compatible, op << ": shapes " << shape_string(a.shape()) << " and " << shape_string(b.shape())
                                << " do not broadcast (each pair of right-aligned extents must be equal or 1)");
    ENGINE_CHECK(kernels::make_broadcast_layout(layout, out_shape, a.shape(), b.shape()),
                 op << ": shapes " << shape_string(a.shape()) << " and " << shape_string(b.shape()) << " broadcast over "
                    << "more than " << kernels::max_broadcast_rank << " alternating dimensions");
    return out_shape;
}

// d(operand) += its part of dout; a and b are the saved operands (undefined where the partial reads neither).
void binary_backward_tensors(const char* op, const Tensor& doperand, const Tensor& dout, const Tensor& a,
                             const Tensor& b, const kernels::GradientLayout& gradient, BinaryFunction function) {
    if (dout.device() == Device::cpu) {
        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
            kernels::cpu::binary_backward<T>(doperand.data<T>(), dout.data<T>(), grad_pointer<T>(a), grad_pointer<T>(b),
                                             gradient, function);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
            kernels::cuda::binary_backward(doperand.data<T>(), dout.data<T>(), grad_pointer<T>(a), grad_pointer<T>(b),
                                           gradient, function, cuda::compute_stream());
        });
    }
}

Tensor broadcast_binary(const char* op, const Tensor& a, const Tensor& b, BinaryFunction function) {
    kernels::BroadcastLayout layout;
    const Shape out_shape = checked_broadcast_shape(op, a, b, layout);
    Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
    if (a.device() == Device::cpu) {
        dispatch_cpu(op, a.dtype(), [&]<typename T>() {
            kernels::cpu::binary_forward<T>(out.data<T>(), a.data<T>(), b.data<T>(), layout, function);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, a.dtype(), [&]<typename T>() {
            kernels::cuda::binary_forward(out.data<T>(), a.data<T>(), b.data<T>(), layout, function,
                                          cuda::compute_stream());
        });
    }
    // Save only what the partials read: each operand that requires grad needs its partial's operands.
    bool save_a = false, save_b = false;
    for (int which = 0; which < 2; ++which) {
        if (!(which == 0 ? a : b).requires_grad()) continue;
        save_a = save_a || kernels::binary_partial_reads_a(function, which);
        save_b = save_b || kernels::binary_partial_reads_b(function, which);
    }
    const Tensor saved_a = save_a ? a.detach() : Tensor(), saved_b = save_b ? b.detach() : Tensor();
    const kernels::GradientLayout gradients[2] = {kernels::make_gradient_layout(layout, 0),
                                                   kernels::make_gradient_layout(layout, 1)};
    const GradTarget targets[2] = {GradTarget(a), GradTarget(b)};
    record_node(op, {&a, &b}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        for (int which = 0; which < 2; ++which) {
            Tensor doperand = context.input_grad(targets[which]);
            if (doperand.defined())
                binary_backward_tensors(op, doperand, dout, saved_a, saved_b, gradients[which], function);
        }
    });
    return out;
}

} // namespace

Tensor add(const Tensor& a, const Tensor& b) {
    if (a.shape() == b.shape()) {
        check_same_device("add", a, b);
        check_same_dtype("add", a, b);
        return residual_add(a, b);
    }
    return broadcast_binary("add", a, b, BinaryFunction::add);
}
Tensor sub(const Tensor& a, const Tensor& b) { return broadcast_binary("sub", a, b, BinaryFunction::subtract); }
Tensor mul(const Tensor& a, const Tensor& b) { return broadcast_binary("mul", a, b, BinaryFunction::multiply); }
Tensor div(const Tensor& a, const Tensor& b) { return broadcast_binary("div", a, b, BinaryFunction::divide); }

} // namespace engine
