// PEFT's adapter directories: the config's keys, the tensor names, and all-or-nothing loads.
#include "nn/io/peft.h"

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/io/atomic_file.h"
#include "nn/io/safetensors.h"

namespace engine::nn {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* config_file = "adapter_config.json";
constexpr const char* weights_file = "adapter_model.safetensors";

std::string in_directory(const std::string& directory, const char* file) { return (fs::path(directory) / file).string(); }

bool is_adapter_parameter(const std::string& name) {
    return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

// The adapter parameters of a model, in model order.
std::vector<std::pair<std::string, Tensor>> adapter_parameters(const Module& model) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto& named : model.named_parameters())
        if (is_adapter_parameter(named.first)) out.push_back(std::move(named));
    return out;
}

} // namespace

std::string peft_tensor_name(const CausalLM& model, const std::string& parameter_name) {
    return std::string("base_model.model.") + (model.architecture() == "gpt2" ? "transformer." : "") + parameter_name;
}

LoraConfig read_adapter_config(const std::string& directory) {
    const std::string path = in_directory(directory, config_file);
    json config;
    try {
        const std::vector<uint8_t> bytes = io::read_file_bytes(path);
        config = json::parse(bytes.begin(), bytes.end());
    } catch (const json::exception& error) {
        ENGINE_FAIL("'" << path << "': not valid JSON (" << error.what() << ")");
    }
    ENGINE_CHECK(config.is_object(), "'" << path << "': not a JSON object");
    const auto has = [&](const char* key) { return config.contains(key) && !config[key].is_null(); };
    const auto require = [&](const char* key) {
        ENGINE_CHECK(has(key), "'" << path << "': key '" << key << "' is missing");
        return config[key];
    };
    ENGINE_CHECK(require("peft_type") == "LORA",
                 "'" << path << "': peft_type is " << config["peft_type"].dump() << "; only LORA adapters are read");
    LoraConfig lora;
    const json r = require("r");
    ENGINE_CHECK(r.is_number_integer(), "'" << path << "': key 'r' must be an integer, got " << r.dump());
    lora.r = r.get<int>();
    const json alpha = require("lora_alpha");
    ENGINE_CHECK(alpha.is_number(), "'" << path << "': key 'lora_alpha' must be a number, got " << alpha.dump());
    lora.lora_alpha = alpha.get<double>();
    if (has("lora_dropout")) {
        ENGINE_CHECK(config["lora_dropout"].is_number(),
                     "'" << path << "': key 'lora_dropout' must be a number, got " << config["lora_dropout"].dump());
        lora.lora_dropout = config["lora_dropout"].get<double>();
    }
    const json targets = require("target_modules");
    if (targets.is_string()) {
        ENGINE_CHECK(targets == "all-linear", "'" << path << "': target_modules " << targets.dump()
                                                  << " is a regular expression; only a list of names or \"all-linear\" "
                                                     "is read");
        lora.target_modules = {"all-linear"};
    } else {
        ENGINE_CHECK(targets.is_array(), "'" << path << "': key 'target_modules' must be a list of names");
        for (const json& target : targets) {
            ENGINE_CHECK(target.is_string(), "'" << path << "': target_modules holds " << target.dump() << ", not a name");
            lora.target_modules.push_back(target.get<std::string>());
        }
    }
    // What would change the adapter's arithmetic or its tensors, which this engine does not implement.
    ENGINE_CHECK(!has("bias") || config["bias"] == "none",
                 "'" << path << "': bias " << config["bias"].dump() << " (trained biases) is not supported; only \"none\"");
    ENGINE_CHECK(!has("use_rslora") || config["use_rslora"] == false,
                 "'" << path << "': use_rslora (scaling lora_alpha/sqrt(r)) is not supported");
    ENGINE_CHECK(!has("use_dora") || config["use_dora"] == false, "'" << path << "': use_dora is not supported");
    for (const char* key : {"rank_pattern", "alpha_pattern"})
        ENGINE_CHECK(!has(key) || config[key].empty(),
                     "'" << path << "': " << key << " (per-layer ranks or alphas) is not supported");
    for (const char* key : {"layers_to_transform", "modules_to_save"})
        ENGINE_CHECK(!has(key), "'" << path << "': " << key << " is not supported");
    if (const std::optional<std::string> problem = lora.problem()) ENGINE_FAIL("'" << path << "': " << *problem);
    return lora;
}

