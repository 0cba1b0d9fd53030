// The analytic memory model of a causal-LM training step (GPT-2, Llama): walks the forward and backward in order,
// adding what each op allocates and saves (engine/ops/*.cpp) and keeping the high-water marks. GPT-2's terms
// are here, Llama's in memory_model_llama.cpp. See docs/MEMORY.md.
#include "planner/memory_model.h"

#include "engine/distributed/zero_partition.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "engine/cuda/runtime.h"
#include "planner/adapter_step.h"
#include "planner/step_terms.h"

namespace engine::planner {

using checkpoint::CheckpointPolicy;
using checkpoint::Segment;
using checkpoint::plan_segments;
namespace {

// GPT-2's terms (nn/gpt.cpp's pre-LN block; docs/MEMORY.md, "One block"). A block's saved set under grad mode,
// its input included (ln_1 saves it): input, ln_1 out, qkv (3), attention out, after-attention residual, ln_2
// out, c_fc out (4), gelu out (4) = 16 A; two layernorms' mean and rstd = 4 R; attention's logsumexp = H.
// Dropout and add save nothing. Its last moments hold two more (B,T,C): the MLP's c_proj output and its
// dropout output (or, at the final add, the dropout output and the block output). Under no-grad nothing is
// saved, but C++ keeps an expression's temporaries until it ends, so the MLP line holds the after-attention
// residual, ln_2 out, c_fc out (4), gelu out (4), c_proj out and the dropout output at once: 12 A (11 A when
// dropout is off and returns its input).
// With the MLP tiled (mlp_tile_tokens > 0; docs/MEMORY.md, "The tiled MLP") its node saves ln_2 out only: P = 8A +
// 4R + H, and a tile of m rows (a = (m,C)) holds its input copy, c_fc out (4a), gelu out (4a) and c_proj out (a).
StepTerms gpt_step_terms(const nn::GPTConfig& config, int batch, int seq_len, DType dtype, int mlp_tile_tokens) {
    // bf16 (mixed precision): activations and their gradients are bf16; the statistics (layernorm mean and
    // rstd, attention's logsumexp, the losses) are compute_dtype(bf16) = f32.
    const size_t element = dtype_size(dtype);
    const size_t wide = dtype_size(compute_dtype(dtype));
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    const bool dropout_active = config.dropout > 0.0f;
    StepTerms terms;
    const size_t A = rows * static_cast<size_t>(config.n_embd) * element;
    const size_t R = rows * wide;
    const size_t H = rows * static_cast<size_t>(config.n_head) * wide; // (B,NH,T)
    terms.stream = A;
    terms.row_stat = R;
    terms.logits = rows * static_cast<size_t>(config.padded_vocab_size()) * element; // the padded (B,T,Vp)
    terms.logits_row = static_cast<size_t>(config.padded_vocab_size()) * element;
    terms.scalar = wide;
    terms.embedding_peak = (dropout_active ? 2 : 1) * A; // its output and its dropout's
    terms.final_norm_statistics = 2 * R;                 // ln_f's mean and rstd
    // The loss's seed and multiply's gradient (2s), the head's d(ln_f out) (A), dropout's gradient (A).
    terms.other_workspace = std::max({2 * terms.scalar, A, (dropout_active ? 2 : 1) * A});
    if (mlp_tile_tokens > 0) {
        const size_t tile = std::min(static_cast<size_t>(mlp_tile_tokens), rows);
        const size_t row = static_cast<size_t>(config.n_embd) * element;
        const size_t a = tile * row;
        terms.layer_saved = 8 * A + 4 * R + H;
        // The result (A) is made after the first tile's forward (10a), beside that tile's output alone (a); only the
        // later tiles (the largest: a whole one, or with two tiles the shorter last) meet it.
        const size_t later = tile < rows ? std::min(tile, rows - tile) : 0;
        const size_t mlp_forward = std::max({10 * a, A + a, later == 0 ? 0 : A + 10 * later * row});
        // Forward: the MLP's moments; the dropout or the final add (2A).
        terms.layer_transient = std::max(2 * A, mlp_forward);
        // No-grad: the attention line (ln_1 out, qkv, attention out with its logsumexp, then c_proj out and
        // dropout's: 5A + H, 6A or 7A), ln_1 and ln_2 with their statistics, the MLP line (aa and ln_2 out beside
        // the MLP's moments) and its dropout or final add (4A).
        terms.no_grad_layer_peak =
            std::max({5 * A + H, (dropout_active ? 7 : 6) * A, 2 * A + 2 * R, 2 * A + mlp_forward, 4 * A});
        // Backward: the tiled node holds d(aa), d(mlp out) and d(ln_2 out) (3A) while a tile is recomputed (10a less
        // c_proj out) and backpropagated: c_proj's d(gelu out) (4a) beside d(tile out) (a) is its high, 14a. The
        // attention's (d(x), d(attention out), d(qkv) beside its saved part) stays below.
        terms.backward_activations = 10 * a; // the recomputed tile: its input copy, c_fc out, gelu out, c_proj out
        terms.layer_backward = 3 * A + 14 * a;
        terms.recomputed_layer_backward = 4 * A + 14 * a;
        // The workspace alone: the tiled node's 3A with gelu's d(gelu out) and d(c_fc out) (8a); the attention's and
        // c_attn's backward (d(x), d(attention out) or d(ln_1 out), d(qkv): 5A).
        terms.layer_workspace = std::max(3 * A + 8 * a, 5 * A);
        terms.recomputed_layer_workspace = std::max(3 * A + 8 * a, 5 * A) + A;
        return terms;
    }
    terms.layer_saved = 16 * A + 4 * R + H;
    terms.layer_transient = 2 * A;
    terms.no_grad_layer_peak = (dropout_active ? 12 : 11) * A;
    // Inside a block the MLP's backward is the joint high-water mark: d(after-attention) A, d(c_proj out) A
    // and d(gelu out) 4A beside the saved set (6A); in a recomputed segment the checkpoint node also keeps its
    // incoming gradient (+A). The workspace alone: d(after-attention), d(gelu out) and d(c_fc out), 9A (+A).
    terms.layer_backward = 6 * A;
    terms.recomputed_layer_backward = 7 * A;
    terms.layer_workspace = 9 * A;
    terms.recomputed_layer_workspace = 10 * A;
    return terms;
}

} // namespace

std::string block_range(const Segment& segment) {
    std::ostringstream text;
    text << "block" << (segment.layer_count > 1 ? "s " : " ") << segment.first_layer + 1;
    if (segment.layer_count > 1) text << "-" << segment.first_layer + segment.layer_count;
    return text.str();
}

// One decoder layer's parameters, and the largest of them: what streamed gradients hold on the device per
// layer, and stage on the host one at a time.
size_t layer_parameter_count(const nn::ModelConfig& model_config) {
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        const size_t width = static_cast<size_t>(config.hidden_size);
        const size_t key_value = static_cast<size_t>(config.key_value_width());
        return 2 * width * width + 2 * key_value * width + 3 * static_cast<size_t>(config.intermediate_size) * width +
               2 * width;
    }
    const size_t width = static_cast<size_t>(model_config.gpt().n_embd);
    return 12 * width * width + 13 * width; // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
}

