// ModelConfig's dispatch over the architectures.
#include "nn/model_config.h"

namespace engine::nn {

ModelConfig ModelConfig::named(const std::string& name) {
    if (LlamaConfig::is_name(name)) return LlamaConfig::named(name);
    try {
        return GPTConfig::named(name);
    } catch (const EngineError&) {
        ENGINE_FAIL("unknown model name '" << name << "' (known: " << known_names() << ")");
    }
}

const char* ModelConfig::known_names() {
    return "tiny, small, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, llama-tiny, smollm-135m";
}

const GPTConfig& ModelConfig::gpt() const {
    ENGINE_CHECK(is_gpt(), "model: a GPT-2 setting was asked of a " << architecture() << " model");
    return std::get<GPTConfig>(value_);
}
GPTConfig& ModelConfig::gpt() {
    ENGINE_CHECK(is_gpt(), "model: a GPT-2 setting was asked of a " << architecture() << " model");
    return std::get<GPTConfig>(value_);
}
const LlamaConfig& ModelConfig::llama() const {
    ENGINE_CHECK(is_llama(), "model: a Llama setting was asked of a " << architecture() << " model");
    return std::get<LlamaConfig>(value_);
}
LlamaConfig& ModelConfig::llama() {
    ENGINE_CHECK(is_llama(), "model: a Llama setting was asked of a " << architecture() << " model");
    return std::get<LlamaConfig>(value_);
}

int ModelConfig::vocab_size() const { return is_llama() ? llama().vocab_size : gpt().vocab_size; }
int ModelConfig::padded_vocab_size() const { return is_llama() ? llama().vocab_size : gpt().padded_vocab_size(); }
int ModelConfig::max_seq_len() const { return is_llama() ? llama().max_position_embeddings : gpt().max_seq_len; }
int ModelConfig::layers() const { return is_llama() ? llama().num_hidden_layers : gpt().n_layer; }
int ModelConfig::width() const { return is_llama() ? llama().hidden_size : gpt().n_embd; }
std::string ModelConfig::to_string() const { return is_llama() ? llama().to_string() : gpt().to_string(); }
std::optional<ConfigProblem> ModelConfig::problem() const { return is_llama() ? llama().problem() : gpt().problem(); }
void ModelConfig::validate() const { is_llama() ? llama().validate() : gpt().validate(); }

std::unique_ptr<CausalLM> ModelConfig::build(uint64_t seed, Device device, DType dtype) const {
    if (is_llama()) return std::make_unique<Llama>(llama(), seed, device, dtype);
    return std::make_unique<GPT>(gpt(), seed, device, dtype);
}

} // namespace engine::nn
