// gelu (tanh approximation, as GPT-2): saves its input.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;

Tensor gelu(const Tensor& input) {
    constexpr const char* op = "gelu";
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());
    const int64_t count = input.numel();
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::gelu_forward<T>(out.data<T>(), input.data<T>(), count);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::gelu_forward(out.data<T>(), input.data<T>(), count, cuda::compute_stream());
        });
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, saved_input = input, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        // Written, not added, when this is the input's first gradient: no zero fill, no read of zeros.
        const BackwardContext::WritableGradient dinput = context.input_grad_to_write(input_target);
        if (!dinput.buffer.defined()) return;
        const bool accumulate = !dinput.fresh;
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::gelu_backward<T>(dinput.buffer.data<T>(), dout.data<T>(), saved_input.data<T>(), count,
                                               accumulate);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::gelu_backward(dinput.buffer.data<T>(), dout.data<T>(), saved_input.data<T>(), count,
                                             accumulate, cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace engine
