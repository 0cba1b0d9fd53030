// cross_entropy: softmax cross-entropy over the last dimension with ignore_index and none/sum/mean
// reductions, as one node. Saves logits and targets; probabilities are recomputed in backward.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/reduce.h"

namespace engine {
using namespace detail;

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction, int ignore_index) {
    constexpr const char* op = "cross_entropy";
    ENGINE_CHECK(logits.dim() >= 2, op << ": logits " << logits.describe() << " must be (...,V)");
    Shape leading(logits.shape().begin(), logits.shape().end() - 1);
    ENGINE_CHECK(targets.dtype() == DType::i32 && targets.shape() == leading,
                 op << ": targets " << targets.describe() << " must be i32 of shape " << shape_string(leading)
                    << " for logits " << shape_string(logits.shape()));
    check_same_device(op, logits, targets);
    const int rows = leading_rows(op, logits);
    const int vocabulary = static_cast<int>(logits.size(-1));
    int64_t valid_targets = 0;
    const std::vector<int32_t> host_targets = targets.to_vector<int32_t>();
    for (size_t index = 0; index < host_targets.size(); ++index) {
        const int32_t target = host_targets[index];
        if (target == ignore_index) continue;
        ENGINE_CHECK(target >= 0 && target < vocabulary,
                     op << ": label " << target << " at flat index " << index << " is outside [0," << vocabulary
                        << ") and is not ignore_index " << ignore_index);
        ++valid_targets;
    }

    Tensor losses = Tensor::empty(leading, logits.dtype(), logits.device()); // (N)
    if (logits.device() == Device::cpu) {
        dispatch_floating(op, logits.dtype(), [&]<typename T>() {
            kernels::cpu::cross_entropy_forward<T>(losses.data<T>(), logits.data<T>(), targets.data<int32_t>(), rows,
                                                   vocabulary, ignore_index);
        });
    } else {
        ENGINE_ON_CUDA(op, logits.dtype(),
                       kernels::cuda::cross_entropy_forward(losses.data<float>(), logits.data<float>(),
                                                            targets.data<int32_t>(), rows, vocabulary, ignore_index,
                                                            cuda::compute_stream()));
    }
    // mean over zero targets is defined as 0 (loss and gradient), never 0/0.
    const double scale = reduction == Reduction::mean ? (valid_targets > 0 ? 1.0 / static_cast<double>(valid_targets) : 0.0)
                                                      : 1.0;
    Tensor out = losses;
    if (reduction != Reduction::none) {
        out = Tensor::empty({1}, logits.dtype(), logits.device());
        sum_tensors(out, losses, scale);
    }

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
                        dispatch_floating(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::cross_entropy_backward<T>(dlogits.data<T>(), dlosses.data<T>(),
                                                                    saved_logits.data<T>(), saved_targets.data<int32_t>(),
                                                                    rows, vocabulary, ignore_index);
                        });
                    } else {
                        ENGINE_ON_CUDA(op, dout.dtype(),
                                       kernels::cuda::cross_entropy_backward(
                                           dlogits.data<float>(), dlosses.data<float>(), saved_logits.data<float>(),
                                           saved_targets.data<int32_t>(), rows, vocabulary, ignore_index,
                                           cuda::compute_stream()));
                    }
                });
    return out;
}

} // namespace engine
