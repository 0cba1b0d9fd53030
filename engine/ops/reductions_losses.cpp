// mse_loss: (input - target)^2, elementwise or summed / averaged. Saves input and target.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/reduction_checks.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
    constexpr const char* op = "mse_loss";
    check_reducible(op, "input", input);
    check_reducible(op, "target", target);
    ENGINE_CHECK(input.shape() == target.shape(), op << ": input " << input.describe() << " and target "
                                                      << target.describe() << " must have the same shape");
    check_same_dtype(op, input, target);
    check_same_device(op, input, target);
    ENGINE_CHECK(reduction == Reduction::none || reduction == Reduction::sum || reduction == Reduction::mean,
                 op << ": unknown reduction " << static_cast<int>(reduction));
    const int64_t count = input.numel();
    ENGINE_CHECK(count > 0, op << ": input " << input.describe() << " is empty");
    const bool elementwise = reduction == Reduction::none;
    const double scale = reduction == Reduction::mean ? 1.0 / static_cast<double>(count) : 1.0;
    Tensor out = elementwise ? Tensor::empty(input.shape(), input.dtype(), input.device())
                             : Tensor::empty({1}, compute_dtype(input.dtype()), input.device());
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            if (elementwise)
                kernels::cpu::squared_error_forward<T>(out.data<T>(), input.data<T>(), target.data<T>(), count);
            else
                kernels::cpu::mse_loss_forward<T>(out.data<Compute<T>>(), input.data<T>(), target.data<T>(), count,
                                                  static_cast<Compute<T>>(scale));
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            if (elementwise) {
                kernels::cuda::squared_error_forward(out.data<T>(), input.data<T>(), target.data<T>(), count,
                                                     cuda::compute_stream());
            } else {
                const cuda::Scratch<float> squares(static_cast<size_t>(count), cuda::compute_stream()); // (N)
                const cuda::Scratch<double> partials(kernels::cuda::reduction_workspace_count(count),
                                                     cuda::compute_stream());
                kernels::cuda::mse_loss_forward(out.data<float>(), squares.get(), partials.get(), input.data<T>(),
                                                target.data<T>(), count, static_cast<float>(scale),
                                                cuda::compute_stream());
            }
        });
    }
    GradTarget input_target(input), target_target(target);
    record_node(op, {&input, &target}, {&out},
                [=, saved_input = input, saved_target = target, output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dinput = context.input_grad(input_target);
                    Tensor dtarget = context.input_grad(target_target);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, saved_input.dtype(), [&]<typename T>() {
                            if (elementwise)
                                kernels::cpu::squared_error_backward<T>(grad_pointer<T>(dinput), grad_pointer<T>(dtarget),
                                                                        dout.data<T>(), saved_input.data<T>(),
                                                                        saved_target.data<T>(), count);
                            else
                                kernels::cpu::mse_loss_backward<T>(grad_pointer<T>(dinput), grad_pointer<T>(dtarget),
                                                                   dout.data<Compute<T>>(), saved_input.data<T>(),
                                                                   saved_target.data<T>(), count,
                                                                   static_cast<Compute<T>>(scale));
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, saved_input.dtype(), [&]<typename T>() {
                            if (elementwise)
                                kernels::cuda::squared_error_backward(grad_pointer<T>(dinput), grad_pointer<T>(dtarget),
                                                                      dout.data<T>(), saved_input.data<T>(),
                                                                      saved_target.data<T>(), count,
                                                                      cuda::compute_stream());
                            else
                                kernels::cuda::mse_loss_backward(grad_pointer<T>(dinput), grad_pointer<T>(dtarget),
                                                                 dout.data<float>(), saved_input.data<T>(),
                                                                 saved_target.data<T>(), count,
                                                                 static_cast<float>(scale), cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
