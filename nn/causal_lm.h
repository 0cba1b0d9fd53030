// CausalLM: what a decoder-only language model is to the trainer, the planner and train_gpt (GPT-2 and Llama
// derive from it): token ids in, next-token logits out, and a stack of decoder layers that checkpoint policies
// count (Hugging Face's GradientCheckpointingLayer).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "nn/module.h"

namespace engine::nn {

class CausalLM : public Module {
public:
    // tokens (B,T) i32 -> the final norm's output (B,T,C): what the LM head reads. positions (B,T) i32 on the
    // model's device, or undefined: packed documents (--data-layout packed-documents), each row several documents
    // back to back, positions restarting at 0 at each (engine::check_document_positions); positions (GPT-2's table,
    // Llama's rotation) are taken from it and attention stays within each document. Undefined: one sequence a row.
    virtual Tensor forward_hidden(const Tensor& tokens, const Tensor& positions = Tensor()) const = 0;
    // The LM head's weight (Vp,C) as the forward reads it (the working copy): logits = hidden · head_weight()ᵀ.
    // GPT-2: the token table through its padded rows (tied); Llama: lm_head, or embed_tokens when tied.
    virtual Tensor head_weight() const = 0;
    // tokens (B,T) i32 -> logits (B,T,Vp), Vp = padded_vocab_size(): the head over forward_hidden. Columns from
    // vocab_size() on are padding (zero): pass vocab_size() to the loss (cross_entropy_in_place's vocabulary),
    // which keeps them out of the softmax. The trainer's built-in loss uses this, or with loss chunks the
    // streaming head (linear_cross_entropy over forward_hidden and head_weight) that never holds the logits.
    Tensor forward_padded(const Tensor& tokens, const Tensor& positions = Tensor()) const;
    // tokens (B,T) i32 -> logits (B,T,V): the real vocabulary (a copy of the padded logits' first V columns
    // when the model pads it).
    Tensor forward(const Tensor& tokens, const Tensor& positions = Tensor()) const;
    // The head over forward_hidden's output: (B,T,C) -> padded logits (B,T,Vp), and the real (B,T,V), between the
    // head hooks (TableHooks). The two above are these over forward_hidden.
    Tensor padded_logits(const Tensor& hidden) const;
    Tensor logits(const Tensor& hidden) const;
    // For code that reads head_weight() itself (the streaming head): what the head hooks do around padded_logits.
    // head_input returns what to read in place of `hidden` (the head is gathered); head_done ends the use under no-grad.
    Tensor head_input(const Tensor& hidden) const;
    void head_done() const;

    virtual int vocab_size() const = 0;
    virtual int padded_vocab_size() const { return vocab_size(); }
    virtual int max_seq_len() const = 0;
    // Hugging Face's model_type: "gpt2", "llama".
    virtual std::string architecture() const = 0;

    // The decoder layers, for the checkpoint policy: block_count() of them, run_blocks chaining [first, first+count)
    // (positions: forward_hidden's).
    virtual int block_count() const = 0;
    virtual Tensor run_blocks(const Tensor& input, int first_block, int count,
                              const Tensor& positions = Tensor()) const = 0;
    // Applies a checkpoint policy to the decoder layers (the only checkpointable layers); disabled = plain.
    void set_checkpointing(const checkpoint::CheckpointPolicy& policy) override;
    const checkpoint::CheckpointPolicy& checkpointing() const { return policy_; }
    const std::vector<checkpoint::Segment>& segments() const { return segments_; }
    // The sequence-tiled MLP (StepShape::mlp_tile_tokens; docs/MEMORY.md, "The tiled MLP"): every decoder layer's
    // MLP runs over tiles of this many of the micro-batch's B·T tokens (checkpoint::tiled_rows), in forward,
    // recompute and backward alike; 0: whole. Throws below 0.
    void set_mlp_tile_tokens(int tokens);
    int mlp_tile_tokens() const { return mlp_tile_tokens_; }
    // Decoder layer `index` as a module (its parameters, its working copies).
    virtual Module& block(int index) = 0;
    // What runs inside each checkpointed segment's backward (checkpoint::SegmentHooks), asked of `hooks` per
    // segment with its first layer and layer count: the trainer's streamed gradients. Empty: nothing.
    using SegmentHooksFor = std::function<checkpoint::SegmentHooks(int first_layer, int layer_count)>;
    void set_segment_hooks(SegmentHooksFor hooks) { segment_hooks_ = std::move(hooks); }

    // ZeRO-2 and 3 shard the token table (and an untied LM head) too when the table is a module of its own, looked up
    // through look_up (Llama's embed_tokens; its lm_head when untied, else the head is the table). nullptr: not
    // separable (GPT-2's wte, read with wpe in one op and with padded rows the head reads): it stays whole.
    virtual Module* token_table() { return nullptr; }
    virtual Module* untied_head() { return nullptr; }
    // What runs around the token table's lookup in forward_hidden (the trainer's ZeRO-3 gather before it; after it,
    // the release, and the hook that gives the table gradient storage before the lookup's backward, which gets the
    // lookup's output and returns what the decoder reads), and around the head's use (before it: the head gathered,
    // its gradient storage given, and what the head reads in place of the hidden states returned, whose backward
    // reduces and releases; after it, under no-grad, the release). Empty: nothing.
    struct TableHooks {
        std::function<void()> before_lookup;
        std::function<Tensor(const Tensor&)> after_lookup;
        std::function<Tensor(const Tensor&)> before_head;
        std::function<void()> after_head;
    };
    void set_table_hooks(TableHooks hooks) { table_hooks_ = std::move(hooks); }

    // Where the forward runs: the parameters' device (Module::to moves them), or with the masters on the host
    // (set_master_device) the working copies'.
    virtual Device device() const = 0;
    DType dtype() const { return compute_dtype(); } // what the forward computes in: the activations' dtype

protected:
    // Gives every decoder layer's MLP the tile (set_mlp_tile_tokens has checked it).
    virtual void tile_mlps(int tokens) = 0;
    // All decoder layers under the policy: checkpointed segments through checkpoint::checkpoint, the rest plain.
    // Takes its input by value and drops it after the first segment: callers move their handle in, so that an
    // offloaded first segment's input (the embedding output) leaves the device as soon as it is copied out.
    Tensor run_decoder(Tensor input, const Tensor& positions = Tensor()) const;
    // The token table's lookup `lookup` between the table hooks (set_table_hooks).
    Tensor look_up(const std::function<Tensor()>& lookup) const;
    // Refuses tokens that are not (B,T) or longer than max_seq_len(), naming `model`, and positions (when defined)
    // that are not packed documents' for them (engine::check_document_positions).
    void check_tokens(const char* model, const Tensor& tokens, const Tensor& positions = Tensor()) const;

private:
    checkpoint::CheckpointPolicy policy_;
    std::vector<checkpoint::Segment> segments_;
    SegmentHooksFor segment_hooks_;
    TableHooks table_hooks_;
    int mlp_tile_tokens_ = 0;
};

} // namespace engine::nn
