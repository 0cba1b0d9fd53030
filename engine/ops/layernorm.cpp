// layernorm over the last dimension (eps 1e-5): saves its input, mean and rstd for backward. A bf16 input gets
// a bf16 output but f32 statistics (mean, rstd) and f32 weight/bias gradients (mixed precision).
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

Tensor layernorm(const Tensor& input, const Tensor& weight, const Tensor& bias) {
    constexpr const char* op = "layernorm";
    ENGINE_CHECK(input.dim() >= 1, op << ": input " << input.describe() << " has no dimensions");
    const int channels = static_cast<int>(input.size(-1));
    ENGINE_CHECK(channels > 0, op << ": input " << input.describe() << " has no channels to normalise");
    check_shape(op, "weight", weight, {channels});
    check_shape(op, "bias", bias, {channels});
    check_same_device(op, input, weight);
    check_same_device(op, input, bias);
    check_same_dtype(op, input, weight);
    check_same_dtype(op, input, bias);
    const int rows = leading_rows(op, input);
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device()); // (N,C)
    const DType statistics_dtype = compute_dtype(input.dtype());
    Tensor mean = Tensor::empty({rows}, statistics_dtype, input.device()); // (N)
    Tensor rstd = Tensor::empty({rows}, statistics_dtype, input.device()); // (N)
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::layernorm_forward<T>(out.data<T>(), mean.data<Compute<T>>(), rstd.data<Compute<T>>(),
                                               input.data<T>(), weight.data<T>(), bias.data<T>(), rows, channels);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::layernorm_forward(out.data<T>(), mean.data<float>(), rstd.data<float>(), input.data<T>(),
                                             weight.data<T>(), bias.data<T>(), rows, channels, cuda::compute_stream());
        });
    }

    GradTarget input_target(input), weight_target(weight), bias_target(bias);
    record_node(op, {&input, &weight, &bias}, {&out},
                [=, saved_input = input, saved_weight = weight, saved_mean = mean, saved_rstd = rstd,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    // dinput in the input's dtype; dweight and dbias are parameter gradients, in compute_dtype
                    // (f32 for bf16). The kernel writes all three; one that needs no gradient gets scratch.
                    const DType grad_dtype = compute_dtype(dout.dtype());
                    Tensor dinput = BackwardContext::gradient_or_scratch(context.input_grad(input_target),
                                                                         input_target, dout.dtype());
                    Tensor dweight = BackwardContext::gradient_or_scratch(context.parameter_grad(weight_target),
                                                                          weight_target, grad_dtype);
                    Tensor dbias = BackwardContext::gradient_or_scratch(context.parameter_grad(bias_target),
                                                                        bias_target, grad_dtype);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::layernorm_backward<T>(
                                dinput.data<T>(), dweight.data<Compute<T>>(), dbias.data<Compute<T>>(), dout.data<T>(),
                                saved_input.data<T>(), saved_weight.data<T>(), saved_mean.data<Compute<T>>(),
                                saved_rstd.data<Compute<T>>(), rows, channels);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            const cuda::Scratch<float> partials(
                                kernels::cuda::layernorm_backward_workspace_count(rows, channels),
                                cuda::compute_stream()); // (row chunks, 2, C)
                            kernels::cuda::layernorm_backward(
                                dinput.data<T>(), dweight.data<float>(), dbias.data<float>(), partials.get(),
                                dout.data<T>(), saved_input.data<T>(), saved_weight.data<T>(),
                                saved_mean.data<float>(), saved_rstd.data<float>(), rows, channels,
                                cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
