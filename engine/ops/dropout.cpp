// dropout: the mask is a pure function of (seed, offset), so backward and checkpoint recompute redraw it
// instead of storing it. Saves nothing but the stream position.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/random.h"

namespace engine {
using namespace detail;

Tensor dropout(const Tensor& input, float p, bool training) {
    constexpr const char* op = "dropout";
    ENGINE_CHECK(p >= 0.0f && p < 1.0f, op << ": probability " << p << " is outside [0,1)");
    if (!training || p == 0.0f) return input;
    ENGINE_CHECK(input.dtype() != DType::i32, op << ": input " << input.describe() << " is not floating-point");
    const int64_t count = input.numel();
    const uint64_t seed = rng_state().seed;
    const uint64_t offset = advance_rng(static_cast<uint64_t>(count));
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::dropout_forward<T>(out.data<T>(), input.data<T>(), p, seed, offset, count);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::dropout_forward(out.data<T>(), input.data<T>(), p, seed, offset, count,
                                           cuda::compute_stream());
        });
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        Tensor dinput = context.input_grad(input_target);
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::dropout_backward<T>(dinput.data<T>(), dout.data<T>(), p, seed, offset, count);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::dropout_backward(dinput.data<T>(), dout.data<T>(), p, seed, offset, count,
                                                cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace engine
