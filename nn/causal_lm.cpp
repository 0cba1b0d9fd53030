// The parts every causal LM shares: the checkpointed decoder stack and the real-vocabulary forward.
#include "nn/causal_lm.h"

namespace engine::nn {

Tensor CausalLM::forward_padded(const Tensor& tokens, const Tensor& positions) const {
    return padded_logits(forward_hidden(tokens, positions));
}

Tensor CausalLM::forward(const Tensor& tokens, const Tensor& positions) const {
    return logits(forward_hidden(tokens, positions));
}

Tensor CausalLM::padded_logits(const Tensor& hidden) const {
    Tensor out = matmul(head_input(hidden), head_weight(), /*transpose_b=*/true); // (B,T,Vp)
    head_done();
    return out;
}

Tensor CausalLM::head_input(const Tensor& hidden) const {
    return table_hooks_.before_head ? table_hooks_.before_head(hidden) : hidden;
}

void CausalLM::head_done() const {
    if (table_hooks_.after_head) table_hooks_.after_head();
}

Tensor CausalLM::logits(const Tensor& hidden) const {
    const Tensor padded = padded_logits(hidden); // (B,T,Vp)
    return padded_vocab_size() == vocab_size() ? padded : first_columns(padded, vocab_size());
}

Tensor CausalLM::look_up(const std::function<Tensor()>& lookup) const {
    if (table_hooks_.before_lookup) table_hooks_.before_lookup();
    Tensor out = lookup();
    return table_hooks_.after_lookup ? table_hooks_.after_lookup(out) : out;
}

void CausalLM::set_checkpointing(const checkpoint::CheckpointPolicy& policy) {
    segments_ = checkpoint::plan_segments(block_count(), policy);
    policy_ = policy;
}

void CausalLM::set_mlp_tile_tokens(int tokens) {
    ENGINE_CHECK(tokens >= 0, "set_mlp_tile_tokens: a tile of " << tokens << " tokens; it must be >= 1, or 0 for none");
    tile_mlps(tokens);
    mlp_tile_tokens_ = tokens;
}

Tensor CausalLM::run_decoder(Tensor input, const Tensor& positions) const {
    if (!policy_.enabled) return run_blocks(input, 0, block_count(), positions);
    Tensor x = std::move(input);
    for (const checkpoint::Segment& segment : segments_) {
        if (!segment.checkpointed) {
            x = run_blocks(x, segment.first_layer, segment.layer_count, positions);
            continue;
        }
        // The recompute in backward reads the same positions: the closure keeps them (an int tensor the caller
        // holds anyway, so no memory of its own).
        auto blocks = [this, segment, positions](const std::vector<Tensor>& inputs) {
            return std::vector<Tensor>{run_blocks(inputs[0], segment.first_layer, segment.layer_count, positions)};
        };
        checkpoint::SegmentHooks hooks;
        if (segment_hooks_) hooks = segment_hooks_(segment.first_layer, segment.layer_count);
        x = checkpoint::checkpoint(blocks, {x}, policy_.offload, policy_.prefetch, std::move(hooks))[0];
    }
    return x;
}

void CausalLM::check_tokens(const char* model, const Tensor& tokens, const Tensor& positions) const {
    ENGINE_CHECK(tokens.dim() == 2, model << "::forward: tokens " << tokens.describe() << " must be (B,T)");
    ENGINE_CHECK(tokens.size(1) <= max_seq_len(), model << "::forward: sequence length " << tokens.size(1)
                                                        << " exceeds the model maximum " << max_seq_len());
    if (positions.defined())
        check_document_positions((std::string(model) + "::forward").c_str(), positions, tokens.size(0), tokens.size(1),
                                 tokens.device(), max_seq_len());
}

} // namespace engine::nn
