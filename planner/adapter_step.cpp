// The LoRA and QLoRA step replayed over sized tensors with no data (planner/adapter_step.h). Why a replay and not
// closed-form terms as for a full fine-tune: a frozen base changes what each op saves (a frozen weight's GEMM keeps
// no input), the first layers before any adapter record nothing, and every target set moves the high-water marks;
// the replay follows the code's structure (nn/llama.cpp, nn/lora.cpp, checkpoint/checkpoint.cpp, optim/trainer.cpp),
// so C++'s temporaries die where the engine's do, and each op (planner/replay.h) allocates, saves and frees what its
// engine twin does. docs/MEMORY.md, "The LoRA step".
#include "planner/adapter_step.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/cuda/runtime.h"
#include "planner/replay.h"

namespace engine::planner {
namespace {

using namespace replay;

// The model's modules, mirroring nn/ (function for function, so that temporaries live as long as there).
struct LinearLayer {
    size_t in = 0, out = 0;
    bool adapted = false;
    bool nf4 = false;
};

// What GPT-2 and Llama share: the adaptable linear layer (nn/layers.h, nn/lora.cpp), the decoder's segments
// (nn/causal_lm.cpp, checkpoint/checkpoint.cpp), the tiled MLP (checkpoint/tiled_rows.cpp) and the head.
class DecoderReplay {
public:
    DecoderReplay(Replay& replay, size_t rows, const nn::LoraConfig& lora, bool nf4,
                  const checkpoint::CheckpointPolicy& policy, int layers, size_t width, size_t head_columns,
                  int mlp_tile_tokens)
        : r(replay), ops(replay, rows), lora(lora), nf4(nf4), policy(policy), layers(layers), width(width),
          head_columns(head_columns), mlp_tile(static_cast<size_t>(mlp_tile_tokens)) {}
    virtual ~DecoderReplay() = default;

    Replay& r;
    mutable Ops ops; // the replay changes, the model does not
    const nn::LoraConfig& lora;
    const bool nf4;
    const checkpoint::CheckpointPolicy& policy;
    const int layers;
    const size_t width;
    const size_t head_columns; // the head's rows: GPT-2's padded vocabulary, Llama's vocabulary
    const size_t mlp_tile;     // 0: the whole MLP
    size_t vocabulary = 0;     // the head's real columns (V <= head_columns)
    bool training = true;      // train mode: dropout draws; eval mode returns its input
    size_t gathered_layer = 0; // ZeRO-3: a checkpointed layer's weights, gathered for each use of its segment
    size_t gathered_table = 0; // ZeRO-3: an untied token table's or head's weights, gathered for the lookup, the loss

    virtual Sym layer_forward(const Sym& input, int index) const = 0;
    virtual Sym forward_hidden() const = 0;
    virtual std::string layer_name(int index, const std::string& name) const = 0;

    LinearLayer layer(int index, const std::string& name, size_t in, size_t out) const {
        return LinearLayer{in, out, nn::lora_target_matches(lora, layer_name(index, name)), nf4};
    }
    // Linear::forward and TorchLinear::forward: the base (dense and frozen, or NF4; a frozen bias adds nothing),
    // then with_lora.
    Sym linear_forward(const LinearLayer& linear, const Sym& input) const {
        if (linear.nf4) return with_lora(ops.nf4_linear(input, linear.in, linear.out), input, linear);
        return with_lora(ops.matmul(input, r.parameter(false), linear.out), input, linear);
    }
    // AdaptableLinear::with_lora: base_output by value, as there (it lives to the end of the caller's statement).
    Sym with_lora(Sym base_output, const Sym& input, const LinearLayer& linear) const {
        if (!linear.adapted) return base_output;
        return ops.add(base_output, adapter_forward(input, linear), linear.out);
    }
    // LoraAdapter::forward: dropout on the input in train mode, lora_A (r,in), lora_B (out,r), the scaling.
    Sym adapter_forward(const Sym& input, const LinearLayer& linear) const {
        const Sym dropped = lora.lora_dropout > 0.0 && training ? ops.dropout(input, linear.in) : input;
        const size_t rank = static_cast<size_t>(lora.r);
        return ops.multiply(adapter_linear(adapter_linear(dropped, rank), linear.out), ops.rows * linear.out * r.element);
    }
    // lora_A and lora_B: TorchLinears with trainable weights and no adapter of their own.
    Sym adapter_linear(const Sym& input, size_t out) const { return plain(ops.matmul(input, r.parameter(true), out)); }
    static Sym plain(Sym base_output) { return base_output; }
    // nn::Dropout::forward: its input itself unless training with p > 0.
    Sym dropout(const Sym& input, float probability, size_t columns) const {
        return probability > 0.0f && training ? ops.dropout(input, columns) : input;
    }

