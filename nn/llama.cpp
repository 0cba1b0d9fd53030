// The Llama decoder's layers and forward, and its named configurations.
#include "nn/llama.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "nn/config_limits.h"

namespace engine::nn {
namespace {

InitOptions make_init(const std::shared_ptr<Generator>& generator, const LlamaConfig& config, Device device,
                      DType dtype) {
    ParameterOptions parameters;
    parameters.generator = generator;
    parameters.device = device;
    parameters.dtype = compute_dtype(dtype); // bf16: f32 masters
    return InitOptions(parameters, config.initializer_range);
}

} // namespace

LlamaConfig LlamaConfig::named(const std::string& name) {
    LlamaConfig config;
    if (name == "llama-tiny") return config;
    if (name == "smollm-135m") {
        config.vocab_size = 49152;
        config.hidden_size = 576;
        config.intermediate_size = 1536;
        config.num_hidden_layers = 30;
        config.num_attention_heads = 9;
        config.num_key_value_heads = 3;
        config.max_position_embeddings = 2048;
        config.rms_norm_eps = 1e-5;
        config.rope_theta = 10000.0;
        config.tie_word_embeddings = true;
        return config;
    }
    ENGINE_FAIL("unknown Llama model name '" << name << "' (known: llama-tiny, smollm-135m)");
}

bool LlamaConfig::is_name(const std::string& name) { return name == "llama-tiny" || name == "smollm-135m"; }

std::string LlamaConfig::to_string() const {
    std::ostringstream text;
    text << "llama: vocab " << vocab_size << ", max_seq_len " << max_position_embeddings << ", layers "
         << num_hidden_layers << ", heads " << num_attention_heads << " (" << num_key_value_heads << " key/value), width "
         << hidden_size << ", intermediate " << intermediate_size << ", rope_theta " << rope_theta << ", rms_norm_eps "
         << rms_norm_eps << (tie_word_embeddings ? ", tied head" : ", untied head");
    return text.str();
}

std::optional<ConfigProblem> LlamaConfig::problem() const {
    auto positive = [](const char* field, int value) -> std::optional<ConfigProblem> {
        if (value > 0) return std::nullopt;
        return ConfigProblem{field, "must be positive, got " + std::to_string(value)};
    };
    for (const auto& found :
         {positive("vocab_size", vocab_size), positive("hidden_size", hidden_size),
          positive("intermediate_size", intermediate_size), positive("num_hidden_layers", num_hidden_layers),
          positive("num_attention_heads", num_attention_heads), positive("num_key_value_heads", num_key_value_heads),
          positive("max_position_embeddings", max_position_embeddings)})
        if (found) return found;
    if (hidden_size % num_attention_heads != 0)
        return ConfigProblem{"num_attention_heads", std::to_string(num_attention_heads) + " heads do not divide hidden_size " +
                                                        std::to_string(hidden_size)};
    if (head_dim() % 2 != 0)
        return ConfigProblem{"num_attention_heads", "the head size " + std::to_string(head_dim()) +
                                                        " is odd; rotary embeddings rotate pairs"};
    if (num_attention_heads % num_key_value_heads != 0)
        return ConfigProblem{"num_key_value_heads", std::to_string(num_key_value_heads) +
                                                        " key/value heads do not divide the " +
                                                        std::to_string(num_attention_heads) + " attention heads"};
    if (!(std::isfinite(rms_norm_eps) && rms_norm_eps >= 0.0))
        return ConfigProblem{"rms_norm_eps", "must be finite and >= 0"};
    if (!(std::isfinite(rope_theta) && rope_theta > 0.0)) return ConfigProblem{"rope_theta", "must be finite and > 0"};
    if (!(std::isfinite(initializer_range) && initializer_range >= 0.0))
        return ConfigProblem{"initializer_range", "must be finite and >= 0"};
    // Sizes no machine could hold or the kernels could not index (nn/config_limits.h), refused before any plan: each
    // field first, so that the products below cannot overflow.
    for (const auto& found :
         {over_limit("num_hidden_layers", num_hidden_layers, max_layers, "layers"),
          over_limit("hidden_size", hidden_size, max_dimension, "channels"),
          over_limit("intermediate_size", intermediate_size, max_dimension, "channels"),
          over_limit("max_position_embeddings", max_position_embeddings, max_positions, "positions"),
          over_limit("vocab_size", vocab_size, max_vocabulary, "tokens")})
        if (found) return found;
    const int64_t width = hidden_size, intermediate = intermediate_size, layers = num_hidden_layers;
    const int64_t vocabulary = vocab_size;
    const int64_t key_value = int64_t{num_key_value_heads} * head_dim();
    const int64_t parameters = (tie_word_embeddings ? 1 : 2) * vocabulary * width +
                               layers * (2 * width * width + 2 * key_value * width + 3 * intermediate * width + 2 * width) +
                               width;
    // The largest matrix has `width` columns and the most rows: the embedding, an MLP projection or q_proj/o_proj.
    const int64_t rows = std::max({vocabulary, intermediate, width});
    for (const auto& found :
         {matrix_over_limit(rows == vocabulary ? "vocab_size" : rows == intermediate ? "intermediate_size" : "hidden_size",
                            rows, width, rows == vocabulary ? "embed_tokens" : rows == intermediate ? "an MLP projection"
                                                                                                     : "q_proj"),
          parameters_over_limit("num_hidden_layers", parameters)})
        if (found) return found;
    return std::nullopt;
}

void LlamaConfig::validate() const {
    if (const std::optional<ConfigProblem> found = problem()) ENGINE_FAIL("model: " << found->field << " " << found->reason);
}

RopeCache::RopeCache(int positions, int head_size, double theta, DType dtype, Device device)
    : positions_(positions), head_size_(head_size), theta_(theta),
      tables_(rope_tables(positions, head_size, theta, dtype, device)) {}

const RopeTables& RopeCache::tables_for(const Tensor& activations) const {
    const DType wanted = compute_dtype(activations.dtype());
    if (tables_.cos.device() != activations.device() || tables_.cos.dtype() != wanted)
        tables_ = rope_tables(positions_, head_size_, theta_, activations.dtype(), activations.device());
    return tables_;
}

LlamaAttention::LlamaAttention(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init)
    : heads(config.num_attention_heads), key_value_heads(config.num_key_value_heads), head_size(config.head_dim()),
      q_proj(config.hidden_size, config.num_attention_heads * config.head_dim(), init),
      k_proj(config.hidden_size, config.key_value_width(), init),
      v_proj(config.hidden_size, config.key_value_width(), init),
      o_proj(config.num_attention_heads * config.head_dim(), config.hidden_size, init), rope_(rope) {
    register_module("q_proj", q_proj);
    register_module("k_proj", k_proj);
    register_module("v_proj", v_proj);
    register_module("o_proj", o_proj);
}

Tensor LlamaAttention::forward(const Tensor& input, const Tensor& positions) const {
    const RopeTables& tables = rope_.tables_for(input);
    const Tensor query = rope(q_proj.forward(input), tables.cos, tables.sin, head_size, positions); // (B,T,NH·D)
    const Tensor key = rope(k_proj.forward(input), tables.cos, tables.sin, head_size, positions);   // (B,T,KVH·D)
    // Packed as the attention op reads it: NH query heads, then KVH key heads, then KVH value heads per token.
    // The rotated q and k die here: attention saves the packed copy only.
    const Tensor packed = concat({query, key, v_proj.forward(input)}, 2); // (B,T,(NH+2·KVH)·D)
    return o_proj.forward(attention(packed, heads, key_value_heads, positions));
}

LlamaMLP::LlamaMLP(const LlamaConfig& config, const InitOptions& init)
    : gate_proj(config.hidden_size, config.intermediate_size, init),
      up_proj(config.hidden_size, config.intermediate_size, init),
      down_proj(config.intermediate_size, config.hidden_size, init) {
    register_module("gate_proj", gate_proj);
    register_module("up_proj", up_proj);
    register_module("down_proj", down_proj);
}

Tensor LlamaMLP::forward(const Tensor& input) const {
    const auto rows = [this](const Tensor& x) { return down_proj.forward(swiglu(gate_proj.forward(x), up_proj.forward(x))); };
    return tile_rows == 0 ? rows(input) : checkpoint::tiled_rows(rows, input, tile_rows);
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init)
    : input_layernorm(config.hidden_size, config.rms_norm_eps, init.parameters), self_attn(config, rope, init),
      post_attention_layernorm(config.hidden_size, config.rms_norm_eps, init.parameters), mlp(config, init) {
    register_module("input_layernorm", input_layernorm);
    register_module("self_attn", self_attn);
    register_module("post_attention_layernorm", post_attention_layernorm);
    register_module("mlp", mlp);
}

Tensor LlamaDecoderLayer::forward(const Tensor& input, const Tensor& positions) const {
    const Tensor after_attention = add(input, self_attn.forward(input_layernorm.forward(input), positions));
    return add(after_attention, mlp.forward(post_attention_layernorm.forward(after_attention)));
}

LlamaModel::LlamaModel(const LlamaConfig& config, const RopeCache& rope, const InitOptions& init)
    : embed_tokens(config.vocab_size, config.hidden_size, init),
      norm(config.hidden_size, config.rms_norm_eps, init.parameters) {
    register_module("embed_tokens", embed_tokens);
    for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
        layers.push_back(std::make_unique<LlamaDecoderLayer>(config, rope, init));
        register_module("layers." + std::to_string(layer), *layers.back());
    }
    register_module("norm", norm);
}

