// The analytic memory model of a GPT training step: walks the forward and backward in order, adding what
// each op allocates and saves (engine/ops/*.cpp) and keeping the high-water marks. See docs/MEMORY.md.
#include "planner/memory_model.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace engine::planner {

using checkpoint::CheckpointPolicy;
using checkpoint::Segment;
using checkpoint::plan_segments;
namespace {

// The sizes every term is built from, in bytes.
struct Sizes {
    size_t stream = 0;    // A: one residual-stream tensor (B,T,C)
    size_t row_stat = 0;  // R: one value per row (B,T), a layernorm mean or rstd, the per-token losses
    size_t logsumexp = 0; // H: attention's (B,NH,T)
    size_t logits = 0;    // (B,T,V)
    size_t scalar = 0;    // a (1) tensor: the loss
};

// One block's saved set under grad mode, its input included (ln_1 saves it): input, ln_1 out, qkv (3),
// attention out, after-attention residual, ln_2 out, c_fc out (4), gelu out (4) = 16 A; two layernorms'
// mean and rstd = 4 R; attention's logsumexp = H. Dropout and add save nothing.
size_t block_saved(const Sizes& sizes) { return 16 * sizes.stream + 4 * sizes.row_stat + sizes.logsumexp; }

// Beyond the saved set, the block's last moments hold two more (B,T,C): the MLP's c_proj output and its
// dropout output (or, at the final add, the dropout output and the block output).
size_t block_transient(const Sizes& sizes) { return 2 * sizes.stream; }

// A block under no-grad saves nothing, but C++ keeps an expression's temporaries until it ends, so the
// MLP line holds the after-attention residual, ln_2 out, c_fc out (4), gelu out (4), c_proj out and the
// dropout output at once: 12 A (11 A when dropout is off and returns its input).
size_t no_grad_block_peak(const Sizes& sizes, bool dropout_active) {
    return (dropout_active ? 12 : 11) * sizes.stream;
}

std::string block_range(const Segment& segment) {
    std::ostringstream text;
    text << "block" << (segment.layer_count > 1 ? "s " : " ") << segment.first_layer + 1;
    if (segment.layer_count > 1) text << "-" << segment.first_layer + segment.layer_count;
    return text.str();
}

} // namespace

// The parameters' element count with wte's rows counted as `vocabulary_rows`: vocab_size gives the real
// count (what the optimizer keeps moments for), padded_vocab_size() the stored one (wte's allocation and its
// gradient buffer hold the zero padding rows too).
size_t parameter_count(const nn::GPTConfig& config, int vocabulary_rows) {
    const size_t width = static_cast<size_t>(config.n_embd);
    const size_t per_block = 12 * width * width + 13 * width; // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
    return static_cast<size_t>(vocabulary_rows) * width + static_cast<size_t>(config.max_seq_len) * width +
           static_cast<size_t>(config.n_layer) * per_block + 2 * width;
}

std::string mebibytes(size_t bytes) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(bytes < (1u << 20) ? 3 : 2) << static_cast<double>(bytes) / (1 << 20)
         << " MiB";
    return text.str();
}

const char* optimizer_kind_name(OptimizerKind kind) {
    return kind == OptimizerKind::adamw ? "adamw" : kind == OptimizerKind::sgd ? "sgd" : "none";
}

size_t MemoryPrediction::device_total_bound() const {
    size_t total = 0;
    for (int index = 0; index < memory_category_count; ++index)
        if (static_cast<MemoryCategory>(index) != MemoryCategory::pinned_host) total += peaks[index];
    return total;
}

