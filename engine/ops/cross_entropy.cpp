// cross_entropy: softmax cross-entropy over the last dimension with ignore_index and none/sum/mean
// reductions, as one node. Saves logits and targets; probabilities are recomputed in backward.
// cross_entropy_in_place: the fused classifier, whose forward also writes the gradient over the logits.
// bf16 logits: the losses (and so the loss) are f32, computed in full precision; the gradient is bf16.
#include <cmath>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/elementwise.h"
#include "engine/ops.h"
#include "engine/ops/cross_entropy.h"
#include "engine/ops/reduce.h"

namespace engine {
using namespace detail;

namespace detail {

CheckedTargets check_targets(const char* op, const Shape& leading, int columns, Device device, const Tensor& targets,
                             int ignore_index, int vocabulary) {
    CheckedTargets checked;
    checked.leading = leading;
    ENGINE_CHECK(targets.dtype() == DType::i32 && targets.shape() == checked.leading,
                 op << ": targets " << targets.describe() << " must be i32 of shape " << shape_string(checked.leading));
    ENGINE_CHECK(targets.device() == device, op << ": targets " << targets.describe() << " are on "
                                                << device_name(targets.device()) << ", not " << device_name(device));
    checked.rows = static_cast<int>(shape_numel(leading));
    checked.columns = columns;
    ENGINE_CHECK(vocabulary >= 0 && vocabulary <= checked.columns,
                 op << ": vocabulary " << vocabulary << " for " << checked.columns << " columns");
    checked.vocabulary = vocabulary > 0 ? vocabulary : checked.columns;
    const std::vector<int32_t> host_targets = targets.to_vector<int32_t>();
    for (size_t index = 0; index < host_targets.size(); ++index) {
        const int32_t target = host_targets[index];
        if (target == ignore_index) continue;
        ENGINE_CHECK(target >= 0 && target < checked.vocabulary,
                     op << ": label " << target << " at flat index " << index << " is outside [0," << checked.vocabulary
                        << ") and is not ignore_index " << ignore_index);
        ++checked.valid_targets;
    }
    return checked;
}

double reduction_scale(Reduction reduction, int64_t valid_targets) {
    if (reduction != Reduction::mean) return 1.0;
    return valid_targets > 0 ? 1.0 / static_cast<double>(valid_targets) : 0.0;
}

Tensor reduce_losses(const Tensor& losses, Reduction reduction, double scale) {
    if (reduction == Reduction::none) return losses;
    Tensor out = Tensor::empty({1}, losses.dtype(), losses.device());
    sum_tensors(out, losses, scale);
    return out;
}

void check_expected_gradient(const char* op, Reduction reduction, double expected_output_gradient, DType dtype) {
    ENGINE_CHECK(reduction != Reduction::none,
                 op << ": reduction none has a gradient per row, not one expected scalar; use cross_entropy");
    ENGINE_CHECK(std::isfinite(expected_output_gradient) && expected_output_gradient != 0.0,
                 op << ": expected_output_gradient " << expected_output_gradient
                    << " must be finite and non-zero (backward divides by it)");
    const bool float_factor = dtype == DType::f32 || dtype == DType::bf16; // f32 compute
    ENGINE_CHECK(!float_factor || std::isnormal(static_cast<float>(expected_output_gradient)),
                 op << ": expected_output_gradient " << expected_output_gradient << " is no normal float for "
                    << dtype_name(dtype) << " logits");
}

void check_gradient_factor(const char* op, double scale, double expected_output_gradient, DType dtype) {
    // The factor the kernel writes with must itself be a normal float, or the gradient loses its precision for
    // good (a later rescale cannot bring it back). Zero is fine: a mean over no target has a zero gradient.
    const bool float_factor = dtype == DType::f32 || dtype == DType::bf16;
    ENGINE_CHECK(scale == 0.0 || !float_factor ||
                     std::isnormal(static_cast<float>(scale) * static_cast<float>(expected_output_gradient)),
                 op << ": the gradient factor " << scale << " x " << expected_output_gradient
                    << " underflows float for " << dtype_name(dtype) << " logits");
}

} // namespace detail

namespace {

// Shapes, dtypes, devices, and every label in [0,V) or ignore_index, read from the host copy of the targets.
// vocabulary 0: every column is a class.
CheckedTargets check_targets(const char* op, const Tensor& logits, const Tensor& targets, int ignore_index,
                             int vocabulary = 0) {
    ENGINE_CHECK(logits.dim() >= 2, op << ": logits " << logits.describe() << " must be (...,V)");
    check_same_device(op, logits, targets);
    leading_rows(op, logits);
    return detail::check_targets(op, Shape(logits.shape().begin(), logits.shape().end() - 1),
                                 static_cast<int>(logits.size(-1)), logits.device(), targets, ignore_index, vocabulary);
}

void losses_forward(const char* op, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                    const CheckedTargets& checked, int ignore_index) {
    if (logits.device() == Device::cpu) {
        dispatch_cpu(op, logits.dtype(), [&]<typename T>() {
            kernels::cpu::cross_entropy_forward<T>(losses.data<Compute<T>>(), logits.data<T>(), targets.data<int32_t>(),
                                                   checked.rows, checked.vocabulary, ignore_index);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, logits.dtype(), [&]<typename T>() {
            kernels::cuda::cross_entropy_forward<T>(losses.data<float>(), logits.data<T>(), targets.data<int32_t>(),
                                                    checked.rows, checked.vocabulary, ignore_index,
                                                    cuda::compute_stream());
        });
    }
}

} // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, int ignore_index) {
    constexpr const char* op = "cross_entropy";
    const CheckedTargets checked = check_targets(op, logits, targets, ignore_index);
    const Shape leading = checked.leading;
    const int rows = checked.rows, vocabulary = checked.vocabulary;
    Tensor losses = Tensor::empty(leading, compute_dtype(logits.dtype()), logits.device()); // (N)
    losses_forward(op, losses, logits, targets, checked, ignore_index);
    const double scale = reduction_scale(reduction, checked.valid_targets);
    Tensor out = reduce_losses(losses, reduction, scale);

