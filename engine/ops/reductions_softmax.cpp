// softmax and log_softmax over any dimension: each saves its output, from which its backward is exact.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/reduction_checks.h"

namespace engine {
using namespace detail;

namespace {

// The two ops differ only in their kernels; `logarithm` picks log_softmax's.
template <bool logarithm>
Tensor normalise(const char* op, const Tensor& input, int64_t dim) {
    const AroundDimension split = checked_around_dimension(op, input, dim, true);
    const int64_t outer = split.outer, size = split.size, inner = split.inner;
    Tensor out = Tensor::empty(input.shape(), input.dtype(), input.device()); // (outer,size,inner)
    if (input.numel() > 0) {
        if (input.device() == Device::cpu) {
            dispatch_cpu(op, input.dtype(), [&]<typename T>() {
                if constexpr (logarithm)
                    kernels::cpu::log_softmax_forward<T>(out.data<T>(), input.data<T>(), outer, size, inner);
                else
                    kernels::cpu::softmax_forward<T>(out.data<T>(), input.data<T>(), outer, size, inner);
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
                if constexpr (logarithm)
                    kernels::cuda::log_softmax_forward(out.data<T>(), input.data<T>(), outer, size, inner,
                                                       cuda::compute_stream());
                else
                    kernels::cuda::softmax_forward(out.data<T>(), input.data<T>(), outer, size, inner,
                                                   cuda::compute_stream());
            });
        }
    }
    GradTarget input_target(input);
    // The closure holds the output's storage, not the output Tensor, so the tape keeps no reference cycle.
    record_node(op, {&input}, {&out},
                [=, saved_output = out.detach(), output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dinput = context.input_grad(input_target);
                    if (!dinput.defined() || dinput.numel() == 0) return;
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            if constexpr (logarithm)
                                kernels::cpu::log_softmax_backward<T>(dinput.data<T>(), dout.data<T>(),
                                                                      saved_output.data<T>(), outer, size, inner);
                            else
                                kernels::cpu::softmax_backward<T>(dinput.data<T>(), dout.data<T>(),
                                                                  saved_output.data<T>(), outer, size, inner);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            if constexpr (logarithm)
                                kernels::cuda::log_softmax_backward(dinput.data<T>(), dout.data<T>(),
                                                                    saved_output.data<T>(), outer, size, inner,
                                                                    cuda::compute_stream());
                            else
                                kernels::cuda::softmax_backward(dinput.data<T>(), dout.data<T>(),
                                                                saved_output.data<T>(), outer, size, inner,
                                                                cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace

Tensor softmax(const Tensor& input, int64_t dim) { return normalise<false>("softmax", input, dim); }
Tensor log_softmax(const Tensor& input, int64_t dim) { return normalise<true>("log_softmax", input, dim); }

} // namespace engine
