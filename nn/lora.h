// LoRA (low-rank adaptation) as PEFT applies it: the base model frozen and, on linear layers chosen by name, a
// trainable update scaling·B·A beside each, scaling = lora_alpha / r. Names follow PEFT's LoraConfig and its
// files (nn/io/peft.h); docs/TRAINING.md, "LoRA", has the recipe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace engine::nn {

struct LoraConfig {
    int r = 8;                // the rank
    double lora_alpha = 8.0;  // scaling = lora_alpha / r
    double lora_dropout = 0.0; // dropout on the adapter path's input, in train mode
    // Which linear layers get an adapter, PEFT's rule: a layer's dotted name equals a target or ends with
    // "." + target ("q_proj" matches model.layers.3.self_attn.q_proj). "all-linear" alone: every adaptable
    // linear layer but the LM head.
    std::vector<std::string> target_modules;
    double scaling() const { return lora_alpha / r; }
    // The first bad field, named as PEFT's LoraConfig spells it, with why; nullopt when every field is good.
    std::optional<std::string> problem() const;
};

// One layer's adapter. lora_A and lora_B are registered as the layer's children (AdaptableLinear::attach_lora),
// so that their parameters are "<layer>.lora_A.weight" (r,in) and "<layer>.lora_B.weight" (out,r), PEFT's names
// and shapes, and checkpointing, offload and the files see them as the layer's own.
class LoraAdapter {
public:
    // lora_A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch.nn.Linear's default, which PEFT keeps: kaiming_uniform(a=√5)),
    // lora_B = 0, so that an adapted model starts as its base.
    LoraAdapter(int in_features, int out_features, const LoraConfig& config, const ParameterOptions& options);
    // scaling · lora_B(lora_A(dropout(input))): (...,in) -> (...,out). Dropout only in train mode.
    Tensor forward(const Tensor& input, bool training) const;

    TorchLinear lora_A; // weight (r,in)
    TorchLinear lora_B; // weight (out,r)
    double scaling;
    float dropout;
};

// PEFT's get_peft_model for LoRA: freezes every parameter of `model` (Module::set_requires_grad), then gives an
// adapter to each AdaptableLinear whose name matches config.target_modules. Returns the adapted layers' names
// in model order. Everything is checked and every adapter allocated before the model changes; throws EngineError,
// changing nothing, for a bad config, a target that matches no adaptable linear layer (naming it and the linear
// layers there are), the LM head (the fused classifier reads its weight, not its forward), a rank above a
// matched layer's min(in, out), a layer already adapted, and a model with working copies or masters apart
// (apply LoRA before set_compute_dtype and before building a trainer).
std::vector<std::string> apply_lora(Module& model, const LoraConfig& config, const ParameterOptions& options = {});

// Whether `config` gives the linear layer named `layer_name` (dotted, as named_modules() spells it) an adapter:
// apply_lora's rule (PEFT's), without the model. The LM head never matches "all-linear".
bool lora_target_matches(const LoraConfig& config, const std::string& layer_name);

// The adapted layers of `model`, by name, in model order (empty when none).
std::vector<std::pair<std::string, AdaptableLinear*>> adapted_layers(Module& model);

// PEFT's merge_and_unload: adds scaling·B·A into each adapted layer's base weight (in its layout, summed in
// float64 and rounded once to the weight's dtype) and removes the adapters, leaving the plain architecture
// (its parameters still frozen as apply_lora left them: set_requires_grad(true) to train it whole). Refused,
// changing nothing, with working copies or masters apart.
void merge_lora(Module& model);

} // namespace engine::nn