    // The first rows of the tiles of `tile` rows a replay visits: every one when events are recorded (every_tile),
    // else the first `leading` and the last, whose marks stand for the ones between.
    std::vector<size_t> tile_starts(size_t rows, size_t tile, size_t leading) const {
        const size_t tiles = (rows + tile - 1) / tile;
        std::vector<size_t> starts;
        for (size_t index = 0; index < tiles; ++index) {
            if (!r.every_tile && index >= leading && index + 1 < tiles) index = tiles - 1;
            starts.push_back(index * tile);
        }
        return starts;
    }

    // checkpoint::tiled_rows over the MLP `function` (columns wide in and out): each tile's rows copied and run
    // under no-grad into the output; the node saves the input, and backward recomputes and walks tile by tile.
    template <typename Function>
    Sym tiled_rows(const Function& function, const Sym& input, size_t columns) const {
        const size_t rows = ops.rows;
        const size_t tile = std::min(mlp_tile, rows);
        Sym output;
        {
            const bool previous = r.grad_enabled;
            r.grad_enabled = false;
            // Every tile after the second starts where the second did (the output made, the tile before it freed)
            // and does what it did: its marks are the second's. So the first two and the last (which may be shorter)
            // are replayed, and the ones between are skipped without a visit (a million-token sequence has 16384).
            for (const size_t first : tile_starts(rows, tile, 2)) {
                const size_t count = std::min(tile, rows - first);
                Sym piece;
                {
                    const Sym tile_input = r.make(count * columns * r.element);
                    ops.rows = count;
                    piece = function(tile_input);
                    ops.rows = rows;
                }
                if (!output.defined()) output = r.make(rows * columns * r.element);
            }
            r.grad_enabled = previous;
        }
        if (!r.grad_enabled) return output;
        const Target target(input);
        const DecoderReplay* self = this;
        r.record({&input}, output, [=, saved = r.detach(input), output_id = output.id](Context& context) {
            Replay& replay = self->r;
            const Sym output_gradient = context.output_grad(output_id);
            if (!output_gradient.defined()) return;
            Sym input_gradient;
            if (target.requires_grad) input_gradient = replay.make(target.bytes, Account::workspace);
            // Each tile's backward starts where the first's did and does the same: the first and the last are replayed.
            for (const size_t first : self->tile_starts(rows, tile, 1)) {
                const size_t count = std::min(tile, rows - first);
                Tape local;
                Context inner(replay);
                uint64_t tile_id = 0;
                {
                    Sym tile_input = replay.detach(replay.make(count * columns * replay.element));
                    tile_input.requires_grad = target.requires_grad;
                    tile_id = tile_input.id;
                    Tape* previous_tape = replay.tape;
                    const bool previous = replay.grad_enabled;
                    const std::string phase = replay.phase;
                    replay.tape = &local;
                    replay.grad_enabled = true;
                    replay.phase = "recompute";
                    self->ops.rows = count;
                    Sym piece = function(tile_input);
                    self->ops.rows = rows;
                    replay.phase = phase;
                    replay.tape = previous_tape;
                    replay.grad_enabled = previous;
                    const bool reached = piece.requires_grad;
                    const uint64_t piece_id = piece.id;
                    piece = tile_input = Sym();
                    if (reached) inner.seed(piece_id, replay.make(count * columns * replay.element, Account::workspace));
                }
                replay.run_backward(local, inner, " (an MLP tile)");
                if (!target.requires_grad) continue;
                const Sym tile_gradient = inner.take(tile_id); // copied into its rows of input_gradient
            }
            if (input_gradient.defined()) context.seed(target.id, std::move(input_gradient));
        }, true);
        return output;
    }

