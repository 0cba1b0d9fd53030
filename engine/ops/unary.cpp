// relu, silu, tanh, sigmoid, exp and log: one forward, one backward, over the shared formulas of
// kernels/common/pointwise_functions.h.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;
using kernels::UnaryFunction;
namespace {

void unary_forward_tensors(const char* op, const Tensor& out, const Tensor& input, UnaryFunction function) {
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::unary_forward<T>(out.data<T>(), input.data<T>(), input.numel(), function);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::unary_forward(out.data<T>(), input.data<T>(), input.numel(), function,
                                         cuda::compute_stream());
        });
    }
}

// The op: out = f(input); backward dinput += f'(saved) · dout, saved being the input or the output.
Tensor unary(const char* op, const Tensor& input, UnaryFunction function) {
    ENGINE_CHECK(is_floating(input.dtype()),
                 op << ": expected a floating-point tensor, got " << input.describe());
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());
    unary_forward_tensors(op, out, input, function);
    // The saved tensor is a detached handle: saving the output itself would keep its autograd identity alive.
    const Tensor saved = kernels::unary_backward_reads_output(function) ? out.detach() : input.detach();
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        Tensor dinput = context.input_grad(input_target);
        const int64_t count = dout.numel();
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::unary_backward<T>(dinput.data<T>(), dout.data<T>(), saved.data<T>(), count, function);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::unary_backward(dinput.data<T>(), dout.data<T>(), saved.data<T>(), count, function,
                                              cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace

Tensor relu(const Tensor& input) { return unary("relu", input, UnaryFunction::relu); }
Tensor silu(const Tensor& input) { return unary("silu", input, UnaryFunction::silu); }
Tensor tanh(const Tensor& input) { return unary("tanh", input, UnaryFunction::tanh); }
Tensor sigmoid(const Tensor& input) { return unary("sigmoid", input, UnaryFunction::sigmoid); }
Tensor exp(const Tensor& input) { return unary("exp", input, UnaryFunction::exp); }
Tensor log(const Tensor& input) { return unary("log", input, UnaryFunction::log); }

} // namespace engine
