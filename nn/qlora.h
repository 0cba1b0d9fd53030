// QLoRA's 4-bit base (docs/TRAINING.md, "QLoRA"): a model's linear layers quantised to NF4 as bitsandbytes'
// Linear4bit holds them (engine/ops/nf4.h), frozen, with LoRA adapters (nn/lora.h) the only trainable weights.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nn/layers.h"

namespace engine::nn {

// Quantises the weight of every linear layer of `model` to NF4 (AdaptableLinear::quantize_nf4), freezing it
// first, as transformers' load_in_4bit does: every one but the LM head (which the fused classifier reads
// whole) and the LoRA adapters' own matrices, which train. Call it before set_compute_dtype, set_master_device
// and any trainer, after or before apply_lora. All or nothing: every layer is checked before the first is
// quantised. Returns the quantised layers' dotted names, in named_modules() order.
std::vector<std::string> quantize_nf4(Module& model);

// The quantised layers of `model`, with their dotted names.
std::vector<std::pair<std::string, const AdaptableLinear*>> nf4_layers(Module& model);

} // namespace engine::nn