    // GPT::run_blocks, Llama::run_blocks.
    Sym run_blocks(const Sym& input, int first, int count) const {
        Sym x = input;
        for (int index = first; index < first + count; ++index) {
            r.at("block " + std::to_string(index + 1));
            x = layer_forward(x, index);
        }
        return x;
    }
    // CausalLM::run_decoder (its input by value, as there).
    Sym run_decoder(Sym input) const {
        if (!policy.enabled) return run_blocks(input, 0, layers);
        Sym x = std::move(input);
        for (const checkpoint::Segment& segment : checkpoint::plan_segments(layers, policy)) {
            if (!segment.checkpointed) {
                x = run_blocks(x, segment.first_layer, segment.layer_count);
                continue;
            }
            x = checkpoint_segment(x, segment);
        }
        return x;
    }
    // checkpoint::checkpoint over one segment: its forward under no-grad, the input kept (a pinned copy with
    // offload); in backward the input back on the device, the segment recomputed on a tape of its own and walked.
    Sym checkpoint_segment(const Sym& input, const checkpoint::Segment& segment) const {
        if (!r.grad_enabled) {
            // Nothing to keep. At ZeRO-3 the segment hooks gather its weights before and release them after.
            const size_t gathered = gathered_layer * static_cast<size_t>(segment.layer_count);
            r.ledger.hold(gathered);
            Sym output = run_blocks(input, segment.first_layer, segment.layer_count);
            r.ledger.let_go(gathered);
            return output;
        }
        Sym output;
        {
            const bool previous = r.grad_enabled;
            r.grad_enabled = false;
            r.phase = "no-grad forward";
            output = run_blocks(input, segment.first_layer, segment.layer_count);
            r.phase = "forward";
            r.grad_enabled = previous;
        }
        const bool offloaded = policy.offload;
        Sym saved = offloaded ? r.make(input.bytes, Account::pinned_host) : r.detach(input);
        const bool input_requires_grad = input.requires_grad;
        const Target input_target(input);
        output = r.detach(output);
        const std::string name = segment_name(segment);
        auto state = std::make_shared<Sym>(saved);
        const DecoderReplay* self = this;
        r.record({&input}, output, [=, output_id = output.id](Context& context) {
            Replay& replay = self->r;
            replay.ledger.at("recompute of ", name, " in backward");
            Sym recompute_input = offloaded ? replay.make(state->bytes) : replay.detach(*state);
            *state = Sym();
            recompute_input = replay.detach(recompute_input); // as_non_leaf: a fresh identity
            recompute_input.requires_grad = input_requires_grad;
            const uint64_t recompute_id = recompute_input.id;
            Tape local;
            Sym recomputed;
            {
                Tape* previous_tape = replay.tape;
                const bool previous = replay.grad_enabled;
                replay.tape = &local;
                replay.grad_enabled = true;
                replay.phase = "recompute";
                recomputed = self->run_blocks(recompute_input, segment.first_layer, segment.layer_count);
                replay.phase = "forward";
                replay.tape = previous_tape;
                replay.grad_enabled = previous;
            }
            recompute_input = Sym();
            Context inner(replay);
            const Sym gradient = context.output_grad(output_id);
            if (gradient.defined() && recomputed.requires_grad) inner.seed(recomputed.id, gradient);
            recomputed = Sym();
            replay.run_backward(local, inner, " (recomputed)");
            if (input_requires_grad) {
                Sym dinput = inner.take(recompute_id);
                if (dinput.defined()) context.seed(input_target.id, std::move(dinput));
            }
        }, true);
        return output;
    }
    static std::string segment_name(const checkpoint::Segment& segment) {
        std::string text = segment.layer_count > 1 ? "blocks " : "block ";
        text += std::to_string(segment.first_layer + 1);
        if (segment.layer_count > 1) text += "-" + std::to_string(segment.first_layer + segment.layer_count);
        return text;
    }
    // CausalLM::forward_padded: the head's GEMM over the frozen (Vp,C) weight.
    Sym forward_padded() const {
        const Sym hidden = forward_hidden();
        r.at("the LM head");
        r.ledger.hold(gathered_table); // ZeRO-3's head, for its GEMM (an evaluation's: no backward reads it again)
        const Sym logits = ops.matmul(hidden, r.parameter(false), head_columns);
        r.ledger.let_go(gathered_table);
        return logits;
    }
};

class LlamaReplay : public DecoderReplay {
public:
    LlamaReplay(Replay& replay, const nn::LlamaConfig& config, size_t rows, const nn::LoraConfig& lora, bool nf4,
                const checkpoint::CheckpointPolicy& policy, int mlp_tile_tokens)
        : DecoderReplay(replay, rows, lora, nf4, policy, config.num_hidden_layers,
                        static_cast<size_t>(config.hidden_size), static_cast<size_t>(config.vocab_size),
                        mlp_tile_tokens),
          config(config), key_value(static_cast<size_t>(config.key_value_width())),
          intermediate(static_cast<size_t>(config.intermediate_size)) {}

