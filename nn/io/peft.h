// PEFT's LoRA adapter directories (what PeftModel.save_pretrained writes and PeftModel.from_pretrained reads):
// adapter_config.json and adapter_model.safetensors, with PEFT's tensor names. docs/FORMATS.md lists the keys.
#pragma once

#include <string>

#include "nn/causal_lm.h"
#include "nn/lora.h"

namespace engine::nn {

// The name PEFT gives an adapter tensor of `model`: "base_model.model." + the transformers name
// ("transformer." in front for GPT-2) + ".lora_A.weight" or ".lora_B.weight".
std::string peft_tensor_name(const CausalLM& model, const std::string& parameter_name);

// Reads DIR/adapter_config.json: peft_type LORA, r, lora_alpha, lora_dropout, target_modules (a list, or
// "all-linear"). Throws naming the file and the key for a missing or malformed file and for what this engine
// does not implement (bias other than "none", use_rslora, rank_pattern, alpha_pattern, layers_to_transform,
// modules_to_save, a regular-expression target).
LoraConfig read_adapter_config(const std::string& directory);

// PeftModel.from_pretrained on an unadapted model: apply_lora with DIR's config, then every adapter tensor from
// DIR/adapter_model.safetensors (F32 or BF16). All or nothing: a tensor missing, extra, or of another shape (an
// adapter for another base model) throws naming the file and the tensor, and the model is left as it was.
LoraConfig load_adapter(CausalLM& model, const std::string& directory, const ParameterOptions& options = {});

// PeftModel.save_pretrained: writes DIR (created if needed) with adapter_config.json (`config`, task_type
// CAUSAL_LM, base_model_name_or_path) and adapter_model.safetensors (the adapters' f32 masters, PEFT's names).
// Every check comes before the first write, and each file is replaced atomically. Throws when the model has no
// adapter.
void save_adapter(const CausalLM& model, const LoraConfig& config, const std::string& directory,
                  const std::string& base_model_name_or_path = "");

} // namespace engine::nn