namespace {

// The trainable parameters laid end to end in model order (the trainer's, and ZeRO's flat layout): the elements
// before the first decoder layer (GPT-2: wte's real rows and wpe; Llama: embed_tokens).
size_t elements_before_layers(const nn::ModelConfig& model_config) {
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        return static_cast<size_t>(config.vocab_size) * static_cast<size_t>(config.hidden_size);
    }
    const nn::GPTConfig& config = model_config.gpt();
    return (static_cast<size_t>(config.vocab_size) + static_cast<size_t>(config.max_seq_len)) *
           static_cast<size_t>(config.n_embd);
}

} // namespace

size_t sharded_table_elements(const nn::ModelConfig& config, ZeroSharding sharding, bool offload_optimizer) {
    if (!sharding.gradients || offload_optimizer || !config.is_llama()) return 0;
    return static_cast<size_t>(config.llama().vocab_size) * static_cast<size_t>(config.llama().hidden_size);
}

size_t sharded_layer_elements(const nn::ModelConfig& config, const std::vector<checkpoint::Segment>& segments,
                              const distributed::ZeroPartition& partition, int64_t rank, bool tables) {
    const int64_t first = elements_before_layers(config), layer = static_cast<int64_t>(layer_parameter_count(config));
    const int64_t begin = partition.begin(rank), end = partition.end(rank);
    size_t held = 0;
    const auto overlap = [&](int64_t from, int64_t to) {
        return static_cast<size_t>(std::max<int64_t>(0, std::min(to, end) - std::max(from, begin)));
    };
    if (tables) { // a Llama: embed_tokens first, an untied lm_head last
        const int64_t table = first, total = static_cast<int64_t>(parameter_count(config, config.vocab_size()));
        held += overlap(0, table) + (config.llama().tie_word_embeddings ? 0 : overlap(total - table, total));
    }
    for (const checkpoint::Segment& segment : segments) {
        if (!segment.checkpointed) continue;
        for (int index = segment.first_layer; index < segment.first_layer + segment.layer_count; ++index) {
            const int64_t from = first + index * layer;
            held += static_cast<size_t>(std::max<int64_t>(0, std::min(from + layer, end) - std::max(from, begin)));
        }
    }
    return held;
}

