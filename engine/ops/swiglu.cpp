// swiglu: silu(gate) * up in one pass (Llama's MLP activation); saves gate and up for its backward.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;

Tensor swiglu(const Tensor& gate, const Tensor& up) {
    constexpr const char* op = "swiglu";
    ENGINE_CHECK(gate.shape() == up.shape(), op << ": gate " << gate.describe() << " and up " << up.describe()
                                                << " must have the same shape");
    check_same_device(op, gate, up);
    check_same_dtype(op, gate, up);
    ENGINE_CHECK(is_floating(gate.dtype()), op << ": gate " << gate.describe() << " must be f32, f64 or bf16");
    const int64_t count = gate.numel();

    Tensor out = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
    if (gate.device() == Device::cpu) {
        dispatch_cpu(op, gate.dtype(), [&]<typename T>() {
            kernels::cpu::swiglu_forward<T>(out.data<T>(), gate.data<T>(), up.data<T>(), count);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, gate.dtype(), [&]<typename T>() {
            kernels::cuda::swiglu_forward(out.data<T>(), gate.data<T>(), up.data<T>(), count, cuda::compute_stream());
        });
    }

    // Both partials read both inputs (dgate: up and silu'(gate); dup: silu(gate)), so both are saved.
    GradTarget gate_target(gate), up_target(up);
    record_node(op, {&gate, &up}, {&out},
                [=, saved_gate = gate.detach(), saved_up = up.detach(),
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    // swiglu(x, x): both targets get the one buffer and the kernel adds both terms through it.
                    Tensor dgate = context.input_grad(gate_target);
                    Tensor dup = context.input_grad(up_target);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::swiglu_backward<T>(grad_pointer<T>(dgate), grad_pointer<T>(dup),
                                                             dout.data<T>(), saved_gate.data<T>(), saved_up.data<T>(),
                                                             count);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            kernels::cuda::swiglu_backward(grad_pointer<T>(dgate), grad_pointer<T>(dup),
                                                           dout.data<T>(), saved_gate.data<T>(), saved_up.data<T>(),
                                                           count, cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
