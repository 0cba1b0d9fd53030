// add: the residual stream's a + b. Saves nothing; both inputs receive dout.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;

Tensor add(const Tensor& a, const Tensor& b) {
    constexpr const char* op = "add";
    ENGINE_CHECK(a.shape() == b.shape(), op << ": shapes " << shape_string(a.shape()) << " and "
                                            << shape_string(b.shape()) << " differ");
    check_same_device(op, a, b);
    check_same_dtype(op, a, b);
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
        Tensor da = context.input_grad(a_target);
        // x + x: both contributions land in one buffer, so ask for it once and let the kernel add twice.
        Tensor db = context.input_grad(b_target);
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

} // namespace engine