size_t largest_layer_parameter(const nn::ModelConfig& model_config) {
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        const size_t width = static_cast<size_t>(config.hidden_size);
        return width * std::max(static_cast<size_t>(config.intermediate_size), width);
    }
    const size_t width = static_cast<size_t>(model_config.gpt().n_embd);
    return 4 * width * width; // c_fc and the MLP's c_proj
}

// The parameters' element count with wte's rows counted as `vocabulary_rows`: vocab_size gives the real
// count (what the optimizer keeps moments for), padded_vocab_size() the stored one (wte's allocation and its
// gradient buffer hold the zero padding rows too). Llama pads nothing: both are its one count.
size_t parameter_count(const nn::ModelConfig& model_config, int vocabulary_rows) {
    if (model_config.is_llama()) {
        ENGINE_CHECK(vocabulary_rows == model_config.vocab_size(),
                     "parameter_count: a Llama vocabulary has " << model_config.vocab_size() << " rows, not "
                                                                << vocabulary_rows << " (no padding)");
        return llama_parameter_count(model_config.llama());
    }
    const nn::GPTConfig& config = model_config.gpt();
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

// `offload`: the checkpointed segments' inputs go to pinned host memory; `pinned_in_account`: that memory is in
// the same account (the CPU backend), so each pinned copy stands where the device copy stood.
// `streamed_layer_gradients`: with streamed gradients, the f32 gradient bytes of one layer, which a
// checkpointed segment holds from its recompute to the end of its backward. `streamed_layer_weights`: with
// streamed parameters, the working-copy bytes of one layer, which a checkpointed segment holds during its
// forward and again from its recompute to the end of its backward, each time beside the copies of the segment
// that runs next, prefetched (checkpointed_neighbours).
// `gathered_layer_weights`: at ZeRO-3, the bytes of one layer's weights gathered from the ranks, which a checkpointed
// segment holds during its forward and again from its recompute to the end of its backward (no neighbour's).
// `gathered_table` and `table_gradient`: at ZeRO-2 and 3 with the model state on the device, a Llama's token table or
// head gathered (stage 3: the table for its lookup; the head from the loss to the end of its backward) and one table's
// gradient (the head's from the loss to the end of its backward; the token table's for the lookup's backward at the
// end; with `tied_table` one buffer held from the head's backward to the end, through every layer's backward).
Walk walk_step(const std::vector<Segment>& segments, const StepTerms& terms, bool offload, bool pinned_in_account,
               size_t streamed_layer_gradients = 0, size_t streamed_layer_weights = 0, size_t gathered_layer_weights = 0,
               size_t gathered_table = 0, size_t table_gradient = 0, bool tied_table = false) {
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
    const size_t A = terms.stream, P = terms.layer_saved;
    // Each checkpointed segment's layers, with the next and the previous checkpointed segment's (0 at the ends).
    std::vector<size_t> next_layers(segments.size(), 0), previous_layers(segments.size(), 0);
    size_t last = segments.size();
    for (size_t index = 0; index < segments.size(); ++index) {
        if (!segments[index].checkpointed) continue;
        if (last != segments.size()) {
            next_layers[last] = static_cast<size_t>(segments[index].layer_count);
            previous_layers[index] = static_cast<size_t>(segments[last].layer_count);
        }
        last = index;
    }
    // `kept` is what earlier layers keep for backward, not counting the current layer's input.
    activation(terms.embedding_peak, "embedding");
    joint(terms.embedding_peak + gathered_table, "embedding");
    size_t kept = 0;
    std::vector<size_t> kept_before(segments.size());
    for (size_t index = 0; index < segments.size(); ++index) {
        const Segment& segment = segments[index];
        kept_before[index] = kept;
        if (!segment.checkpointed) {
            forward(kept + P + terms.layer_transient, "forward of " + block_range(segment));
            kept += P;
            continue;
        }
        // The segment input stays alive (the caller's argument); from the 2nd block on, so does that block's input.
        const size_t block_input = segment.layer_count > 1 ? A : 0;
        const size_t weights = (static_cast<size_t>(segment.layer_count) + next_layers[index]) * streamed_layer_weights;
        // The gathered weights are `parameters`: in the joint peak only.
        const size_t gathered = static_cast<size_t>(segment.layer_count) * gathered_layer_weights;
        const size_t no_grad_forward = kept + A + block_input + terms.no_grad_layer_peak + weights;
        activation(no_grad_forward, "no-grad forward of " + block_range(segment));
        joint(no_grad_forward + gathered, "no-grad forward of " + block_range(segment));
        if (!offload || pinned_in_account) kept += A; // the one activation a checkpointed segment keeps
    }
    // The final norm's output and statistics, beside its input.
    forward(kept + 2 * A + terms.final_norm_statistics, "the final norm at the end of forward");
    // The final norm saves its input and statistics; the LM head saves the norm's output. The fused classifier
    // turns the logits into their gradient and, while it reduces, holds the per-token losses and the (1) result;
    // the streaming head holds d(norm out), one chunk's logits and the per-token losses (terms.head_peak).
    const size_t end_of_forward = kept + 2 * A + terms.final_norm_statistics;
    activation(end_of_forward + terms.head_peak, "the loss head at the end of forward");
    const size_t head = gathered_table + table_gradient; // ZeRO-3: the gathered head and its gradient buffer
    joint(end_of_forward + terms.head_peak + head, "the loss head at the end of forward");
    // Backward of the LM head: the per-token losses are gone, the caller holds the loss (s) beside the token
    // sum the trainer reports (s); the fused classifier's head adds d(norm out) (A) while the logits-as-gradient
    // still live; the streaming head's d(norm out) is made already (terms.head_backward).
    joint(end_of_forward + terms.head_backward + head, "backward of the LM head");
    // Backward allocates activations only to recompute: the segment's full saved set, rebuilt over what the
    // layers before it still keep, next to the loss the caller holds, while the checkpoint node's incoming
    // gradient (A) waits. Inside a layer the gradients in flight beside its saved set are the joint high-water
    // mark (terms.layer_backward; a checkpoint node keeps its incoming gradient until its segment is done).
    const size_t losses = 2 * terms.scalar + (tied_table ? table_gradient : 0); // the tied table's gradient rides along
    for (size_t index = segments.size(); index-- > 0;) {
        const Segment& segment = segments[index];
        const size_t saved = segment.layer_count * P;
        if (!segment.checkpointed) {
            joint(kept_before[index] + saved + losses + terms.layer_backward, "backward of " + block_range(segment));
            // A tiled MLP recomputes in backward: a tile's forward beside the layer's saved set and the loss.
            if (terms.backward_activations > 0)
                activation(kept_before[index] + terms.scalar + saved + terms.backward_activations,
                           "backward of " + block_range(segment) + " (an MLP tile's recompute)");
            continue;
        }
        activation(kept_before[index] + terms.scalar + saved + terms.layer_transient,
                   "recompute of " + block_range(segment) + " in backward");
        const size_t gradients = static_cast<size_t>(segment.layer_count) * streamed_layer_gradients +
                                 (static_cast<size_t>(segment.layer_count) + previous_layers[index]) * streamed_layer_weights +
                                 static_cast<size_t>(segment.layer_count) * gathered_layer_weights;
        joint(kept_before[index] + saved + losses + terms.recomputed_layer_backward + gradients,
              "backward of recomputed " + block_range(segment));
        joint(kept_before[index] + saved + losses + terms.layer_transient + A + gradients,
              "recompute of " + block_range(segment) + " in backward");
    }
    // ZeRO-3: the token table's gradient storage comes for the lookup's backward, the last node, beside the gradient
    // of the lookup's output and the losses.
    if (table_gradient > 0) joint(A + 2 * terms.scalar + table_gradient, "backward of the token table");
    return walk;
}

// The elements of the largest parameter's storage (wte's padded rows included) whose working copy is on the
// device: what one refresh rounds on the host at once. `layers_on_device` false: every decoder layer's copy is
// parked on the host (streamed parameters), where it is rounded in place.
size_t largest_parameter_elements(const nn::ModelConfig& model_config, bool layers_on_device) {
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        const size_t hidden = static_cast<size_t>(config.hidden_size);
        const size_t layer = layers_on_device ? std::max(static_cast<size_t>(config.intermediate_size), hidden) : 0;
        return hidden * std::max(static_cast<size_t>(config.vocab_size), layer);
    }
    const nn::GPTConfig& config = model_config.gpt();
    const size_t width = static_cast<size_t>(config.n_embd);
    return width * std::max({static_cast<size_t>(model_config.padded_vocab_size()),
                             static_cast<size_t>(config.max_seq_len), layers_on_device ? 4 * width : 0});
}

