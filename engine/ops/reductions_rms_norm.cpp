// rms_norm over the last dimension (Llama's RMSNorm): saves its input and rstd. A bf16 input gets a bf16
// output, f32 rstd and an f32 weight gradient (mixed precision, as layernorm).
#include <cmath>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/reduction_checks.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

Tensor rms_norm(const Tensor& input, const Tensor& weight, double eps) {
    constexpr const char* op = "rms_norm";
    check_reducible(op, "input", input);
    check_reducible(op, "weight", weight);
    ENGINE_CHECK(input.dim() >= 1, op << ": input " << input.describe() << " has no dimensions");
    const int channels = static_cast<int>(input.size(-1));
    ENGINE_CHECK(channels > 0, op << ": input " << input.describe() << " has no channels to normalise");
    check_shape(op, "weight", weight, {input.size(-1)});
    check_same_device(op, input, weight);
    check_same_dtype(op, input, weight);
    ENGINE_CHECK(std::isfinite(eps) && eps >= 0.0, op << ": eps " << eps << " must be finite and >= 0");
    const int rows = leading_rows(op, input);
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device());         // (N,C)
    Tensor rstd = Tensor::empty({rows}, compute_dtype(input.dtype()), input.device()); // (N)
    if (rows > 0) {
        if (input.device() == Device::cpu) {
            dispatch_cpu(op, input.dtype(), [&]<typename T>() {
                kernels::cpu::rms_norm_forward<T>(out.data<T>(), rstd.data<Compute<T>>(), input.data<T>(),
                                                  weight.data<T>(), rows, channels, eps);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
                kernels::cuda::rms_norm_forward(out.data<T>(), rstd.data<float>(), input.data<T>(), weight.data<T>(),
                                                rows, channels, static_cast<float>(eps), cuda::compute_stream());
            });
        }
    }

    GradTarget input_target(input), weight_target(weight);
    record_node(op, {&input, &weight}, {&out},
                [=, saved_input = input, saved_weight = weight, saved_rstd = rstd,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    // dinput in the input's dtype; dweight is a parameter gradient in compute_dtype (f32 for
                    // bf16). The kernel writes both; one that needs no gradient gets scratch.
                    if (rows == 0) return;
                    Tensor dinput = BackwardContext::gradient_or_scratch(context.input_grad(input_target),
                                                                         input_target, dout.dtype());
                    Tensor dweight = BackwardContext::gradient_or_scratch(context.parameter_grad(weight_target),
                                                                          weight_target, compute_dtype(dout.dtype()));
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::rms_norm_backward<T>(dinput.data<T>(), dweight.data<Compute<T>>(),
                                                               dout.data<T>(), saved_input.data<T>(),
                                                               saved_weight.data<T>(), saved_rstd.data<Compute<T>>(),
                                                               rows, channels);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            const cuda::Scratch<float> partials(
                                kernels::cuda::rms_norm_backward_workspace_count(rows, channels),
                                cuda::compute_stream()); // (row chunks, C)
                            kernels::cuda::rms_norm_backward(dinput.data<T>(), dweight.data<float>(), partials.get(),
                                                             dout.data<T>(), saved_input.data<T>(),
                                                             saved_weight.data<T>(), saved_rstd.data<float>(), rows,
                                                             channels, cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
