// LoRA: the adapter's forward, attaching adapters to linear layers by PEFT's name rule, and merging them back.
#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/ops.h"

namespace engine::nn {
namespace {

constexpr const char* all_linear = "all-linear";

// PEFT's rule (peft.tuners.tuners_utils.check_target_module_exists for a list): the whole name, or its tail
// after a dot.
bool name_matches(const std::string& name, const std::string& target) {
    if (name == target) return true;
    return name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
           name[name.size() - target.size() - 1] == '.';
}

bool is_head(const std::string& name) { return name == "lm_head" || name_matches(name, "lm_head"); }

// The adapter's parameters in the base weight's dtype and on its device; over an NF4 base, f32 (PEFT's adapters
// over bitsandbytes' Linear4bit are float32) on the codes' device.
ParameterOptions adapter_options(const AdaptableLinear& layer, const Tensor& weight, const ParameterOptions& options) {
    ParameterOptions adapter = options;
    adapter.dtype = layer.nf4_weight() ? DType::f32 : weight.dtype();
    adapter.device = layer.nf4_weight() ? layer.nf4_weight()->device() : weight.device();
    return adapter;
}

// The base weight of an adaptable layer: Linear's (in,out) or TorchLinear's (out,in).
Tensor base_weight(const AdaptableLinear& layer) {
    if (const auto* linear = dynamic_cast<const Linear*>(&layer)) return linear->weight;
    return dynamic_cast<const TorchLinear&>(layer).weight;
}

} // namespace

bool lora_target_matches(const LoraConfig& config, const std::string& layer_name) {
    for (const std::string& target : config.target_modules)
        if (target == all_linear ? !is_head(layer_name) : name_matches(layer_name, target)) return true;
    return false;
}

std::optional<std::string> LoraConfig::problem() const {
    if (r < 1) return "r " + std::to_string(r) + " must be at least 1";
    if (!std::isfinite(lora_alpha) || lora_alpha <= 0.0) {
        std::ostringstream out;
        out << "lora_alpha " << lora_alpha << " must be finite and positive";
        return out.str();
    }
    if (!(lora_dropout >= 0.0 && lora_dropout < 1.0)) {
        std::ostringstream out;
        out << "lora_dropout " << lora_dropout << " must be in [0, 1)";
        return out.str();
    }
    if (target_modules.empty()) return "target_modules is empty: name the linear layers to adapt (q_proj, c_attn, ...)";
    for (const std::string& target : target_modules) {
        if (target.empty()) return "target_modules holds an empty name";
        if (target == all_linear && target_modules.size() > 1)
            return std::string("target_modules: '") + all_linear + "' stands alone";
    }
    return std::nullopt;
}

LoraAdapter::LoraAdapter(int in_features, int out_features, const LoraConfig& config, const ParameterOptions& options)
    : lora_A(in_features, config.r, options), lora_B(config.r, out_features, options), scaling(config.scaling()),
      dropout(static_cast<float>(config.lora_dropout)) {
    lora_B.weight.fill_zero();
}

Tensor LoraAdapter::forward(const Tensor& input, bool training) const {
    const Tensor dropped = dropout > 0.0f ? engine::dropout(input, dropout, training) : input; // (...,in)
    return multiply(lora_B.forward(lora_A.forward(dropped)), scaling);                       // (...,out)
}

void AdaptableLinear::attach_lora(std::shared_ptr<LoraAdapter> adapter) {
    ENGINE_CHECK(adapter != nullptr, "attach_lora: no adapter");
    ENGINE_CHECK(lora_ == nullptr, "attach_lora: the layer has an adapter already");
    ENGINE_CHECK(!has_working_copies() && !master_device().has_value(),
                 "attach_lora: the layer has working copies apart from its parameters (set_compute_dtype or "
                 "set_master_device ran); attach adapters before them");
    ENGINE_CHECK(adapter->lora_A.in_features() == in_features() && adapter->lora_B.out_features() == out_features(),
                 "attach_lora: an adapter for (" << adapter->lora_A.in_features() << " -> "
                                                 << adapter->lora_B.out_features() << ") on a layer (" << in_features()
                                                 << " -> " << out_features() << ")");
    lora_ = std::move(adapter);
    register_module("lora_A", lora_->lora_A);
    register_module("lora_B", lora_->lora_B);
}

std::shared_ptr<LoraAdapter> AdaptableLinear::detach_lora() {
    ENGINE_CHECK(lora_ != nullptr, "detach_lora: the layer has no adapter");
    remove_module("lora_A");
    remove_module("lora_B");
    return std::move(lora_);
}

Tensor AdaptableLinear::with_lora(Tensor base_output, const Tensor& input) const {
    if (lora_ == nullptr) return base_output;
    return add(base_output, lora_->forward(input, training()));
}

std::vector<std::pair<std::string, AdaptableLinear*>> adapted_layers(Module& model) {
    std::vector<std::pair<std::string, AdaptableLinear*>> out;
    for (auto& [name, module] : model.named_modules())
        if (auto* layer = dynamic_cast<AdaptableLinear*>(module); layer != nullptr && layer->lora() != nullptr)
            out.emplace_back(name, layer);
    return out;
}

std::vector<std::string> apply_lora(Module& model, const LoraConfig& config, const ParameterOptions& options) {
    if (const std::optional<std::string> problem = config.problem()) ENGINE_FAIL("LoRA: " << *problem);
    ENGINE_CHECK(!model.master_device().has_value(),
                 "LoRA: the model's masters are apart from its working copies (set_master_device); apply LoRA first");
    // The adaptable layers, and which targets they meet. An adapter's own lora_A and lora_B are TorchLinears:
    // they are never targets.
    std::vector<std::pair<std::string, AdaptableLinear*>> linear_layers;
    std::vector<std::pair<std::string, AdaptableLinear*>> matched;
    std::vector<bool> target_used(config.target_modules.size(), false);
    for (auto& [name, module] : model.named_modules()) {
        auto* layer = dynamic_cast<AdaptableLinear*>(module);
        if (layer == nullptr || name_matches(name, "lora_A") || name_matches(name, "lora_B")) continue;
        ENGINE_CHECK(!module->has_working_copies(), "LoRA: layer '" << name << "' has working copies (set_compute_dtype "
                                                        "ran); apply LoRA before it and before building a trainer");
        linear_layers.emplace_back(name, layer);
        bool hit = false;
        for (size_t index = 0; index < config.target_modules.size(); ++index) {
            const std::string& target = config.target_modules[index];
            const bool matches = target == all_linear ? !is_head(name) : name_matches(name, target);
            if (!matches) continue;
            target_used[index] = true;
            hit = true;
        }
        if (!hit) continue;
        ENGINE_CHECK(!is_head(name), "LoRA: target_modules matches the LM head '"
                                         << name << "', whose weight the fused classifier reads without its forward: "
                                                    "an adapter there is not supported");
        ENGINE_CHECK(layer->lora() == nullptr, "LoRA: layer '" << name << "' has an adapter already");
        const int rank_limit = std::min(layer->in_features(), layer->out_features());
        ENGINE_CHECK(config.r <= rank_limit, "LoRA: r " << config.r << " exceeds layer '" << name << "' ("
                                                          << layer->in_features() << " -> " << layer->out_features()
                                                          << "), whose rank is at most " << rank_limit);
        matched.emplace_back(name, layer);
    }
    for (size_t index = 0; index < config.target_modules.size(); ++index) {
        if (target_used[index]) continue;
        std::ostringstream names;
        for (size_t layer = 0; layer < linear_layers.size() && layer < 6; ++layer)
            names << (layer ? ", " : "") << linear_layers[layer].first;
        if (linear_layers.size() > 6) names << ", ... (" << linear_layers.size() << " in all)";
        ENGINE_FAIL("LoRA: target module '" << config.target_modules[index]
                                            << "' matches no linear layer of the model (they are: "
                                            << (linear_layers.empty() ? std::string("none") : names.str()) << ")");
    }
    // Every adapter allocated before the model changes.
    std::vector<std::shared_ptr<LoraAdapter>> adapters;
    for (auto& [name, layer] : matched) {
        const Tensor weight = base_weight(*layer);
        adapters.push_back(std::make_shared<LoraAdapter>(layer->in_features(), layer->out_features(), config,
                                                         adapter_options(*layer, weight, options)));
    }
    model.set_requires_grad(false);
    std::vector<std::string> names;
    for (size_t index = 0; index < matched.size(); ++index) {
        matched[index].second->attach_lora(adapters[index]);
        names.push_back(matched[index].first);
    }
    return names;
}

void merge_lora(Module& model) {
    ENGINE_CHECK(!model.master_device().has_value(), "merge_lora: the model's masters are apart (set_master_device)");
    const auto layers = adapted_layers(model);
    for (const auto& [name, layer] : layers) {
        ENGINE_CHECK(!layer->has_working_copies(), "merge_lora: layer '" << name << "' has working copies; merge the "
                                                                             "masters of a model without them");
        ENGINE_CHECK(layer->nf4_weight() == nullptr,
                     "merge_lora: layer '" << name << "' holds its weight in NF4; merge into the dense base instead "
                                                     "(load it unquantised, load the adapter, merge)");
    }
    // Each merged weight computed before the first is written.
    std::vector<std::pair<Tensor, Tensor>> merged; // (weight, its new value)
    for (const auto& [name, layer] : layers) {
        const LoraAdapter& adapter = *layer->lora();
        const Tensor weight = base_weight(*layer);
        const std::vector<double> a = cast(adapter.lora_A.weight, DType::f64).to_vector<double>(); // (r,in)
        const std::vector<double> b = cast(adapter.lora_B.weight, DType::f64).to_vector<double>(); // (out,r)
        std::vector<double> w = cast(weight, DType::f64).to_vector<double>();
        const int64_t in = layer->in_features(), out = layer->out_features();
        const int64_t r = adapter.lora_A.weight.size(0);
        const bool in_out = dynamic_cast<const Linear*>(layer) != nullptr; // Linear: (in,out); TorchLinear: (out,in)
        for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < in; ++i) {
                double delta = 0.0;
                for (int64_t k = 0; k < r; ++k) delta += b[static_cast<size_t>(o * r + k)] * a[static_cast<size_t>(k * in + i)];
                w[static_cast<size_t>(in_out ? i * out + o : o * in + i)] += adapter.scaling * delta;
            }
        const Tensor value = cast(Tensor::from_vector<double>(w, weight.shape(), Device::cpu), weight.dtype());
        merged.emplace_back(weight, value);
    }
    for (auto& [weight, value] : merged) Tensor(weight).copy_from(value);
    for (const auto& [name, layer] : layers) layer->detach_lora();
}

} // namespace engine::nn