namespace {

// The high-water marks of one micro-batch's forward and backward, above what was live before it: the
// activations alone, and activations + workspace at one moment (the joint figure). Every candidate is a
// moment the trainer's step passes through; docs/MEMORY.md ("The joint peak") derives each from the ops.
struct Walk {
    size_t activations = 0;
    std::string activations_moment;
    size_t joint = 0;
    std::string joint_moment;
};

Walk walk_step(const std::vector<Segment>& segments, const Sizes& sizes, bool dropout_active, bool offload) {
    Walk walk;
    auto activation = [&](size_t bytes, const std::string& moment) {
        if (bytes > walk.activations) walk.activations = bytes, walk.activations_moment = moment;
    };
    auto joint = [&](size_t bytes, const std::string& moment) {
        if (bytes > walk.joint) walk.joint = bytes, walk.joint_moment = moment;
    };
    // In forward no gradient is in flight: each activation candidate is a joint one as it stands.
    auto forward = [&](size_t bytes, const std::string& moment) {
        activation(bytes, moment);
        joint(bytes, moment);
    };
    // `kept` is what earlier layers keep for backward, not counting the current layer's input.
    forward((dropout_active ? 2 : 1) * sizes.stream, "embedding and its dropout");
    size_t kept = 0;
    std::vector<size_t> kept_before(segments.size());
    for (size_t index = 0; index < segments.size(); ++index) {
        const Segment& segment = segments[index];
        kept_before[index] = kept;
        if (!segment.checkpointed) {
            forward(kept + block_saved(sizes) + block_transient(sizes), "forward of " + block_range(segment));
            kept += block_saved(sizes);
            continue;
        }
        // The segment input stays alive (the caller's argument); from the 2nd block on, so does that block's input.
        const size_t block_input = segment.layer_count > 1 ? sizes.stream : 0;
        forward(kept + sizes.stream + block_input + no_grad_block_peak(sizes, dropout_active),
                "no-grad forward of " + block_range(segment));
        if (!offload) kept += sizes.stream; // the one activation a checkpointed segment keeps
    }
    // ln_f saves its input, mean, rstd; the LM head saves ln_f's output; cross_entropy_in_place turns the
    // logits into their gradient and, while it reduces, holds the per-token losses and the (1) result.
    const size_t end_of_forward =
        kept + 2 * sizes.stream + 2 * sizes.row_stat + sizes.logits + sizes.row_stat + sizes.scalar;
    forward(end_of_forward, "cross_entropy_in_place at the end of forward");
    // Backward of the LM head: the per-token losses are gone, the caller holds the loss (s) beside the token
    // sum the trainer reports (s), and the head adds d(ln_f out) (A) while the logits-as-gradient still live.
    joint(end_of_forward - sizes.row_stat + sizes.scalar + sizes.stream, "backward of the LM head");
    // Backward allocates activations only to recompute: the segment's full saved set, rebuilt over what the
    // layers before it still keep, next to the loss the caller holds. Inside a block the MLP's backward is the
    // joint high-water mark: d(after-attention) A, d(c_proj out) A and d(gelu out) 4A beside the saved set
    // (6A); a checkpoint node also keeps its incoming gradient until its segment is done (+A).
    const size_t losses = 2 * sizes.scalar;
    for (size_t index = segments.size(); index-- > 0;) {
        const Segment& segment = segments[index];
        const size_t saved = segment.layer_count * block_saved(sizes);
        if (!segment.checkpointed) {
            joint(kept_before[index] + saved + losses + 6 * sizes.stream, "backward of " + block_range(segment));
            continue;
        }
        activation(kept_before[index] + sizes.scalar + saved + block_transient(sizes),
                   "recompute of " + block_range(segment) + " in backward");
        joint(kept_before[index] + saved + losses + 7 * sizes.stream,
              "backward of recomputed " + block_range(segment));
    }
    return walk;
}

} // namespace

