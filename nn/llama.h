// Llama-family decoders (Llama, Mistral without sliding windows, SmolLM) as Hugging Face's LlamaForCausalLM:
// RMSNorm, rotary position embeddings (rotate-half), grouped-query causal attention, the SwiGLU MLP, no biases,
// and a tied or untied LM head. Parameter names are LlamaForCausalLM's ("model.layers.0.self_attn.q_proj.weight"),
// projection weights (out, in) as torch.nn.Linear stores them, so Hugging Face checkpoints map one to one.
// Each decoder layer is the unit checkpoint policies count (nn/causal_lm.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/causal_lm.h"
#include "nn/layers.h"

namespace engine::nn {

// Field names and defaults follow transformers' LlamaConfig where they matter; the defaults are llama-tiny's.
struct LlamaConfig {
    int vocab_size = 256;
    int hidden_size = 64;
    int intermediate_size = 176;
    int num_hidden_layers = 4;
    int num_attention_heads = 4;
    int num_key_value_heads = 2; // divides num_attention_heads; equal to it is plain multi-head attention
    int max_position_embeddings = 64;
    double rms_norm_eps = 1e-5;
    double rope_theta = 10000.0;
    bool tie_word_embeddings = false;
    double initializer_range = 0.02; // the standard deviation of every initial weight

    int head_dim() const { return hidden_size / num_attention_heads; }
    int key_value_width() const { return num_key_value_heads * head_dim(); } // K (and V) per token

    // Named sizes: "llama-tiny" (about 200k parameters, for tests and the CPU) and "smollm-135m" (SmolLM-135M's
    // published shape). Throws on others.
    static LlamaConfig named(const std::string& name);
    static bool is_name(const std::string& name);
    std::string to_string() const;
    std::optional<ConfigProblem> problem() const; // the first bad field, or none
    void validate() const;                        // throws EngineError naming the bad field
};

// The rotary tables (max_position_embeddings, head_dim/2) cos and sin (rope_tables), in the compute type of the
// activations on their device. Built with the model; rebuilt on first use after Module::to moves the model, or
// for activations of another compute type.
class RopeCache {
public:
    RopeCache(int positions, int head_size, double theta, DType dtype, Device device);
    const RopeTables& tables_for(const Tensor& activations) const;

private:
    int positions_, head_size_;
    double theta_;
    mutable RopeTables tables_;
};

class LlamaAttention : public Layer {
public:
    LlamaAttention(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init);
    // (B,T,C) -> (B,T,C): q, k rotated, then causal attention of NH query heads over KVH key/value heads.
    Tensor forward(const Tensor& input) const override { return forward(input, Tensor()); }
    // positions (B,T) i32 or undefined: packed documents, rotated by their position in the document and attending
    // within it only (engine::rope, engine::attention).
    Tensor forward(const Tensor& input, const Tensor& positions) const;
    int heads, key_value_heads, head_size;
    TorchLinear q_proj, k_proj, v_proj, o_proj;

private:
    const RopeCache& rope_;
};

class LlamaMLP : public Layer {
public:
    LlamaMLP(const LlamaConfig& config, const InitOptions& init);
    // down(silu(gate(x)) * up(x)); with tile_rows > 0 over tiles of that many of the input's rows
    // (checkpoint::tiled_rows: the sequence-tiled MLP).
    Tensor forward(const Tensor& input) const override;
    TorchLinear gate_proj, up_proj, down_proj;
    int64_t tile_rows = 0; // 0: untiled (CausalLM::set_mlp_tile_tokens)
};

// x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(·)). The checkpointable unit.
class LlamaDecoderLayer : public Layer {
public:
    LlamaDecoderLayer(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init);
    Tensor forward(const Tensor& input) const override { return forward(input, Tensor()); }
    Tensor forward(const Tensor& input, const Tensor& positions) const; // packed documents: LlamaAttention's
    RMSNorm input_layernorm;
    LlamaAttention self_attn;
    RMSNorm post_attention_layernorm;
    LlamaMLP mlp;
};

// LlamaModel: the decoder without its head (the "model." of every parameter name).
class LlamaModel : public Module {
public:
    LlamaModel(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init);
    Embedding embed_tokens; // (V,C)
    std::vector<std::unique_ptr<LlamaDecoderLayer>> layers;
    RMSNorm norm;
};

class Llama : public CausalLM {
    // Declared first: the members below are initialised from these.
    LlamaConfig config_;
    std::shared_ptr<Generator> generator_; // each parameter takes its next stream in construction order
    RopeCache rope_;

public:
    // dtype: f32 or f64 parameters and activations; bf16 is mixed precision (f32 masters, bf16 working copies).
    Llama(const LlamaConfig& config, uint64_t seed, Device device = Device::cpu, DType dtype = DType::f32);

    // (B,T) -> the final RMSNorm's output (B,T,C); the head (V,C) pads nothing, so forward_padded is (B,T,V).
    Tensor forward_hidden(const Tensor& tokens, const Tensor& positions = Tensor()) const override;
    Tensor head_weight() const override;
    int vocab_size() const override { return config_.vocab_size; }
    int max_seq_len() const override { return config_.max_position_embeddings; }
    std::string architecture() const override { return "llama"; }
    Device device() const override { return compute_device(); }
    int block_count() const override { return static_cast<int>(model.layers.size()); }
    Module& block(int index) override { return *model.layers.at(static_cast<size_t>(index)); }
    Module* token_table() override { return &model.embed_tokens; }
    Module* untied_head() override { return lm_head.get(); }
    Tensor run_blocks(const Tensor& input, int first_block, int count,
                      const Tensor& positions = Tensor()) const override;

    const LlamaConfig& config() const { return config_; }

protected:
    void tile_mlps(int tokens) override {
        for (const std::unique_ptr<LlamaDecoderLayer>& layer : model.layers) layer->mlp.tile_rows = tokens;
    }

public:
    LlamaModel model;
    std::unique_ptr<TorchLinear> lm_head; // null when tie_word_embeddings: the head reads model.embed_tokens
};

} // namespace engine::nn
