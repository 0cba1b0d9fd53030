// sum and multiply, and the scaled-sum helpers that cross_entropy's reductions share.
#include "engine/ops/reduce.h"

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/elementwise.h"
#include "engine/ops.h"
#if ENGINE_HAS_CUDA
#include "engine/cuda/scratch.h"
#endif

namespace engine {
using namespace detail;

void sum_tensors(const Tensor& out, const Tensor& input, double scale) {
    if (out.device() == Device::cpu) {
        dispatch_floating("sum", out.dtype(), [&]<typename T>() {
            kernels::cpu::sum_forward<T>(out.data<T>(), input.data<T>(), input.numel(), static_cast<T>(scale));
        });
    } else {
        ENGINE_ON_CUDA("sum", out.dtype(), {
            const cuda::Scratch<double> partials(kernels::cuda::reduction_workspace_count(input.numel()),
                                                 cuda::compute_stream());
            kernels::cuda::sum_forward(out.data<float>(), partials.get(), input.data<float>(), input.numel(),
                                       static_cast<float>(scale), cuda::compute_stream());
        });
    }
}

void sum_backward_tensors(const Tensor& dinput, const Tensor& dout, double scale) {
    if (dinput.device() == Device::cpu) {
        dispatch_floating("sum", dinput.dtype(), [&]<typename T>() {
            kernels::cpu::sum_backward<T>(dinput.data<T>(), dout.data<T>(), dinput.numel(), static_cast<T>(scale));
        });
    } else {
        ENGINE_ON_CUDA("sum", dinput.dtype(),
                       kernels::cuda::sum_backward(dinput.data<float>(), dout.data<float>(), dinput.numel(),
                                                   static_cast<float>(scale), cuda::compute_stream()));
    }
}

Tensor sum(const Tensor& input) {
    Tensor out = Tensor::empty({1}, input.dtype(), input.device());
    sum_tensors(out, input, 1.0);
    GradTarget input_target(input);
    record_node("sum", {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        sum_backward_tensors(context.input_grad(input_target), context.output_grad(output_id), 1.0);
    });
    return out;
}

Tensor multiply(const Tensor& input, double factor) {
    Tensor out = Tensor::zeros(input.shape(), input.dtype(), input.device());
    accumulate_into(out, input, factor);
    GradTarget input_target(input);
    record_node("multiply", {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        accumulate_into(context.input_grad(input_target), context.output_grad(output_id), factor);
    });
    return out;
}

} // namespace engine
