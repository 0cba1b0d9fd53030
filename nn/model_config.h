// ModelConfig: which causal LM to build (GPT-2 or Llama) and its sizes, as one value that train_gpt, the
// planner and the Hugging Face directory reader pass around. A GPTConfig or a LlamaConfig converts to it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "nn/gpt.h"
#include "nn/llama.h"

namespace engine::nn {

class ModelConfig {
public:
    ModelConfig() = default; // GPT-2 "tiny"'s fields (GPTConfig's defaults)
    ModelConfig(const GPTConfig& config) : value_(config) {}   // NOLINT: a GPT config is a model config
    ModelConfig(const LlamaConfig& config) : value_(config) {} // NOLINT: so is a Llama one

    // Every named size: GPTConfig::named's and LlamaConfig::named's. Throws listing them on others.
    static ModelConfig named(const std::string& name);
    static const char* known_names();

    bool is_llama() const { return std::holds_alternative<LlamaConfig>(value_); }
    bool is_gpt() const { return std::holds_alternative<GPTConfig>(value_); }
    const GPTConfig& gpt() const;     // throws naming the architecture when it is not GPT-2
    GPTConfig& gpt();
    const LlamaConfig& llama() const; // throws naming the architecture when it is not Llama
    LlamaConfig& llama();
    std::string architecture() const { return is_llama() ? "llama" : "gpt2"; } // Hugging Face's model_type

    int vocab_size() const;
    int padded_vocab_size() const; // the LM head's stored rows (GPT-2 pads to 128; Llama does not pad)
    int max_seq_len() const;
    int layers() const;
    int width() const;
    std::string to_string() const;
    std::optional<ConfigProblem> problem() const;
    void validate() const;

    // The model, its parameters initialised from `seed` (nn/gpt.h, nn/llama.h).
    std::unique_ptr<CausalLM> build(uint64_t seed, Device device, DType dtype) const;

private:
    std::variant<GPTConfig, LlamaConfig> value_;
};

} // namespace engine::nn