// Parameter counts and constant buffers, the part of the prediction that does not depend on the policy.
struct ParameterTerms {
    size_t stored = 0;   // elements with a gradient buffer (GPT-2: wte's padding rows included)
    size_t real = 0;     // elements the optimizer updates
    size_t constant = 0; // bytes of buffers built with the model that are not parameters (Llama's RoPE tables)
};

ParameterTerms parameter_terms(const nn::ModelConfig& config, DType dtype) {
    ParameterTerms terms;
    if (config.is_llama()) {
        terms.stored = terms.real = llama_parameter_count(config.llama());
        terms.constant = llama_rope_table_bytes(config.llama(), dtype);
        return terms;
    }
    terms.stored = parameter_count(config, config.padded_vocab_size());
    terms.real = parameter_count(config, config.vocab_size());
    return terms;
}

} // namespace

MemoryPrediction predict_memory(const nn::ModelConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                                DType dtype, OptimizerKind optimizer, ZeroSharding sharding, int accumulation_steps,
                                bool offload_optimizer, GradientOffload gradients_where, bool offload_parameters,
                                int loss_chunk_tokens, int mlp_tile_tokens, bool packed_documents,
                                const FineTuning& tuning, int batch_invariant_chunk) {
    config.validate();
    if (batch_invariant_chunk > 0) // planner/batch_invariant_memory.cpp: the chunks' step, and what the mode adds
        return predict_batch_invariant_memory(config, batch, seq_len, policy, dtype, optimizer, sharding,
                                              accumulation_steps, offload_optimizer, gradients_where, offload_parameters,
                                              loss_chunk_tokens, mlp_tile_tokens, packed_documents, tuning,
                                              batch_invariant_chunk);
    const int optimizer_shards = sharding.ranks;
    const bool shard_gradients = sharding.gradients;
    ENGINE_CHECK(!sharding.parameters || !offload_parameters,
                 "predict_memory: ZeRO-3 gathers the segments' weights for each use itself: offload_parameters is "
                 "refused with it");
    ENGINE_CHECK(!shard_gradients || (policy.enabled && (!offload_optimizer || gradients_where == GradientOffload::stream)),
                 "predict_memory: ZeRO-2 needs gradient checkpointing, and with the optimizer on the host streamed "
                 "gradients");
    ENGINE_CHECK(!offload_parameters || (offload_optimizer && policy.enabled),
                 "predict_memory: offload_parameters needs offload_optimizer and gradient checkpointing");
    ENGINE_CHECK(optimizer_shards >= 1, "predict_memory: optimizer_shards " << optimizer_shards << " must be >= 1");
    ENGINE_CHECK(accumulation_steps >= 1,
                 "predict_memory: accumulation_steps " << accumulation_steps << " must be >= 1");
    ENGINE_CHECK(batch > 0 && seq_len > 0,
                 "predict_memory: batch " << batch << " and seq_len " << seq_len << " must be positive");
    ENGINE_CHECK(seq_len <= config.max_seq_len(),
                 "predict_memory: seq_len " << seq_len << " exceeds the model maximum " << config.max_seq_len());
    const std::vector<Segment> segments = plan_segments(config.layers(), policy);
    // bf16 (mixed precision): activations and their gradients are bf16; the statistics, the f32 masters, their
    // gradients and the optimizer state are compute_dtype(bf16) = f32, and the bf16 working copies come on top
    // of the masters.
    const size_t element = dtype_size(dtype);
    const size_t wide = dtype_size(compute_dtype(dtype));
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    ENGINE_CHECK(loss_chunk_tokens >= 0,
                 "predict_memory: loss_chunk_tokens " << loss_chunk_tokens << " must be >= 0 (0: the whole logits)");
    ENGINE_CHECK(mlp_tile_tokens >= 0,
                 "predict_memory: mlp_tile_tokens " << mlp_tile_tokens << " must be >= 0 (0: the whole MLP)");
    if (tuning.lora)
        return predict_adapter_memory(config, batch, seq_len, policy, dtype, optimizer, optimizer_shards,
                                      accumulation_steps, offload_optimizer, offload_parameters, loss_chunk_tokens,
                                      mlp_tile_tokens, packed_documents, tuning);
    StepTerms terms = config.is_llama() ? llama_step_terms(config.llama(), batch, seq_len, dtype, mlp_tile_tokens)
                                        : gpt_step_terms(config.gpt(), batch, seq_len, dtype, mlp_tile_tokens);
    if (loss_chunk_tokens > 0) {
        // linear_cross_entropy: d(hidden) (A), one chunk's logits (a last, shorter chunk reuses the buffer) and
        // the per-token losses; the (1) loss comes after the chunk buffer is gone.
        const size_t chunk = std::min(static_cast<size_t>(loss_chunk_tokens), rows);
        terms.head_peak = terms.stream + chunk * terms.logits_row + terms.row_stat;
        terms.head_backward = terms.stream + 2 * terms.scalar;
    } else {
        terms.head_peak = terms.logits + terms.row_stat + terms.scalar;
        terms.head_backward = terms.logits + 2 * terms.scalar + terms.stream;
    }
    const bool offload = policy.enabled && policy.offload;

    MemoryPrediction prediction;
    const ParameterTerms counts = parameter_terms(config, dtype);
    prediction.master_parameters = counts.stored * wide;
    prediction.working_copies = element == wide ? 0 : counts.stored * element; // each over its storage's rows
    prediction.constant_buffers = counts.constant;
    prediction.at(MemoryCategory::parameters) =
        prediction.master_parameters + prediction.working_copies + prediction.constant_buffers;
    prediction.at(MemoryCategory::gradients) = counts.stored * wide; // one buffer per parameter, wte's padded too
    // The optimizer sees only the real rows. ZeRO-1: one rank's part of them laid end to end, padded to equal parts.
    const size_t shards = static_cast<size_t>(optimizer_shards);
    // ZeRO-1 (distributed::ZeroPartition): rank 0's part, a whole number of the collectives' pieces.
    const distributed::ZeroPartition partition =
        distributed::ZeroPartition::of(static_cast<int64_t>(counts.real), optimizer_shards, wide);
    const size_t part = static_cast<size_t>(partition.end(0) - partition.begin(0)) * wide;
    const size_t state_per_element = static_cast<size_t>(optimizer_state_tensors(optimizer));
    prediction.at(MemoryCategory::optimizer_state) = state_per_element * (shards > 1 ? part : counts.real * wide);
    // ZeRO-1's buffers (a piece of every rank's part and this rank's) live from the first step on, beside the step's
    // temporaries, where the optimizer's parameters are.
    const size_t zero_buffers =
        shards > 1 || shard_gradients ? static_cast<size_t>(partition.buffer_elements()) * wide : 0;
    prediction.zero_buffers = zero_buffers;
    size_t device_zero_buffers = zero_buffers;
    if (offload_optimizer) {
        // The masters (each over its storage's rows), their gradient buffers and the state move to the host; the
        // device keeps working copies in the step's dtype (f32 copies in fp32) with gradient buffers of their own.
        prediction.host[static_cast<size_t>(MemoryCategory::parameters)] = prediction.master_parameters;
        prediction.host[static_cast<size_t>(MemoryCategory::gradients)] = counts.stored * wide;
        prediction.host[static_cast<size_t>(MemoryCategory::optimizer_state)] =
            prediction.of(MemoryCategory::optimizer_state);
        prediction.host[static_cast<size_t>(MemoryCategory::workspace)] = zero_buffers;
        prediction.working_copies = counts.stored * element;
        prediction.at(MemoryCategory::parameters) = prediction.working_copies + prediction.constant_buffers;
        prediction.at(MemoryCategory::optimizer_state) = 0;
        device_zero_buffers = 0;
    }
    // What streams: the layers of the checkpointed segments, one segment at a time (streamed parameters: with
    // the next one's prefetched, so two neighbours at once).
    size_t checkpointed_layers = 0, largest_segment = 0, largest_pair = 0, previous = 0;
    for (const Segment& segment : segments)
        if (segment.checkpointed) {
            const size_t count = static_cast<size_t>(segment.layer_count);
            checkpointed_layers += count;
            largest_segment = std::max(largest_segment, count);
            largest_pair = std::max(largest_pair, previous + count);
            previous = count;
        }
    // Streamed gradients: those layers keep no device buffer between their backwards; a segment holds its own
    // from its recompute to the end of its backward.
    // ZeRO-2 likewise, its whole buffers' sums going to the ranks' parts as the segment's backward ends, and this
    // rank's part of the summed gradients held for the whole run.
    const bool streamed = offload_optimizer && gradients_where == GradientOffload::stream;
    const size_t layer_gradients = streamed || shard_gradients ? layer_parameter_count(config) * wide : 0;
    prediction.shard_gradient_bytes = shard_gradients ? static_cast<size_t>(partition.part) * wide : 0;
    // With the optimizer on the host the shard is there, and the host masters of those layers hold no buffer: each
    // staged gradient is lent to its master for its reduce.
    const size_t device_shard = offload_optimizer ? 0 : prediction.shard_gradient_bytes;
    if (shard_gradients && offload_optimizer)
        prediction.host[static_cast<size_t>(MemoryCategory::gradients)] +=
            prediction.shard_gradient_bytes - checkpointed_layers * layer_gradients;
    size_t persistent_gradients =
        prediction.of(MemoryCategory::gradients) - checkpointed_layers * layer_gradients + device_shard;
    prediction.at(MemoryCategory::gradients) = persistent_gradients + largest_segment * layer_gradients;
    // Streamed parameters: the same layers' working copies are parked on the host between their uses, and a
    // segment's come to the device for its forward and for its recompute and backward.
    const size_t layer_weights = offload_parameters ? layer_parameter_count(config) * element : 0;
    const size_t parked_layers = offload_parameters ? checkpointed_layers : 0;
    size_t persistent_parameters = prediction.of(MemoryCategory::parameters) - parked_layers * layer_weights;
    prediction.at(MemoryCategory::parameters) = persistent_parameters + largest_pair * layer_weights;
    prediction.parked_working_copies = parked_layers * layer_weights; // pinned host memory, for the whole run
    // ZeRO-3: those layers' weights exist only while their segment is gathered, one segment at a time (no prefetch);
    // this rank's part of every master is kept in a buffer of its own. What is gathered is what the forward reads: the
    // f32 masters in fp32, the bf16 copies alone under bf16 (their owners round before the broadcast); with the model
    // state on the host the masters and the part are there, and the device holds a gathered segment's copies.
    const size_t gathered_layer = sharding.parameters ? layer_parameter_count(config) * element : 0;
    prediction.gathered_layer_bytes = gathered_layer;
    // With the model state on the device an untied Llama's token table and head have their gradient buffers given storage
    // for their backward only (stages 2 and 3), and at stage 3 are released too, each gathered for its one use.
    const size_t table_elements = sharded_table_elements(config, sharding, offload_optimizer);
    const bool tied_table = table_elements > 0 && config.llama().tie_word_embeddings; // the head is the table
    const size_t tables = tied_table ? 1 : 2;
    const size_t gathered_table = sharding.parameters ? table_elements * element : 0;
    const size_t table_gradient = table_elements * wide;
    if (table_elements > 0) {
        persistent_gradients -= tables * table_gradient;
        // A tied table's gradient lives through the layers' backward, beside each segment's.
        prediction.at(MemoryCategory::gradients) =
            persistent_gradients + (tied_table ? largest_segment * layer_gradients + table_gradient
                                               : std::max(largest_segment * layer_gradients, table_gradient));
    }
    prediction.gathered_table_bytes = gathered_table;
    prediction.table_gradient_bytes = table_gradient;
    size_t host_gathered_masters = 0; // a segment's whole masters on the host, during its gather only
    if (sharding.parameters) {
        // Rank 0's elements of those layers' masters (the trainer's flat layout: the embeddings, then the layers in
        // order, then the rest), and the most any rank holds.
        size_t largest = 0;
        for (int64_t rank = 0; rank < partition.ranks; ++rank) {
            const size_t held = sharded_layer_elements(config, segments, partition, rank, gathered_table > 0) * wide;
            if (rank == 0) prediction.shard_parameter_bytes = held;
            largest = std::max(largest, held);
        }
        // Those layers held their masters and bf16 copies on the device (their copies only, with the state on the
        // host) before the trainer released them.
        const size_t released_layer =
            layer_parameter_count(config) * (offload_optimizer ? element : wide + (element == wide ? 0 : element));
        const size_t released_tables =
            gathered_table > 0 ? tables * table_elements * (wide + (element == wide ? 0 : element)) : 0;
        persistent_parameters -= checkpointed_layers * released_layer + released_tables;
        prediction.at(MemoryCategory::parameters) =
            persistent_parameters + std::max(largest_segment * gathered_layer, gathered_table);
        if (offload_optimizer) {
            size_t& host_parameters = prediction.host[static_cast<size_t>(MemoryCategory::parameters)];
            host_gathered_masters = largest_segment * layer_parameter_count(config) * wide;
            host_parameters = host_parameters - checkpointed_layers * layer_parameter_count(config) * wide +
                              prediction.shard_parameter_bytes + host_gathered_masters;
            prediction.host_largest_rank_extra_bytes = largest - prediction.shard_parameter_bytes;
        } else {
            prediction.largest_rank_extra_bytes = largest - prediction.shard_parameter_bytes;
            persistent_parameters += prediction.shard_parameter_bytes;
            prediction.at(MemoryCategory::parameters) += prediction.shard_parameter_bytes;
        }
    }

    for (const Segment& segment : segments) {
        if (!segment.checkpointed) continue;
        ++prediction.checkpointed_segments;
        prediction.recomputed_blocks += segment.layer_count;
    }
    const Walk walk = walk_step(segments, terms, offload, false, layer_gradients, layer_weights, gathered_layer,
                                gathered_table, table_gradient, tied_table);
    prediction.at(MemoryCategory::activations) = walk.activations;
    prediction.activations_peak_moment = walk.activations_moment;

    // Workspace: the gradients in flight. cross_entropy_in_place allocates none: the logits' storage, already
    // counted as activations and freed after the LM head's backward, is their gradient. The layers' high-water
    // marks are in the terms; a checkpoint node keeps its incoming gradient alive until its segment is done.
    size_t workspace = terms.other_workspace;
    for (const Segment& segment : segments)
        workspace = std::max(workspace, segment.checkpointed ? terms.recomputed_layer_workspace : terms.layer_workspace);
    prediction.at(MemoryCategory::workspace) = workspace + device_zero_buffers;

    // Pinned host: every offloaded segment input is alive at the end of forward.
    prediction.at(MemoryCategory::pinned_host) =
        offload ? static_cast<size_t>(prediction.checkpointed_segments) * terms.stream : 0;

    // The joint peak. Before the step: the persistent categories and all the step's micro-batches (inputs and
    // labels, (B,T) i32 each, pulled before the first forward). During the last micro-batch (the largest):
    // its inputs' and targets' device copies and the token sums the earlier ones reported (kept for the
    // step's loss). On the CPU backend the offloaded inputs stay in the same account: the unified walk counts
    // each pinned copy where the device copy stood.
    // Packed documents add the positions to both: three (B,T) i32 tensors a micro-batch.
    const size_t ids = rows * sizeof(int32_t);
    const size_t steps = static_cast<size_t>(accumulation_steps);
    const size_t per_batch = packed_documents ? 3 : 2;
    const size_t before_forward = persistent_parameters + persistent_gradients +
                                  prediction.of(MemoryCategory::optimizer_state) + device_zero_buffers +
                                  steps * per_batch * ids + per_batch * ids + (steps - 1) * terms.scalar;
    prediction.peak_bytes = before_forward + walk.joint;
    prediction.peak_moment = walk.joint_moment;
    prediction.unified_peak_bytes =
        before_forward + walk_step(segments, terms, offload, true, layer_gradients, layer_weights, gathered_layer,
                                   gathered_table, table_gradient, tied_table).joint;
    prediction.between_steps_bytes = persistent_parameters + persistent_gradients +
                                     prediction.of(MemoryCategory::optimizer_state) + device_zero_buffers;
    if (sharding.all_reduced && !offload_optimizer) {
        // Stage 0 over several ranks: after the window, its gradients all-reduced through one staging bucket, beside the
        // model state, the step's micro-batches and every micro-batch's reported loss.
        hold_all_reduce(prediction, prediction.between_steps_bytes + steps * per_batch * ids + steps * terms.scalar,
                        all_reduce_bucket_bytes(config, wide), "the gradients' all-reduce");
    }
    prediction.pinned_peak_bytes =
        prediction.parked_working_copies + std::max(prediction.of(MemoryCategory::pinned_host), ids);
    // GPT-2's biased linears run through cuBLASLt's fused epilogue; Llama has no bias and never calls it.
    prediction.cuda_runtime_bytes = config.is_llama() ? 0 : cuda::cublaslt_workspace_bytes;
    // The host's high-water mark without offload: the offloaded segment inputs.
    prediction.host_peak_bytes = prediction.of(MemoryCategory::pinned_host);
    if (offload_optimizer) {
        // The host's high-water mark: the state, the offloaded segment inputs at the end of forward, and during
        // the update the one rounded copy of the largest master on its way to the device (bf16 only).
        // Parked copies are refreshed where they are, and released layers when they are gathered: no rounded copy.
        const size_t unrefreshed = sharding.parameters ? checkpointed_layers : parked_layers;
        const bool layers_on_device = unrefreshed < static_cast<size_t>(config.layers());
        const size_t rounding = element == wide ? 0 : largest_parameter_elements(config, layers_on_device) * element;
        size_t state = prediction.parked_working_copies;
        for (size_t bytes : prediction.host) state += bytes;
        state -= host_gathered_masters; // the persistent part: a gathered segment is a transient, below
        prediction.host[static_cast<size_t>(MemoryCategory::pinned_host)] =
            prediction.of(MemoryCategory::pinned_host) + prediction.parked_working_copies;
        prediction.host_peak_bytes = state + std::max(prediction.of(MemoryCategory::pinned_host), rounding);
        if (streamed && prediction.checkpointed_segments > 0) {
            // After the first segment's backward (the last segment's): the earlier segments' inputs still
            // pinned, and one gradient staged on its way into its master's buffer.
            const size_t pinned = offload ? static_cast<size_t>(prediction.checkpointed_segments - 1) * terms.stream : 0;
            prediction.host_peak_bytes =
                std::max(prediction.host_peak_bytes, state + pinned + largest_layer_parameter(config) * wide);
        }
        if (host_gathered_masters > 0) {
            // ZeRO-3: a segment's gather, at its highest for the last segment's forward and the first recompute (the
            // other segments' inputs pinned: the recompute's own came back to the device before its hook): its whole
            // masters, and one tensor rounded on its way to the device (bf16 only).
            const size_t gather_rounding = element == wide ? 0 : largest_layer_parameter(config) * element;
            const size_t pinned = offload ? static_cast<size_t>(prediction.checkpointed_segments - 1) * terms.stream : 0;
            prediction.host_peak_bytes =
                std::max(prediction.host_peak_bytes, state + pinned + host_gathered_masters + gather_rounding);
        }
        // On one account (the CPU backend) there is nothing to offload: the trainer refuses it.
        prediction.unified_peak_bytes = prediction.peak_bytes + state;
        prediction.host_between_steps_bytes = state;
        prediction.host_rounding_bytes = rounding;
    }
    return prediction;
}

} // namespace engine::planner
