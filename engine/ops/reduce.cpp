// sum and multiply, and the scaled-sum helpers that cross_entropy's reductions share.
#include "engine/ops/reduce.h"

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/elementwise.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

// Dispatched on the input's (storage) dtype; the scalar side is Compute<T>.
void sum_tensors(const Tensor& out, const Tensor& input, double scale) {
    ENGINE_CHECK(out.dtype() == compute_dtype(input.dtype()),
                 "sum: output " << out.describe() << " for " << input.describe() << " must be "
                                << dtype_name(compute_dtype(input.dtype())));
    if (out.device() == Device::cpu) {
        dispatch_cpu("sum", input.dtype(), [&]<typename T>() {
            kernels::cpu::sum_forward<T>(out.data<Compute<T>>(), input.data<T>(), input.numel(),
                                         static_cast<Compute<T>>(scale));
        });
    } else {
        ENGINE_DISPATCH_CUDA("sum", input.dtype(), [&]<typename T>() {
            const cuda::Scratch<double> partials(kernels::cuda::reduction_workspace_count(input.numel()),
                                                 cuda::compute_stream());
            kernels::cuda::sum_forward(out.data<float>(), partials.get(), input.data<T>(), input.numel(),
                                       static_cast<float>(scale), cuda::compute_stream());
        });
    }
}

void sum_backward_tensors(const Tensor& dinput, const Tensor& dout, double scale) {
    ENGINE_CHECK(dout.dtype() == compute_dtype(dinput.dtype()),
                 "sum: gradient " << dout.describe() << " for " << dinput.describe() << " must be "
                                  << dtype_name(compute_dtype(dinput.dtype())));
    if (dinput.device() == Device::cpu) {
        dispatch_cpu("sum", dinput.dtype(), [&]<typename T>() {
            kernels::cpu::sum_backward<T>(dinput.data<T>(), dout.data<Compute<T>>(), dinput.numel(),
                                          static_cast<Compute<T>>(scale));
        });
    } else {
        ENGINE_DISPATCH_CUDA("sum", dinput.dtype(), [&]<typename T>() {
            kernels::cuda::sum_backward(dinput.data<T>(), dout.data<float>(), dinput.numel(), static_cast<float>(scale),
                                        cuda::compute_stream());
        });
    }
}

Tensor sum(const Tensor& input) {
    Tensor out = Tensor::empty({1}, compute_dtype(input.dtype()), input.device()); // (1)
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