MemoryPrediction predict_memory(const nn::GPTConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                                DType dtype, OptimizerKind optimizer, int optimizer_shards, int accumulation_steps) {
    config.validate();
    ENGINE_CHECK(optimizer_shards >= 1, "predict_memory: optimizer_shards " << optimizer_shards << " must be >= 1");
    ENGINE_CHECK(accumulation_steps >= 1,
                 "predict_memory: accumulation_steps " << accumulation_steps << " must be >= 1");
    ENGINE_CHECK(batch > 0 && seq_len > 0,
                 "predict_memory: batch " << batch << " and seq_len " << seq_len << " must be positive");
    ENGINE_CHECK(seq_len <= config.max_seq_len,
                 "predict_memory: seq_len " << seq_len << " exceeds the model maximum " << config.max_seq_len);
    const std::vector<Segment> segments = plan_segments(config.n_layer, policy);
    // bf16 (mixed precision): activations and their gradients are bf16; the statistics (layernorm mean and
    // rstd, attention's logsumexp, the losses), the f32 masters, their gradients and the optimizer state are
    // compute_dtype(bf16) = f32, and the bf16 working copies come on top of the masters.
    const size_t element = dtype_size(dtype);
    const size_t wide = dtype_size(compute_dtype(dtype));
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    Sizes sizes;
    sizes.stream = rows * static_cast<size_t>(config.n_embd) * element;
    sizes.row_stat = rows * wide;
    sizes.logsumexp = rows * static_cast<size_t>(config.n_head) * wide;
    sizes.logits = rows * static_cast<size_t>(config.padded_vocab_size()) * element; // the padded (B,T,Vp)
    sizes.scalar = wide;
    const bool dropout_active = config.dropout > 0.0f;
    const bool offload = policy.enabled && policy.offload;

    MemoryPrediction prediction;
    const size_t stored_count = parameter_count(config, config.padded_vocab_size());
    prediction.master_parameters = stored_count * wide;
    prediction.working_copies = element == wide ? 0 : stored_count * element; // each over its storage's rows
    prediction.at(MemoryCategory::parameters) = prediction.master_parameters + prediction.working_copies;
    prediction.at(MemoryCategory::gradients) = stored_count * wide; // one buffer per parameter, wte's padded too
    // The optimizer sees only the real rows. ZeRO-1: one rank's part of them laid end to end, padded to equal parts.
    const size_t real_count = parameter_count(config, config.vocab_size);
    const size_t shards = static_cast<size_t>(optimizer_shards);
    const size_t part = (real_count + shards - 1) / shards * wide;
    const size_t state_per_element = optimizer == OptimizerKind::adamw ? 2 : optimizer == OptimizerKind::sgd ? 1 : 0;
    prediction.at(MemoryCategory::optimizer_state) = state_per_element * (shards > 1 ? part : real_count * wide);

    for (const Segment& segment : segments) {
        if (!segment.checkpointed) continue;
        ++prediction.checkpointed_segments;
        prediction.recomputed_blocks += segment.layer_count;
    }
    const Walk walk = walk_step(segments, sizes, dropout_active, offload);
    prediction.at(MemoryCategory::activations) = walk.activations;
    prediction.activations_peak_moment = walk.activations_moment;

    // Workspace: the gradients in flight. The loss's seed and multiply's gradient for the loss sum (2 s);
    // cross_entropy_in_place allocates none: the logits' storage, already counted as activations and freed
    // after the LM head's backward, is their gradient. The head then adds d(ln_f out) (A). Inside a block the
    // MLP's backward holds d(after-attention), d(gelu out) and d(c_fc out): 9 A; a checkpoint node also keeps
    // its incoming gradient alive until its whole segment is done: +A.
    size_t workspace = std::max(2 * sizes.scalar, sizes.stream);
    workspace = std::max(workspace, (dropout_active ? 2 : 1) * sizes.stream);
    for (const Segment& segment : segments)
        workspace = std::max(workspace, (segment.checkpointed ? 10 : 9) * sizes.stream);
    // ZeRO-1's flat buffer and part live from the first step on, beside the step's temporaries.
    const size_t zero_buffers = shards > 1 ? (shards + 1) * part : 0;
    prediction.at(MemoryCategory::workspace) = workspace + zero_buffers;

    // Pinned host: every offloaded segment input is alive at the end of forward.
    prediction.at(MemoryCategory::pinned_host) =
        offload ? static_cast<size_t>(prediction.checkpointed_segments) * sizes.stream : 0;

    // The joint peak. Before the step: the persistent categories and all the step's micro-batches (inputs and
    // labels, (B,T) i32 each, pulled before the first forward). During the last micro-batch (the largest):
    // its inputs' and targets' device copies and the token sums the earlier ones reported (kept for the
    // step's loss). On the CPU backend the offloaded inputs stay in the same account, so the unified walk is
    // the one without offload: each pinned copy stands where the device copy stood.
    const size_t ids = rows * sizeof(int32_t);
    const size_t steps = static_cast<size_t>(accumulation_steps);
    const size_t before_forward = prediction.of(MemoryCategory::parameters) + prediction.of(MemoryCategory::gradients) +
                                  prediction.of(MemoryCategory::optimizer_state) + zero_buffers + steps * 2 * ids +
                                  2 * ids + (steps - 1) * sizes.scalar;
    prediction.peak_bytes = before_forward + walk.joint;
    prediction.peak_moment = walk.joint_moment;
    prediction.unified_peak_bytes =
        before_forward + (offload ? walk_step(segments, sizes, dropout_active, false).joint : walk.joint);
    return prediction;
}

