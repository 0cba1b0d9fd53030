// QLoRA: quantising linear layers' frozen weights to NF4, one layer (AdaptableLinear::quantize_nf4) or a model's
// base at once (nn/qlora.h).
#include "nn/qlora.h"

#include "nn/lora.h"

namespace engine::nn {
namespace {

bool ends_with_part(const std::string& name, const std::string& part) {
    if (name == part) return true;
    return name.size() > part.size() && name.compare(name.size() - part.size(), part.size(), part) == 0 &&
           name[name.size() - part.size() - 1] == '.';
}

// An adapter's own matrices (lora_A, lora_B under an adapted layer) and the LM head stay dense.
bool stays_dense(const std::string& name) {
    return ends_with_part(name, "lm_head") || ends_with_part(name, "lora_A") || ends_with_part(name, "lora_B");
}

// Why `layer` cannot be quantised now, or empty.
std::string problem_of(const AdaptableLinear& layer) {
    if (layer.nf4_weight() != nullptr) return "its weight is in NF4 already";
    if (layer.has_working_copies() || layer.master_device().has_value())
        return "it has working copies apart from its parameters (set_compute_dtype or set_master_device ran); "
               "quantise before them";
    return {};
}

} // namespace

void AdaptableLinear::quantize_nf4() {
    const std::string problem = problem_of(*this);
    ENGINE_CHECK(problem.empty(), "quantize_nf4: " << problem);
    Tensor& weight = dense_weight();
    ENGINE_CHECK(weight.defined() && weight.dim() == 2, "quantize_nf4: the layer has no 2-D weight");
    ENGINE_CHECK(!weight.requires_grad(), "quantize_nf4: the weight " << weight.describe()
                                              << " requires grad; an NF4 weight is frozen: freeze it first "
                                                 "(set_parameter_requires_grad(\"weight\", false)) or use nn::quantize_nf4");
    // The codes and scales are made before anything changes, so that a failure leaves the dense layer.
    Nf4Weight quantized = engine::quantize_nf4(weight, MemoryCategory::parameters);
    register_buffer(quantized.codes);
    register_buffer(quantized.scale_codes);
    register_buffer(quantized.scale_absmax);
    remove_parameter("weight");
    weight = Tensor();
    nf4_ = std::move(quantized);
}

std::vector<std::string> quantize_nf4(Module& model) {
    std::vector<std::pair<std::string, AdaptableLinear*>> chosen;
    for (auto& [name, module] : model.named_modules()) {
        auto* layer = dynamic_cast<AdaptableLinear*>(module);
        if (layer == nullptr || stays_dense(name)) continue;
        const std::string problem = problem_of(*layer);
        ENGINE_CHECK(problem.empty(), "quantize_nf4: layer '" << name << "': " << problem);
        chosen.emplace_back(name, layer);
    }
    ENGINE_CHECK(!chosen.empty(), "quantize_nf4: the model has no linear layer to quantise (the LM head stays dense)");
    std::vector<std::string> names;
    for (auto& [name, layer] : chosen) {
        layer->set_parameter_requires_grad("weight", false);
        layer->quantize_nf4();
        names.push_back(name);
    }
    return names;
}

std::vector<std::pair<std::string, const AdaptableLinear*>> nf4_layers(Module& model) {
    std::vector<std::pair<std::string, const AdaptableLinear*>> layers;
    for (auto& [name, module] : model.named_modules())
        if (const auto* layer = dynamic_cast<const AdaptableLinear*>(module); layer && layer->nf4_weight())
            layers.emplace_back(name, layer);
    return layers;
}

} // namespace engine::nn
