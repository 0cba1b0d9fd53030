// GPT-2: token + position embeddings, pre-LayerNorm blocks, a final LayerNorm and an LM head tied to the
// token embedding. Blocks are the only checkpointable layers (nn/causal_lm.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/causal_lm.h"
#include "nn/layers.h"

namespace engine::nn {

struct GPTConfig {
    int vocab_size = 256;
    int max_seq_len = 64;
    int n_layer = 2;
    int n_head = 2;
    int n_embd = 64;
    float dropout = 0.0f;

    // Named sizes: "tiny", "small", "gpt2-124M", "gpt2-350M", "gpt2-774M", "gpt2-1558M". Throws on others.
    static GPTConfig named(const std::string& name);
    // The LM head's row count: vocab_size rounded up to a multiple of 128, so that the head's GEMM has an
    // aligned leading dimension (GPT-2's 50257 becomes 50304). The rows beyond vocab_size are zero.
    static constexpr int vocab_padding_multiple = 128;
    int padded_vocab_size() const {
        return (vocab_size + vocab_padding_multiple - 1) / vocab_padding_multiple * vocab_padding_multiple;
    }
    std::string to_string() const;
    std::optional<ConfigProblem> problem() const; // the first bad field, or none
    void validate() const; // throws EngineError naming the bad field
};

class GPT : public CausalLM {
    // Declared first: the parameter members below are initialised from these.
    GPTConfig config_;
    // The model's own: every parameter takes its next stream, from 0, in construction order (wte, wpe, ln_f,
    // then the blocks), which is what keeps a seed's initial weights the same from release to release.
    std::shared_ptr<Generator> generator_;

public:
    // dtype: f32 or f64 parameters and activations; bf16 is mixed precision: f32 parameters (the masters,
    // initialised exactly as with f32) with bf16 working copies that the forward reads, so activations and
    // logits are bf16 (Module::set_compute_dtype).
    GPT(const GPTConfig& config, uint64_t seed, Device device = Device::cpu, DType dtype = DType::f32);

    // The final LayerNorm's output (B,T,C); the head's logits (B,T,Vp) (forward_padded) have their columns from V
    // on as padding (0, from the zero rows of wte).
    Tensor forward_hidden(const Tensor& tokens, const Tensor& positions = Tensor()) const override;
    Tensor head_weight() const override; // (Vp,C): wte through its padded rows
    int vocab_size() const override { return config_.vocab_size; }
    int padded_vocab_size() const override { return config_.padded_vocab_size(); }
    int max_seq_len() const override { return config_.max_seq_len; }
    std::string architecture() const override { return "gpt2"; }
    Device device() const override { return compute_device(); }
    // The transformer blocks, for the checkpoint policy.
    int block_count() const override { return static_cast<int>(h.size()); }
    Module& block(int index) override { return *h.at(static_cast<size_t>(index)); }
    Tensor run_blocks(const Tensor& input, int first_block, int block_count,
                      const Tensor& positions = Tensor()) const override;

    const GPTConfig& config() const { return config_; }

protected:
    void tile_mlps(int tokens) override {
        for (const std::unique_ptr<Block>& block : h) block->mlp.tile_rows = tokens;
    }

public:

    Embedding wte, wpe; // wte.weight (V,C), stored in a (Vp,C) allocation: wte.padded_weight
    Dropout drop;
    std::vector<std::unique_ptr<Block>> h;
    LayerNorm ln_f;
};

} // namespace engine::nn
