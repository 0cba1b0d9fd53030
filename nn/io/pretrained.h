// Hugging Face model directories (what save_pretrained writes and from_pretrained reads): config.json, and
// model.safetensors or shards listed by model.safetensors.index.json. The config decides the architecture
// (GPT-2 or Llama) and every size; docs/FORMATS.md lists the keys read and written.
#pragma once

#include <optional>
#include <string>

#include "nn/causal_lm.h"
#include "nn/model_config.h"

namespace engine::nn {

// True when `path` is a directory holding a config.json.
bool is_pretrained_directory(const std::string& path);

// Reads DIR/config.json. Throws EngineError naming the file and the key for: a missing or malformed file, an
// unsupported model_type (supported: gpt2, llama), a rope_scaling or a non-default rope_parameters.rope_type
// (transformers 5), biases, attention dropout, an activation or epsilon this engine does not implement, and
// sizes that do not fit together.
ModelConfig read_pretrained_config(const std::string& directory);

// The safetensors files of DIR: model.safetensors when it exists (transformers' order), else every shard
// model.safetensors.index.json names (each once, in the index's order). Throws naming the index and the shard
// when a shard is missing, or when neither exists.
std::vector<std::string> pretrained_weight_files(const std::string& directory);

// Loads DIR's weights into `model` (load_safetensors_into: a bad directory changes nothing): every parameter must be there, with
// its shape; BF16 and F32 files both load into the model's f32 (or f64) parameters.
void load_pretrained_into(CausalLM& model, const std::string& directory);

// config.json's eos_token_id (an integer, or the first of a list), if it has one: the end-of-text token that
// splits documents for train_gpt --data-layout padded.
std::optional<int> pretrained_end_of_text(const std::string& directory);

// Writes DIR (created if needed) so that transformers' from_pretrained loads it: config.json for the model's
// architecture and sizes, and model.safetensors with transformers' names (GPT-2 under "transformer."; a tied
// head is not written, as save_pretrained does). The weights are the masters in the widest of their dtypes (f32;
// frozen ones stored in bf16 widen exactly), or in `file_dtype` (bf16).
// `source_directory`, when given (the --init directory), is where the model came from: its config.json's other
// keys (token ids, ...) are kept, and its tokenizer and generation files are copied, so the result is a whole
// model directory again. Each file is replaced atomically; an index and the shards it names that an earlier save
// left in DIR are removed, so DIR holds one set of weights.
void save_pretrained(const CausalLM& model, const std::string& directory, std::optional<DType> file_dtype = std::nullopt,
                     const std::string& source_directory = "");

} // namespace engine::nn