    const nn::LlamaConfig& config;
    const size_t key_value, intermediate;

    std::string layer_name(int index, const std::string& name) const override {
        return "model.layers." + std::to_string(index) + "." + name;
    }
    // LlamaAttention::forward.
    Sym attention_forward(const Sym& input, int index) const {
        const Sym query = ops.rope(linear_forward(layer(index, "self_attn.q_proj", width, width), input), width);
        const Sym key = ops.rope(linear_forward(layer(index, "self_attn.k_proj", width, key_value), input), key_value);
        const Sym packed = ops.concat({query, key, linear_forward(layer(index, "self_attn.v_proj", width, key_value), input)},
                                      {width, key_value, key_value});
        return linear_forward(layer(index, "self_attn.o_proj", width, width),
                              ops.attention(packed, width, static_cast<size_t>(config.num_attention_heads)));
    }
    // LlamaMLP::forward, whole or tiled.
    Sym mlp_forward(const Sym& input, int index) const {
        const auto rows = [this, index](const Sym& x) {
            return linear_forward(layer(index, "mlp.down_proj", intermediate, width),
                                  ops.swiglu(linear_forward(layer(index, "mlp.gate_proj", width, intermediate), x),
                                             linear_forward(layer(index, "mlp.up_proj", width, intermediate), x),
                                             intermediate));
        };
        return mlp_tile == 0 ? rows(input) : tiled_rows(rows, input, width);
    }
    // LlamaDecoderLayer::forward.
    Sym layer_forward(const Sym& input, int index) const override {
        const Sym after_attention =
            ops.add(input, attention_forward(ops.rms_norm(input, r.parameter(false), width), index), width);
        return ops.add(after_attention, mlp_forward(ops.rms_norm(after_attention, r.parameter(false), width), index),
                       width);
    }
    // Llama::forward_hidden: the embedding, the decoder, the final norm.
    Sym forward_hidden() const override {
        r.at("the embedding");
        r.ledger.hold(gathered_table); // ZeRO-3's token table, for the lookup only
        Sym x = ops.embedding(width);
        r.ledger.let_go(gathered_table);
        const Sym hidden = final_norm(run_decoder(std::move(x)));
        return hidden;
    }
    Sym final_norm(const Sym& input) const {
        r.at("the final norm");
        return ops.rms_norm(input, r.parameter(false), width);
    }
};

class GptReplay : public DecoderReplay {
public:
    GptReplay(Replay& replay, const nn::GPTConfig& config, size_t rows, const nn::LoraConfig& lora, bool nf4,
              const checkpoint::CheckpointPolicy& policy, int mlp_tile_tokens)
        : DecoderReplay(replay, rows, lora, nf4, policy, config.n_layer, static_cast<size_t>(config.n_embd),
                        static_cast<size_t>(config.padded_vocab_size()), mlp_tile_tokens),
          config(config) {}

    const nn::GPTConfig& config;