Llama::Llama(const LlamaConfig& config, uint64_t seed, Device device, DType dtype)
    : config_((config.validate(), config)), generator_(std::make_shared<Generator>(seed)),
      rope_(config.max_position_embeddings, config.head_dim(), config.rope_theta, dtype, device),
      model(config, rope_, make_init(generator_, config, device, dtype)) {
    register_module("model", model);
    if (!config.tie_word_embeddings) {
        lm_head = std::make_unique<TorchLinear>(config.hidden_size, config.vocab_size,
                                                make_init(generator_, config, device, dtype));
        register_module("lm_head", *lm_head);
    }
    set_compute_dtype(dtype); // bf16: working copies of the f32 masters; f32, f64: none
}

Tensor Llama::run_blocks(const Tensor& input, int first_block, int count, const Tensor& positions) const {
    Tensor x = input;
    for (int index = first_block; index < first_block + count; ++index)
        x = model.layers[static_cast<size_t>(index)]->forward(x, positions);
    return x;
}

Tensor Llama::forward_hidden(const Tensor& tokens, const Tensor& positions) const {
    check_tokens("Llama", tokens, positions);
    Tensor x = look_up([&] { return model.embed_tokens.forward(tokens); }); // (B,T,C)
    return model.norm.forward(run_decoder(std::move(x), positions));
}

Tensor Llama::head_weight() const { // (V,C)
    return lm_head ? lm_head->working(lm_head->weight) : model.embed_tokens.working(model.embed_tokens.weight);
}

} // namespace engine::nn
