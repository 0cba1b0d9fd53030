// linear_cross_entropy: the streaming LM head. hidden (N,C) · weightᵀ (Vp,C) → cross-entropy over the first V
// columns, a chunk of rows at a time, so that the (N,Vp) logits never exist: each chunk's logits are made, turned
// into the loss and (in place, by the fused classifier's kernel) into their gradient, and used at once for the
// chunk's input gradient and its share of the weight's gradient, then overwritten by the next chunk's.
// No kernel of its own: the GEMMs and the fused classifier kernels on both devices, at row offsets.
#include <algorithm>
#include <limits>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/elementwise.h"
#include "engine/ops.h"
#include "engine/ops/cross_entropy.h"
#include "engine/ops/gemm.h"

namespace engine {
using namespace detail;

namespace {
constexpr const char* op = "linear_cross_entropy";
// The GEMMs' name for the op profiler, which files them with the other GEMMs.
constexpr const char* gemm_op = "linear_cross_entropy_gemm";

// losses[first, first+rows) and the chunk's gradient written over `logits` (rows, columns): the fused
// classifier's kernel, at the chunk's offset in the losses and targets.
void fused_chunk(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t first, int rows,
                 const CheckedTargets& checked, double scale, double factor, int ignore_index) {
    if (logits.device() == Device::cpu) {
        dispatch_cpu(op, logits.dtype(), [&]<typename T>() {
            using C = Compute<T>;
            const C dloss = static_cast<C>(scale) * static_cast<C>(factor); // as cross_entropy_in_place forms it
            kernels::cpu::cross_entropy_fused_forward<T>(losses.data<C>() + first, logits.data<T>(),
                                                         targets.data<int32_t>() + first, dloss, rows,
                                                         checked.vocabulary, checked.columns, ignore_index);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, logits.dtype(), [&]<typename T>() {
            const float dloss = static_cast<float>(scale) * static_cast<float>(factor);
            kernels::cuda::cross_entropy_fused_forward<T>(losses.data<float>() + first, logits.data<T>(),
                                                          targets.data<int32_t>() + first, dloss, rows,
                                                          checked.vocabulary, checked.columns, ignore_index,
                                                          cuda::compute_stream());
        });
    }
}

// The loss alone (no gradient wanted): logits over the V real columns only, the plain cross_entropy kernel.
void loss_chunk(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t first, int rows,
                int vocabulary, int ignore_index) {
    if (logits.device() == Device::cpu) {
        dispatch_cpu(op, logits.dtype(), [&]<typename T>() {
            kernels::cpu::cross_entropy_forward<T>(losses.data<Compute<T>>() + first, logits.data<T>(),
                                                   targets.data<int32_t>() + first, rows, vocabulary, ignore_index);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, logits.dtype(), [&]<typename T>() {
            kernels::cuda::cross_entropy_forward<T>(losses.data<float>() + first, logits.data<T>(),
                                                    targets.data<int32_t>() + first, rows, vocabulary, ignore_index,
                                                    cuda::compute_stream());
        });
    }
}

// dhidden = upstream · dhidden: the fused classifier's rescale (a no-op when the ratio is exactly 1).
void rescale(const Tensor& gradient, const Tensor& dout, double expected) {
    if (gradient.device() == Device::cpu) {
        dispatch_cpu(op, gradient.dtype(), [&]<typename T>() {
            kernels::cpu::cross_entropy_fused_rescale<T>(gradient.data<T>(), dout.data<Compute<T>>(),
                                                         static_cast<Compute<T>>(expected), gradient.numel());
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, gradient.dtype(), [&]<typename T>() {
            kernels::cuda::cross_entropy_fused_rescale<T>(gradient.data<T>(), dout.data<float>(),
                                                          static_cast<float>(expected), gradient.numel(),
                                                          cuda::compute_stream());
        });
    }
}

struct HeadShape {
    int rows = 0;    // N = B·T
    int width = 0;   // C
    int columns = 0; // Vp, the weight's rows
    int chunk = 0;   // rows per chunk, at most N
};

// The chunks in order: logits = hidden[rows]·weightᵀ, loss and gradient in place, then (when asked)
// dhidden[rows] = g·weight and dweight += gᵀ·hidden[rows]. f32 compute for bf16 operands: dweight is the f32
// buffer and the GEMM accumulates into it, chunk after chunk in row order: the same sums on every run.
void run_chunks(const HeadShape& shape, const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                const Tensor& losses, const Tensor& dhidden, const Tensor& dweight, const CheckedTargets& checked,
                double scale, double factor, int ignore_index) {
    Tensor logits = Tensor::empty({shape.chunk, shape.columns}, hidden.dtype(), hidden.device()); // (chunk,Vp)
    for (int first = 0; first < shape.rows; first += shape.chunk) {
        const int rows = std::min(shape.chunk, shape.rows - first);
        const int64_t hidden_offset = int64_t(first) * shape.width;
        gemm_tensors(gemm_op, logits, hidden, weight, rows, shape.columns, shape.width, false, true, 0.0,
                     {.c = 0, .a = hidden_offset, .b = 0});
        fused_chunk(losses, logits, targets, first, rows, checked, scale, factor, ignore_index);
        // dhidden starts zeroed and takes beta 1, as matmul's backward adds into a fresh gradient: with one chunk
        // the two heads give the same bits.
        if (dhidden.defined())
            gemm_tensors(gemm_op, dhidden, logits, weight, rows, shape.width, shape.columns, false, false, 1.0,
                         {.c = hidden_offset, .a = 0, .b = 0});
        if (dweight.defined())
            gemm_tensors(gemm_op, dweight, logits, hidden, shape.columns, shape.width, rows, true, false, 1.0,
                         {.c = 0, .a = 0, .b = hidden_offset});
    }
}

} // namespace

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets, Reduction reduction,
                            int64_t chunk_rows, double expected_output_gradient, int ignore_index, int vocabulary) {
    ENGINE_CHECK(hidden.dim() >= 2 && weight.dim() == 2,
                 op << ": hidden " << hidden.describe() << " and weight " << weight.describe()
                    << " must be (...,C) and (V,C)");
    check_same_device(op, hidden, weight);
    check_same_dtype(op, hidden, weight);
    ENGINE_CHECK(hidden.size(-1) == weight.size(1), op << ": hidden " << shape_string(hidden.shape()) << " and weight "
                                                       << shape_string(weight.shape()) << ": widths differ");
    ENGINE_CHECK(chunk_rows >= 1, op << ": chunk_rows " << chunk_rows << " must be >= 1");
    check_expected_gradient(op, reduction, expected_output_gradient, hidden.dtype());
    HeadShape shape;
    shape.rows = leading_rows(op, hidden);
    shape.width = static_cast<int>(hidden.size(-1));
    ENGINE_CHECK(weight.size(0) <= std::numeric_limits<int>::max(), op << ": weight " << weight.describe() << " has too many rows");
    shape.columns = static_cast<int>(weight.size(0));
    shape.chunk = static_cast<int>(std::min<int64_t>(chunk_rows, std::max(shape.rows, 1)));
    const CheckedTargets checked = detail::check_targets(op, Shape(hidden.shape().begin(), hidden.shape().end() - 1),
                                                         shape.columns, hidden.device(), targets, ignore_index,
                                                         vocabulary);
    const double scale = reduction_scale(reduction, checked.valid_targets);
    check_gradient_factor(op, scale, expected_output_gradient, hidden.dtype());
    Tensor losses = Tensor::empty(checked.leading, compute_dtype(hidden.dtype()), hidden.device()); // (N)

    const bool wants_hidden = grad_enabled() && hidden.requires_grad();
    const bool wants_weight = grad_enabled() && weight.requires_grad();
    if (!wants_hidden && !wants_weight) {
        // Evaluation: the loss only, over the real columns (the first V rows of the weight), chunk by chunk.
        Tensor logits = Tensor::empty({shape.chunk, checked.vocabulary}, hidden.dtype(), hidden.device()); // (chunk,V)
        for (int first = 0; first < shape.rows; first += shape.chunk) {
            const int rows = std::min(shape.chunk, shape.rows - first);
            gemm_tensors(gemm_op, logits, hidden, weight, rows, checked.vocabulary, shape.width, false, true, 0.0,
                         {.c = 0, .a = int64_t(first) * shape.width, .b = 0});
            loss_chunk(losses, logits, targets, first, rows, checked.vocabulary, ignore_index);
        }
        return reduce_losses(losses, reduction, scale);
    }

    // The gradients are made in forward, at the expected upstream gradient: the input's into a buffer the node
    // hands to the walk, the weight's straight into its persistent buffer (a leaf: the parameter, or a bf16
    // working copy whose buffer is its f32 master's), where backward would have added it. A weight that is no
    // leaf gets a buffer of its own, added in backward.
    const GradTarget hidden_target(hidden), weight_target(weight);
    Tensor dhidden = wants_hidden ? Tensor::zeros(hidden.shape(), hidden.dtype(), hidden.device()) : Tensor(); // (N,C)
    Tensor dweight;
    if (wants_weight)
        dweight = weight_target.persistent_grad.defined()
                      ? weight_target.persistent_grad
                      : Tensor::zeros(weight.shape(), compute_dtype(weight.dtype()), weight.device()); // (Vp,C)
    run_chunks(shape, hidden, weight, targets, losses, dhidden, dweight, checked, scale, expected_output_gradient,
               ignore_index);
    Tensor out = reduce_losses(losses, reduction, scale);

    const bool own_weight_gradient = wants_weight && !weight_target.persistent_grad.defined();
    record_node(op, {&hidden, &weight}, {&out},
                [=, saved_hidden = hidden.detach(), saved_weight = weight.detach(), saved_targets = targets,
                 output_id = out.id()](BackwardContext& context) {
                    const Tensor dout = context.output_grad(output_id);
                    // The weight's gradient is already added at the expected upstream gradient. Another upstream
                    // gradient (a caller that promised one and brought another) adds the difference: the chunks
                    // again with the factor (dout - expected), the weight's gradient only. Deciding reads dout on
                    // the host: one 4-byte copy per call on CUDA.
                    // Compared as the rescale kernel compares, in the compute dtype.
                    const bool single = compute_dtype(saved_hidden.dtype()) == DType::f32;
                    const double upstream = dout.item();
                    const double promised = single ? static_cast<float>(expected_output_gradient) : expected_output_gradient;
                    if (dweight.defined() && upstream != promised) {
                        const Tensor scratch = Tensor::empty(checked.leading, compute_dtype(saved_hidden.dtype()),
                                                             saved_hidden.device(), MemoryCategory::workspace);
                        run_chunks(shape, saved_hidden, saved_weight, saved_targets, scratch, Tensor(), dweight,
                                   checked, scale, upstream - promised, ignore_index);
                    }
                    if (own_weight_gradient) accumulate_into(context.parameter_grad(weight_target), dweight);
                    if (dhidden.defined()) {
                        rescale(dhidden, dout, expected_output_gradient);
                        if (!context.adopt_input_grad(hidden_target, dhidden))
                            accumulate_into(context.input_grad(hidden_target), dhidden);
                    }
                });
    return out;
}

} // namespace engine
