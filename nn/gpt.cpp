// GPT-2 forward and its named configurations.
#include "nn/gpt.h"

#include <algorithm>
#include <sstream>

#include "nn/config_limits.h"

namespace engine::nn {
namespace {

InitOptions make_init(const std::shared_ptr<Generator>& generator, Device device, DType dtype) {
    InitOptions init;
    init.parameters.generator = generator;
    init.parameters.device = device;
    init.parameters.dtype = compute_dtype(dtype); // bf16: f32 masters
    return init;
}

} // namespace

GPTConfig GPTConfig::named(const std::string& name) {
    GPTConfig config;
    if (name == "tiny") config = {256, 64, 2, 4, 64, 0.0f};
    else if (name == "small") config = {256, 128, 4, 4, 128, 0.0f};
    else if (name == "gpt2-124M") config = {50257, 1024, 12, 12, 768, 0.0f};
    else if (name == "gpt2-350M") config = {50257, 1024, 24, 16, 1024, 0.0f};
    else if (name == "gpt2-774M") config = {50257, 1024, 36, 20, 1280, 0.0f};
    else if (name == "gpt2-1558M") config = {50257, 1024, 48, 25, 1600, 0.0f};
    else ENGINE_FAIL("unknown model name '" << name << "' (known: tiny, small, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M)");
    return config;
}

std::string GPTConfig::to_string() const {
    std::ostringstream text;
    text << "vocab " << vocab_size << ", max_seq_len " << max_seq_len << ", layers " << n_layer << ", heads "
         << n_head << ", width " << n_embd << ", dropout " << dropout;
    return text.str();
}

std::optional<ConfigProblem> GPTConfig::problem() const {
    auto positive = [](const char* field, int value) -> std::optional<ConfigProblem> {
        if (value > 0) return std::nullopt;
        return ConfigProblem{field, "must be positive, got " + std::to_string(value)};
    };
    for (const auto& found : {positive("vocab_size", vocab_size), positive("max_seq_len", max_seq_len),
                              positive("n_layer", n_layer), positive("n_head", n_head), positive("n_embd", n_embd)})
        if (found) return found;
    if (n_embd % n_head != 0)
        return ConfigProblem{"n_head", std::to_string(n_head) + " heads do not divide the width " + std::to_string(n_embd)};
    if (!(dropout >= 0.0f && dropout < 1.0f))
        return ConfigProblem{"dropout", "must be in [0,1), got " + std::to_string(dropout)};
    // Sizes no machine could hold or the kernels could not index (nn/config_limits.h), refused before any plan: each
    // field first, so that the products below cannot overflow.
    for (const auto& found :
         {over_limit("n_layer", n_layer, max_layers, "layers"), over_limit("n_embd", n_embd, max_dimension, "channels"),
          over_limit("max_seq_len", max_seq_len, max_positions, "positions"),
          over_limit("vocab_size", vocab_size, max_vocabulary, "tokens")})
        if (found) return found;
    const int64_t width = n_embd, layers = n_layer, positions = max_seq_len;
    const int64_t padded = (int64_t{vocab_size} + vocab_padding_multiple - 1) / vocab_padding_multiple * vocab_padding_multiple;
    const int64_t parameters = padded * width + positions * width + layers * (12 * width * width + 13 * width) + 2 * width;
    const int64_t rows = std::max({padded, 4 * width, positions});
    for (const auto& found :
         {matrix_over_limit(rows == padded ? "vocab_size" : rows == positions ? "max_seq_len" : "n_embd", rows, width,
                            rows == padded ? "wte" : rows == positions ? "wpe" : "the MLP's c_fc"),
          parameters_over_limit("n_layer", parameters)})
        if (found) return found;
    return std::nullopt;
}

void GPTConfig::validate() const {
    if (const std::optional<ConfigProblem> found = problem()) ENGINE_FAIL("model: " << found->field << " " << found->reason);
}

GPT::GPT(const GPTConfig& config, uint64_t seed, Device device, DType dtype)
    : config_((config.validate(), config)), generator_(std::make_shared<Generator>(seed)),
      wte(config.vocab_size, config.n_embd, make_init(generator_, device, dtype), config.padded_vocab_size()),
      wpe(config.max_seq_len, config.n_embd, make_init(generator_, device, dtype)), drop(config.dropout),
      ln_f(config.n_embd, make_init(generator_, device, dtype).parameters) {
    register_module("wte", wte);
    register_module("wpe", wpe);
    register_module("drop", drop);
    for (int layer = 0; layer < config.n_layer; ++layer) {
        h.push_back(std::make_unique<Block>(config.n_embd, config.n_head, config.n_layer, config.dropout,
                                            make_init(generator_, device, dtype)));
        register_module("h." + std::to_string(layer), *h.back());
    }
    register_module("ln_f", ln_f);
    set_compute_dtype(dtype); // bf16: working copies of the f32 masters; f32, f64: none
}

Tensor GPT::run_blocks(const Tensor& input, int first_block, int count, const Tensor& positions) const {
    Tensor x = input;
    for (int index = first_block; index < first_block + count; ++index)
        x = h[static_cast<size_t>(index)]->forward(x, positions);
    return x;
}

Tensor GPT::forward_hidden(const Tensor& tokens, const Tensor& positions) const {
    check_tokens("GPT", tokens, positions);
    // (B,T,C); packed documents add wpe's rows at each token's position in its document
    Tensor x = drop.forward(embedding(tokens, wte.working(wte.weight), wpe.working(wpe.weight), positions));
    return ln_f.forward(run_decoder(std::move(x), positions));
}

// (Vp,C): the head is tied to the token embedding through the padded view of its storage and gradient buffer.
Tensor GPT::head_weight() const { return wte.working(wte.padded_weight); }

} // namespace engine::nn