    GradTarget logits_target(logits);
    record_node(op, {&logits}, {&out},
                [=, saved_logits = logits, saved_targets = targets, output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dlogits = context.input_grad(logits_target);
                    Tensor dlosses = dout; // (N)
                    if (reduction != Reduction::none) {
                        dlosses = Tensor::zeros(leading, dout.dtype(), dout.device(), MemoryCategory::workspace);
                        sum_backward_tensors(dlosses, dout, scale);
                    }
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, saved_logits.dtype(), [&]<typename T>() {
                            kernels::cpu::cross_entropy_backward<T>(dlogits.data<T>(), dlosses.data<Compute<T>>(),
                                                                    saved_logits.data<T>(), saved_targets.data<int32_t>(),
                                                                    rows, vocabulary, ignore_index);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, saved_logits.dtype(), [&]<typename T>() {
                            kernels::cuda::cross_entropy_backward<T>(dlogits.data<T>(), dlosses.data<float>(),
                                                                     saved_logits.data<T>(),
                                                                     saved_targets.data<int32_t>(), rows, vocabulary,
                                                                     ignore_index, cuda::compute_stream());
                        });
                    }
                });
    return out;
}

// Forward writes g = reduction_scale · expected · (softmax − onehot) over the logits in the same kernel as
// the loss (design (i) of issue 10, llm.c's fused classifier). Backward then owns a finished gradient: it
// corrects it by dout / expected on the device only when backward brings another upstream gradient (a
// kernel that returns at once when the ratio is exactly 1, so the usual step costs no pass and no host
// synchronisation), and hands the storage to the walk as the logits' gradient. The alternative, saving a
// per-row logsumexp and writing dout · (softmax − onehot) in backward, reads the logits twice per step
// instead of once.
Tensor cross_entropy_in_place(const Tensor& logits, const Tensor& targets, Reduction reduction,
                              double expected_output_gradient, int ignore_index, int vocabulary) {
    constexpr const char* op = "cross_entropy_in_place";
    check_expected_gradient(op, reduction, expected_output_gradient, logits.dtype());
    const CheckedTargets checked = check_targets(op, logits, targets, ignore_index, vocabulary);
    const double scale = reduction_scale(reduction, checked.valid_targets);
    check_gradient_factor(op, scale, expected_output_gradient, logits.dtype());
    Tensor losses = Tensor::empty(checked.leading, compute_dtype(logits.dtype()), logits.device()); // (N)
    // Without a node to hand the gradient to, the logits stay intact: this is then plain cross_entropy (over a
    // copy of the real columns when padded: a rare path, evaluation goes through the model's (…,V) logits).
    if (!grad_enabled() || !logits.requires_grad()) {
        const Tensor classes = checked.vocabulary == checked.columns ? logits : first_columns(logits, checked.vocabulary);
        losses_forward(op, losses, classes, targets, checked, ignore_index);
        return reduce_losses(losses, reduction, scale);
    }
    if (logits.device() == Device::cpu) {
        dispatch_cpu(op, logits.dtype(), [&]<typename T>() {
            // C(scale) · C(expected), as cross_entropy's backward forms C(scale) · dout (C the compute type):
            // with dout equal to expected the two paths give bitwise the same gradient.
            using C = Compute<T>;
            const C dloss = static_cast<C>(scale) * static_cast<C>(expected_output_gradient);
            kernels::cpu::cross_entropy_fused_forward<T>(losses.data<C>(), logits.data<T>(), targets.data<int32_t>(),
                                                         dloss, checked.rows, checked.vocabulary, checked.columns,
                                                         ignore_index);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, logits.dtype(), [&]<typename T>() {
            const float dloss = static_cast<float>(scale) * static_cast<float>(expected_output_gradient);
            kernels::cuda::cross_entropy_fused_forward<T>(losses.data<float>(), logits.data<T>(),
                                                          targets.data<int32_t>(), dloss, checked.rows,
                                                          checked.vocabulary, checked.columns, ignore_index,
                                                          cuda::compute_stream());
        });
    }
    Tensor out = reduce_losses(losses, reduction, scale);

    GradTarget logits_target(logits);
    // The node keeps the logits' storage alive as the gradient it will hand over (no other saved tensor).
    record_node(op, {&logits}, {&out},
                [=, gradient = logits.detach(), output_id = out.id()](BackwardContext& context) {
                    const Tensor dout = context.output_grad(output_id);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, gradient.dtype(), [&]<typename T>() {
                            kernels::cpu::cross_entropy_fused_rescale<T>(
                                gradient.data<T>(), dout.data<Compute<T>>(),
                                static_cast<Compute<T>>(expected_output_gradient), gradient.numel());
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, gradient.dtype(), [&]<typename T>() {
                            kernels::cuda::cross_entropy_fused_rescale<T>(gradient.data<T>(), dout.data<float>(),
                                                                          static_cast<float>(expected_output_gradient),
                                                                          gradient.numel(), cuda::compute_stream());
                        });
                    }
                    // Another consumer of the logits got its gradient in first (or they are a leaf): add to it.
                    if (!context.adopt_input_grad(logits_target, gradient))
                        accumulate_into(context.input_grad(logits_target), gradient);
                });
    return out;
}

} // namespace engine