    std::string layer_name(int index, const std::string& name) const override {
        return "h." + std::to_string(index) + "." + name;
    }
    // CausalSelfAttention::forward.
    Sym attention_forward(const Sym& input, int index) const {
        return dropout(linear_forward(layer(index, "attn.c_proj", width, width),
                                      ops.attention(linear_forward(layer(index, "attn.c_attn", width, 3 * width), input),
                                                    width, static_cast<size_t>(config.n_head))),
                       config.dropout, width);
    }
    // MLP::forward, whole or tiled.
    Sym mlp_forward(const Sym& input, int index) const {
        const auto rows = [this, index](const Sym& x) {
            return linear_forward(layer(index, "mlp.c_proj", 4 * width, width),
                                  ops.gelu(linear_forward(layer(index, "mlp.c_fc", width, 4 * width), x), 4 * width));
        };
        // Untiled, one expression, as there: c_fc's and gelu's outputs live until the dropout is done.
        if (mlp_tile == 0)
            return dropout(linear_forward(layer(index, "mlp.c_proj", 4 * width, width),
                                          ops.gelu(linear_forward(layer(index, "mlp.c_fc", width, 4 * width), input),
                                                   4 * width)),
                           config.dropout, width);
        return dropout(tiled_rows(rows, input, width), config.dropout, width);
    }
    // Block::forward.
    Sym layer_forward(const Sym& input, int index) const override {
        Sym after_attention = ops.add(input, attention_forward(ops.layernorm(input, width), index), width);
        return ops.add(after_attention, mlp_forward(ops.layernorm(after_attention, width), index), width);
    }
    // GPT::forward_hidden: the token and position embeddings (and their dropout), the decoder, ln_f.
    Sym forward_hidden() const override {
        r.at("the embedding");
        Sym x = dropout(ops.embedding(width), config.dropout, width);
        const Sym hidden = final_norm(run_decoder(std::move(x)));
        return hidden;
    }
    Sym final_norm(const Sym& input) const {
        r.at("the final norm");
        return ops.layernorm(input, width);
    }
};

} // namespace

namespace {

// One micro-batch through `model`: optim::Trainer's loss (the fused classifier over the logits, which die with their
// statement, or the streaming head over the hidden states); in training, the caller's copy of it, the scaled loss
// and backward from a (1) seed; in an evaluation (no-grad, eval mode), the sum read and dropped.
AdapterStepWalk run_micro_batch(Replay& replay, const DecoderReplay& model, int loss_chunk_tokens, bool evaluation) {
    ENGINE_CHECK(loss_chunk_tokens >= 0, "the LoRA step's replay: loss_chunk_tokens " << loss_chunk_tokens << " must be >= 0");
    {
        Sym sum;
        if (loss_chunk_tokens > 0) {
            const Sym hidden = model.forward_hidden();
            replay.at("the LM head");
            replay.ledger.hold(model.gathered_table); // ZeRO-3's head, for the streaming head (CausalLM::head_input)
            sum = model.ops.linear_cross_entropy(hidden, model.width, model.head_columns, model.vocabulary,
                                                 static_cast<size_t>(loss_chunk_tokens));
            replay.ledger.let_go(model.gathered_table);
        } else {
            const Sym logits = model.forward_padded();
            sum = model.ops.cross_entropy_in_place(logits, model.head_columns, model.vocabulary);
        }
        if (!evaluation) {
            replay.at("the loss");
            const Sym scaled = model.ops.multiply(sum, replay.wide);
            Context context(replay);
            context.seed(scaled.id, replay.make(replay.wide, Account::workspace));
            replay.run_backward(replay.global_tape, context);
        }
    }
    return replay.ledger.walk();
}

std::unique_ptr<DecoderReplay> model_replay(Replay& replay, const nn::ModelConfig& config, int batch, int seq_len,
                                            const checkpoint::CheckpointPolicy& policy, const nn::LoraConfig& lora,
                                            bool nf4, int mlp_tile_tokens) {
    // The walks are public: what predict_memory checks first is checked here too, so that a bad shape or config is
    // one clear error, not a replay of nonsense sizes.
    config.validate();
    ENGINE_CHECK(batch > 0 && seq_len > 0 && seq_len <= config.max_seq_len(),
                 "the LoRA step's replay: batch " << batch << " and seq_len " << seq_len
                                                  << " must be positive, seq_len at most " << config.max_seq_len());
    ENGINE_CHECK(mlp_tile_tokens >= 0, "the LoRA step's replay: mlp_tile_tokens " << mlp_tile_tokens << " must be >= 0");
    if (const std::optional<std::string> problem = lora.problem(); problem && !lora.target_modules.empty())
        ENGINE_FAIL("the LoRA step's replay: LoRA: " << *problem);
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    std::unique_ptr<DecoderReplay> model;
    if (config.is_llama()) model = std::make_unique<LlamaReplay>(replay, config.llama(), rows, lora, nf4, policy, mlp_tile_tokens);
    else model = std::make_unique<GptReplay>(replay, config.gpt(), rows, lora, nf4, policy, mlp_tile_tokens);
    model->vocabulary = static_cast<size_t>(config.vocab_size());
    return model;
}

} // namespace

AdapterStepWalk walk_adapter_step(const nn::ModelConfig& config, int batch, int seq_len,
                                  const checkpoint::CheckpointPolicy& policy, DType dtype, const nn::LoraConfig& lora,
                                  bool nf4, int loss_chunk_tokens, int mlp_tile_tokens,
                                  std::vector<AdapterStepEvent>* events) {
    Replay replay(dtype);
    replay.ledger.record_events(events);
    replay.every_tile = events != nullptr; // the events list is the allocator's whole sequence
    const std::unique_ptr<DecoderReplay> model =
        model_replay(replay, config, batch, seq_len, policy, lora, nf4, mlp_tile_tokens);
    return run_micro_batch(replay, *model, loss_chunk_tokens, false);
}

AdapterStepWalk walk_evaluation(const nn::ModelConfig& config, int batch, int seq_len,
                                const checkpoint::CheckpointPolicy& policy, DType dtype, const FineTuning& tuning,
                                int loss_chunk_tokens, int mlp_tile_tokens, std::vector<AdapterStepEvent>* events,
                                size_t gathered_layer_bytes, size_t gathered_table_bytes) {
    Replay replay(dtype);
    replay.ledger.record_events(events);
    replay.every_tile = events != nullptr;
    replay.grad_enabled = false; // Trainer::evaluate: NoGradGuard, eval mode
    replay.phase = "evaluation";
    const nn::LoraConfig no_adapters{.target_modules = {}};
    const std::unique_ptr<DecoderReplay> model = model_replay(
        replay, config, batch, seq_len, policy, tuning.lora ? *tuning.lora : no_adapters, tuning.nf4, mlp_tile_tokens);
    model->training = false;
    model->gathered_layer = gathered_layer_bytes;
    model->gathered_table = gathered_table_bytes;
    return run_micro_batch(replay, *model, loss_chunk_tokens, true);
}

MemoryPrediction predict_adapter_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                        const checkpoint::CheckpointPolicy& policy, DType dtype, OptimizerKind optimizer,
                                        int optimizer_shards, int accumulation_steps, bool offload_optimizer,
                                        bool offload_parameters, int loss_chunk_tokens, int mlp_tile_tokens,
                                        bool packed_documents, const FineTuning& tuning) {
    constexpr const char* what = "predict_memory: the LoRA step";
    ENGINE_CHECK(tuning.lora.has_value(), what << " needs a LoRA config");
    ENGINE_CHECK(!offload_optimizer && !offload_parameters,
                 what << " with the optimizer or parameters off the device is not modelled yet");
    ENGINE_CHECK(optimizer_shards == 1, what << " under ZeRO-1 (" << optimizer_shards << " shards) is not modelled yet");
    const ModelState state = predict_model_state(config, dtype, optimizer, optimizer_shards, tuning);
    const AdapterStepWalk walk =
        walk_adapter_step(config, batch, seq_len, policy, dtype, *tuning.lora, tuning.nf4, loss_chunk_tokens,
                          mlp_tile_tokens);

    MemoryPrediction prediction;
    prediction.at(MemoryCategory::parameters) = state.parameters;
    prediction.at(MemoryCategory::gradients) = state.gradients;
    prediction.at(MemoryCategory::optimizer_state) = state.optimizer_state;
    prediction.at(MemoryCategory::activations) = walk.activations;
    prediction.at(MemoryCategory::workspace) = walk.workspace;
    prediction.at(MemoryCategory::pinned_host) = walk.pinned_host;
    prediction.master_parameters = state.master_parameters;
    prediction.working_copies = state.working_copies;
    prediction.constant_buffers = state.constant_buffers;
    prediction.activations_peak_moment = walk.activations_moment;
    for (const checkpoint::Segment& segment : checkpoint::plan_segments(config.layers(), policy))
        if (segment.checkpointed) {
            ++prediction.checkpointed_segments;
            prediction.recomputed_blocks += segment.layer_count;
        }
    // Before the step, as for a full fine-tune (predict_memory): the model state, every micro-batch's ids and
    // labels (and positions), the current one's device copies, and the earlier micro-batches' reported losses.
    const size_t ids = static_cast<size_t>(batch) * static_cast<size_t>(seq_len) * sizeof(int32_t);
    const size_t steps = static_cast<size_t>(accumulation_steps);
    const size_t per_batch = packed_documents ? 3 : 2;
    const size_t before_forward = state.total() + steps * per_batch * ids + per_batch * ids +
                                  (steps - 1) * dtype_size(compute_dtype(dtype));
    prediction.peak_bytes = before_forward + walk.joint;
    prediction.peak_moment = walk.joint_moment;
    prediction.between_steps_bytes = state.total();
    prediction.pinned_peak_bytes = std::max(walk.pinned_host, ids); // see MemoryPrediction: no parked copies here
    prediction.unified_peak_bytes = before_forward + walk.unified_joint;
    prediction.host_peak_bytes = walk.pinned_host;
    // GPT-2's biased linears run through cuBLASLt's fused epilogue, frozen or not; Llama has no bias.
    prediction.cuda_runtime_bytes = config.is_llama() ? 0 : cuda::cublaslt_workspace_bytes;
    return prediction;
}

} // namespace engine::planner