std::string plan_report(const nn::GPTConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                        DType dtype, OptimizerKind optimizer, int optimizer_shards, int accumulation_steps) {
    const MemoryPrediction planned =
        predict_memory(config, batch, seq_len, policy, dtype, optimizer, optimizer_shards, accumulation_steps);
    const MemoryPrediction plain =
        predict_memory(config, batch, seq_len, CheckpointPolicy{}, dtype, optimizer, optimizer_shards);
    std::ostringstream text;
    text << "model: " << config.to_string() << "\n";
    text << "micro-batch " << batch << " x " << seq_len << " tokens, "
         << (dtype == DType::bf16 ? "bf16 mixed precision" : dtype_name(dtype)) << ", optimizer "
         << optimizer_kind_name(optimizer) << "\n";
    text << "gradient checkpointing: " << policy.to_string() << "\n";
    if (optimizer_shards > 1) {
        const MemoryPrediction whole = predict_memory(config, batch, seq_len, policy, dtype, optimizer);
        text << "ZeRO stage 1 over " << optimizer_shards << " ranks: optimizer_state per rank "
             << mebibytes(planned.of(MemoryCategory::optimizer_state)) << " instead of " << mebibytes(whole.of(MemoryCategory::optimizer_state)) << ", for "
             << mebibytes(planned.of(MemoryCategory::workspace) - whole.of(MemoryCategory::workspace)) << " of flat buffers in workspace\n";
    }
    if (policy.enabled) {
        text << "segments:";
        for (const Segment& segment : plan_segments(config.n_layer, policy))
            text << " [" << block_range(segment) << (segment.checkpointed ? " CP]" : " keep]");
        text << "\n";
        text << "recompute: " << planned.checkpointed_segments << " segments, " << planned.recomputed_blocks << " of "
             << config.n_layer << " blocks run forward twice (about +" << std::fixed << std::setprecision(0)
             << 100.0 * planned.recomputed_blocks / (3.0 * config.n_layer)
             << "% of the blocks' forward+backward compute)\n";
    }
    text << "predicted peak per category (without checkpointing in brackets):\n";
    for (int index = 0; index < memory_category_count; ++index) {
        const auto category = static_cast<MemoryCategory>(index);
        text << "  " << std::left << std::setw(16) << memory_category_name(category) << std::right << std::setw(14)
             << mebibytes(planned.of(category)) << "  [" << mebibytes(plain.of(category)) << "]\n";
    }
    text << "  device total <= " << mebibytes(planned.device_total_bound()) << "  ["
         << mebibytes(plain.device_total_bound()) << "]\n";
    if (planned.working_copies > 0)
        text << "parameters: f32 masters " << mebibytes(planned.master_parameters) << " + bf16 working copies "
             << mebibytes(planned.working_copies) << "; gradients accumulate in f32; activations bf16 ("
             << mebibytes(predict_memory(config, batch, seq_len, policy, compute_dtype(dtype), optimizer,
                                         optimizer_shards).of(MemoryCategory::activations))
             << " in f32)\n";
    text << "  step peak " << mebibytes(planned.peak_bytes) << " (" << planned.peak_bytes << " B; with the offloaded inputs in the same memory, as on the CPU: "
         << planned.unified_peak_bytes << " B) at " << planned.peak_moment << "\n";
    text << "activation peak at: " << planned.activations_peak_moment << "\n";
    const size_t logits_bytes = static_cast<size_t>(batch) * static_cast<size_t>(seq_len) *
                                static_cast<size_t>(config.padded_vocab_size()) * dtype_size(dtype);
    text << "loss: fused classifier, the gradient written over the logits (B,T,Vp) = " << mebibytes(logits_bytes)
         << ": no second buffer of that size in workspace\n";
    text << "vocabulary " << config.vocab_size << " padded to " << config.padded_vocab_size() << " rows of wte ("
         << parameter_count(config, config.vocab_size) << " parameters, " << parameter_count(config, config.padded_vocab_size())
         << " stored)\n";
    return text.str();
}

} // namespace engine::planner