LoraConfig load_adapter(CausalLM& model, const std::string& directory, const ParameterOptions& options) {
    const LoraConfig config = read_adapter_config(directory);
    const std::string path = in_directory(directory, weights_file);
    const SafetensorsHeader header = read_safetensors_header(path);
    ENGINE_CHECK(adapted_layers(model).empty(), "load_adapter '" << directory << "': the model has adapters already");
    // Which parameters train now, to put back if the tensors do not fit.
    std::vector<bool> trainable;
    for (const Tensor& parameter : model.parameters()) trainable.push_back(parameter.requires_grad());
    try {
        apply_lora(model, config, options);
    } catch (const OutOfMemoryError&) {
        throw;
    } catch (const EngineError& error) { // the config does not fit this model: say which adapter it came from
        throw EngineError("load_adapter '" + directory + "': " + error.what());
    }
    try {
        const std::vector<std::pair<std::string, Tensor>> adapters = adapter_parameters(model);
        std::map<std::string, const SafetensorsEntry*> by_name;
        for (const SafetensorsEntry& entry : header.entries) by_name[entry.name] = &entry;
        std::vector<Tensor> staged;
        std::set<std::string> used;
        for (const auto& [name, parameter] : adapters) {
            const std::string file_name = peft_tensor_name(model, name);
            const auto found = by_name.find(file_name);
            ENGINE_CHECK(found != by_name.end(), "adapter '" << path << "': tensor '" << file_name << "' "
                                                             << shape_string(parameter.shape())
                                                             << " is missing (an adapter for another model or targets?)");
            ENGINE_CHECK(found->second->shape == parameter.shape(),
                         "adapter '" << path << "': tensor '" << file_name << "' has shape "
                                     << shape_string(found->second->shape) << " but this model's needs "
                                     << shape_string(parameter.shape()) << " (an adapter for another base model?)");
            staged.push_back(cast(read_safetensors_tensor(header, *found->second), parameter.dtype()));
            used.insert(file_name);
        }
        for (const SafetensorsEntry& entry : header.entries)
            ENGINE_CHECK(used.count(entry.name), "adapter '" << path << "': tensor '" << entry.name
                                                             << "' is no adapter of this model's target modules");
        for (size_t index = 0; index < adapters.size(); ++index) Tensor(adapters[index].second).copy_from(staged[index]);
    } catch (...) {
        for (auto& [name, layer] : adapted_layers(model)) layer->detach_lora();
        const auto named = model.named_parameters();
        for (size_t index = 0; index < named.size(); ++index)
            if (trainable[index]) model.set_parameter_requires_grad(named[index].first, true);
        throw;
    }
    return config;
}

void save_adapter(const CausalLM& model, const LoraConfig& config, const std::string& directory,
                  const std::string& base_model_name_or_path) {
    if (const std::optional<std::string> problem = config.problem()) ENGINE_FAIL("save_adapter: " << *problem);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, parameter] : adapter_parameters(model)) tensors.emplace_back(peft_tensor_name(model, name), parameter);
    ENGINE_CHECK(!tensors.empty(), "save_adapter '" << directory << "': the model has no LoRA adapter (nn::apply_lora)");
    for (const auto& [name, tensor] : tensors) {
        const bool a = name.find(".lora_A.") != std::string::npos;
        ENGINE_CHECK((a ? tensor.size(0) : tensor.size(1)) == config.r,
                     "save_adapter: tensor '" << name << "' " << shape_string(tensor.shape()) << " is not of rank r "
                                              << config.r << " the config says");
    }
    // PEFT 0.7.1's LoraConfig fields; fan_in_fan_out is PEFT's flag for GPT-2's Conv1D (in,out) base weights, which
    // leaves the adapters' own shapes as for torch.nn.Linear.
    json targets = json::array();
    for (const std::string& target : config.target_modules) targets.push_back(target);
    json adapter_config = {
        {"alpha_pattern", json::object()},
        {"auto_mapping", nullptr},
        {"base_model_name_or_path", base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path)},
        {"bias", "none"},
        {"fan_in_fan_out", model.architecture() == "gpt2"},
        {"inference_mode", true},
        {"init_lora_weights", true},
        {"layers_pattern", nullptr},
        {"layers_to_transform", nullptr},
        {"lora_alpha", config.lora_alpha},
        {"lora_dropout", config.lora_dropout},
        {"modules_to_save", nullptr},
        {"peft_type", "LORA"},
        {"r", config.r},
        {"rank_pattern", json::object()},
        {"revision", nullptr},
        {"target_modules", config.target_modules == std::vector<std::string>{"all-linear"} ? json("all-linear") : targets},
        {"task_type", "CAUSAL_LM"},
    };
    fs::create_directories(directory);
    save_safetensors(tensors, in_directory(directory, weights_file));
    const std::string text = adapter_config.dump(2) + "\n";
    io::write_file_atomically(in_directory(directory, config_file),
                              [&](const io::ByteSink& sink) { sink(text.data(), text.size()); });
}

} // namespace engine::nn
