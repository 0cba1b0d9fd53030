// layernorm over the last dimension (eps 1e-5): saves its input, mean and rstd for backward.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#if ENGINE_HAS_CUDA
#include "engine/cuda/scratch.h"
#endif

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
    Tensor mean = Tensor::empty({rows}, input.dtype(), input.device());       // (N)
    Tensor rstd = Tensor::empty({rows}, input.dtype(), input.device());       // (N)
    if (input.device() == Device::cpu) {
        dispatch_floating(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::layernorm_forward<T>(out.data<T>(), mean.data<T>(), rstd.data<T>(), input.data<T>(),
                                               weight.data<T>(), bias.data<T>(), rows, channels);
        });
    } else {
        ENGINE_ON_CUDA(op, input.dtype(),
                       kernels::cuda::layernorm_forward(out.data<float>(), mean.data<float>(), rstd.data<float>(),
                                                        input.data<float>(), weight.data<float>(), bias.data<float>(),
                                                        rows, channels, cuda::compute_stream()));
    }

    GradTarget input_target(input), weight_target(weight), bias_target(bias);
    record_node(op, {&input, &weight, &bias}, {&out},
                [=, saved_input = input, saved_weight = weight, saved_mean = mean, saved_rstd = rstd,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    auto grad_or_scratch = [&](const GradTarget& target) {
                        Tensor gradient = context.input_grad(target);
                        return gradient.defined()
                                   ? gradient
                                   : Tensor::zeros(target.shape, dout.dtype(), dout.device(), MemoryCategory::workspace);
                    };
                    Tensor dinput = grad_or_scratch(input_target);
                    Tensor dweight = grad_or_scratch(weight_target);
                    Tensor dbias = grad_or_scratch(bias_target);
                    if (dout.device() == Device::cpu) {
                        dispatch_floating(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::layernorm_backward<T>(dinput.data<T>(), dweight.data<T>(), dbias.data<T>(),
                                                                dout.data<T>(), saved_input.data<T>(), saved_weight.data<T>(),
                                                                saved_mean.data<T>(), saved_rstd.data<T>(), rows, channels);
                        });
                    } else {
                        ENGINE_ON_CUDA(op, dout.dtype(), {
                            const cuda::Scratch<float> partials(
                                kernels::cuda::layernorm_backward_workspace_count(rows, channels),
                                cuda::compute_stream()); // (row chunks, 2, C)
                            kernels::cuda::layernorm_backward(
                                dinput.data<float>(), dweight.data<float>(), dbias.data<float>(), partials.get(),
                                dout.data<float>(), saved_input.data<float>(), saved_weight.data<float>(),
                                saved_mean.data<float>(), saved_rstd.data<float>(), rows, channels,
                                cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
