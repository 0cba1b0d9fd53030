// Hugging Face model directories: config.json to ModelConfig and back, sharded or single-file weights.
#include "nn/io/pretrained.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/io/atomic_file.h"
#include "nn/io/safetensors.h"

namespace engine::nn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string config_path(const std::string& directory) { return (fs::path(directory) / "config.json").string(); }

json read_json(const std::string& path) {
    const std::vector<uint8_t> bytes = io::read_file_bytes(path);
    try {
        return json::parse(bytes.begin(), bytes.end());
    } catch (const json::exception& error) {
        ENGINE_FAIL("'" << path << "': not valid JSON (" << error.what() << ")");
    }
}

// Typed reads of config.json keys: each error names the file and the key.
class ConfigReader {
public:
    ConfigReader(std::string path, const json& config, std::string prefix = "")
        : path_(std::move(path)), config_(config), prefix_(std::move(prefix)) {
        ENGINE_CHECK(config_.is_object(), "'" << path_ << "': the config is not a JSON object");
    }
    bool has(const std::string& key) const { return config_.contains(key) && !config_[key].is_null(); }
    int integer(const std::string& key) const {
        require(key);
        const json& value = config_[key];
        ENGINE_CHECK(value.is_number_integer() && value.get<int64_t>() > 0 && value.get<int64_t>() <= INT32_MAX,
                     "'" << path_ << "': key '" << prefix_ << key << "' must be a positive integer, got " << value.dump());
        return static_cast<int>(value.get<int64_t>());
    }
    int integer_or(const std::string& key, int fallback) const { return has(key) ? integer(key) : fallback; }
    double number_or(const std::string& key, double fallback) const {
        if (!has(key)) return fallback;
        const json& value = config_[key];
        ENGINE_CHECK(value.is_number() && std::isfinite(value.get<double>()),
                     "'" << path_ << "': key '" << prefix_ << key << "' must be a finite number, got " << value.dump());
        return value.get<double>();
    }
    bool boolean_or(const std::string& key, bool fallback) const {
        if (!has(key)) return fallback;
        ENGINE_CHECK(config_[key].is_boolean(), "'" << path_ << "': key '" << prefix_ << key << "' must be true or false, got "
                                                    << config_[key].dump());
        return config_[key].get<bool>();
    }
    std::string string_or(const std::string& key, const std::string& fallback) const {
        if (!has(key)) return fallback;
        ENGINE_CHECK(config_[key].is_string(),
                     "'" << path_ << "': key '" << prefix_ << key << "' must be a string, got " << config_[key].dump());
        return config_[key].get<std::string>();
    }
    // A key whose only supported value is `expected`; absent counts as the default `expected` too.
    void require_value(const std::string& key, const json& expected, const std::string& why) const {
        if (!has(key)) return;
        ENGINE_CHECK(config_[key] == expected, "'" << path_ << "': key '" << prefix_ << key << "' is " << config_[key].dump() << "; "
                                                   << why);
    }
    // A nested object (transformers 5's rope_parameters), read with the same checks; its errors name "key.inner".
    ConfigReader object(const std::string& key) const {
        ENGINE_CHECK(config_[key].is_object(),
                     "'" << path_ << "': key '" << prefix_ << key << "' must be an object, got " << config_[key].dump());
        return ConfigReader(path_, config_[key], prefix_ + key + ".");
    }
    void fail(const std::string& key, const std::string& why) const {
        ENGINE_FAIL("'" << path_ << "': key '" << prefix_ << key << "' " << why);
    }
    const std::string& path() const { return path_; }

private:
    void require(const std::string& key) const {
        ENGINE_CHECK(has(key), "'" << path_ << "': key '" << prefix_ << key << "' is missing");
    }
    std::string path_;
    const json& config_;
    std::string prefix_; // "" at the top level, "rope_parameters." inside it
};

GPTConfig gpt_from(const ConfigReader& config) {
    GPTConfig gpt;
    gpt.vocab_size = config.integer("vocab_size");
    gpt.max_seq_len = config.has("n_positions") ? config.integer("n_positions") : config.integer("n_ctx");
    gpt.n_embd = config.integer("n_embd");
    gpt.n_layer = config.integer("n_layer");
    gpt.n_head = config.integer("n_head");
    gpt.dropout = 0.0f; // train_gpt's --dropout decides; Hugging Face's pdrop values are not read
    const std::string activation = config.string_or("activation_function", "gelu_new");
    if (activation != "gelu_new" && activation != "gelu_pytorch_tanh")
        config.fail("activation_function", "is '" + activation + "'; this engine's GPT-2 uses the tanh GELU (gelu_new)");
    if (std::fabs(config.number_or("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12)
        config.fail("layer_norm_epsilon", "must be 1e-5, the only LayerNorm epsilon this engine's GPT-2 has");
    config.require_value("tie_word_embeddings", true, "this engine's GPT-2 head is tied to wte");
    config.require_value("scale_attn_by_inverse_layer_idx", false, "not supported");
    config.require_value("reorder_and_upcast_attn", false, "not supported");
    config.require_value("add_cross_attention", false, "not supported");
    if (config.has("n_inner")) config.fail("n_inner", "is set; this engine's GPT-2 MLP is 4 x n_embd wide");
    return gpt;
}

LlamaConfig llama_from(const ConfigReader& config) {
    LlamaConfig llama;
    llama.vocab_size = config.integer("vocab_size");
    llama.hidden_size = config.integer("hidden_size");
    llama.intermediate_size = config.integer("intermediate_size");
    llama.num_hidden_layers = config.integer("num_hidden_layers");
    llama.num_attention_heads = config.integer("num_attention_heads");
    llama.num_key_value_heads = config.integer_or("num_key_value_heads", llama.num_attention_heads);
    llama.max_position_embeddings = config.integer("max_position_embeddings");
    llama.rms_norm_eps = config.number_or("rms_norm_eps", 1e-6);
    llama.rope_theta = config.number_or("rope_theta", 10000.0);
    // transformers 5 moves the rotary settings into rope_parameters {rope_type, rope_theta, ...}: only the
    // default rotation is implemented, and a theta given twice must agree.
    if (config.has("rope_parameters")) {
        const ConfigReader rope = config.object("rope_parameters");
        const std::string type = rope.string_or("rope_type", "default");
        if (type != "default") rope.fail("rope_type", "is '" + type + "'; only the default rotary embedding is supported");
        if (rope.has("rope_theta")) {
            const double theta = rope.number_or("rope_theta", llama.rope_theta);
            if (config.has("rope_theta") && theta != llama.rope_theta)
                rope.fail("rope_theta", "disagrees with the top-level rope_theta " + std::to_string(llama.rope_theta));
            llama.rope_theta = theta;
        }
    }
    llama.tie_word_embeddings = config.boolean_or("tie_word_embeddings", false);
    llama.initializer_range = config.number_or("initializer_range", 0.02);
    if (config.has("rope_scaling"))
        config.fail("rope_scaling", "is set; rope_scaling is not supported (only the default rotary embedding)");
    config.require_value("hidden_act", "silu", "only SwiGLU with silu is supported");
    config.require_value("attention_bias", false, "attention biases are not supported");
    config.require_value("mlp_bias", false, "MLP biases are not supported");
    if (config.number_or("attention_dropout", 0.0) != 0.0)
        config.fail("attention_dropout", "is not 0; attention dropout is not supported");
    if (config.has("head_dim") &&
        int64_t{config.integer("head_dim")} * llama.num_attention_heads != int64_t{llama.hidden_size})
        config.fail("head_dim", "times num_attention_heads must equal hidden_size (" + std::to_string(llama.hidden_size) +
                                    "); other head sizes are not supported");
    if (const std::optional<ConfigProblem> problem = llama.problem()) config.fail(problem->field, problem->reason);
    return llama;
}

// The config.json transformers writes for the model, over `base` (the source's other keys, or empty).
json config_json(const CausalLM& model, json base, std::optional<DType> file_dtype) {
    if (!base.is_object()) base = json::object();
    // What the file holds: file_dtype, else the first parameter's own dtype.
    const DType stored = file_dtype.value_or(model.parameters().front().dtype());
    const char* torch_dtype = stored == DType::bf16 ? "bfloat16" : stored == DType::f64 ? "float64" : "float32";
    if (const auto* llama = dynamic_cast<const Llama*>(&model)) {
        const LlamaConfig& c = llama->config();
        base["architectures"] = {"LlamaForCausalLM"};
        base["model_type"] = "llama";
        base["vocab_size"] = c.vocab_size;
        base["hidden_size"] = c.hidden_size;
        base["intermediate_size"] = c.intermediate_size;
        base["num_hidden_layers"] = c.num_hidden_layers;
        base["num_attention_heads"] = c.num_attention_heads;
        base["num_key_value_heads"] = c.num_key_value_heads;
        base["head_dim"] = c.head_dim();
        base["max_position_embeddings"] = c.max_position_embeddings;
        base["rms_norm_eps"] = c.rms_norm_eps;
        base["rope_theta"] = c.rope_theta;
        base["rope_scaling"] = nullptr;
        base["tie_word_embeddings"] = c.tie_word_embeddings;
        base["initializer_range"] = c.initializer_range;
        base["hidden_act"] = "silu";
        base["attention_bias"] = false;
        base["mlp_bias"] = false;
        base["attention_dropout"] = 0.0;
        base["pretraining_tp"] = 1;
    } else if (const auto* gpt = dynamic_cast<const GPT*>(&model)) {
        const GPTConfig& c = gpt->config();
        base["architectures"] = {"GPT2LMHeadModel"};
        base["model_type"] = "gpt2";
        base["vocab_size"] = c.vocab_size;
        base["n_positions"] = c.max_seq_len;
        base["n_ctx"] = c.max_seq_len;
        base["n_embd"] = c.n_embd;
        base["n_layer"] = c.n_layer;
        base["n_head"] = c.n_head;
        base["activation_function"] = "gelu_new";
        base["layer_norm_epsilon"] = 1e-5;
        base["resid_pdrop"] = c.dropout;
        base["embd_pdrop"] = c.dropout;
        base["attn_pdrop"] = 0.0;
        base["tie_word_embeddings"] = true;
        base.erase("n_inner");
    } else {
        ENGINE_FAIL("save_pretrained: a " << model.architecture() << " model has no Hugging Face config");
    }
    base["torch_dtype"] = torch_dtype;
    if (base.contains("dtype")) base["dtype"] = torch_dtype; // transformers 5's name for it
    return base;
}

// The files of a model directory besides config.json and the weights that a fine-tuned copy should keep.
const char* const companion_files[] = {"generation_config.json", "tokenizer.json",  "tokenizer_config.json",
                                       "special_tokens_map.json", "tokenizer.model", "vocab.json",
                                       "merges.txt",              "added_tokens.json"};

void write_text_atomically(const std::string& path, const std::string& text) {
    io::write_file_atomically(path, [&](const io::ByteSink& sink) { sink(text.data(), text.size()); });
}

// Removes model.safetensors.index.json and the shards it names (never model.safetensors itself); throws naming
// the file that could not be removed.
void remove_stale_shards(const fs::path& root) {
    const fs::path index = root / "model.safetensors.index.json";
    if (!fs::exists(index)) return;
    std::set<std::string> shards;
    try {
        const json parsed = read_json(index.string());
        if (parsed.is_object() && parsed.contains("weight_map") && parsed["weight_map"].is_object())
            for (const auto& [tensor, file] : parsed["weight_map"].items())
                if (file.is_string() && file.get<std::string>().find('/') == std::string::npos)
                    shards.insert(file.get<std::string>());
    } catch (const EngineError&) {
        // an unreadable index still goes; its shards cannot be known
    }
    shards.erase("model.safetensors");
    shards.insert("model.safetensors.index.json");
    for (const std::string& name : shards) {
        std::error_code error;
        fs::remove(root / name, error);
        ENGINE_CHECK(!error, "save_pretrained: cannot remove the stale '" << (root / name).string() << "' ("
                                                                           << error.message() << ")");
    }
}

} // namespace

bool is_pretrained_directory(const std::string& path) {
    std::error_code error;
    return fs::is_directory(path, error) && fs::is_regular_file(config_path(path), error);
}

ModelConfig read_pretrained_config(const std::string& directory) {
    const std::string path = config_path(directory);
    ENGINE_CHECK(fs::is_regular_file(path), "'" << directory << "' has no config.json: not a Hugging Face model directory");
    const json parsed = read_json(path);
    const ConfigReader config(path, parsed);
    const std::string model_type = config.string_or("model_type", "");
    if (model_type == "gpt2") return gpt_from(config);
    if (model_type == "llama") return llama_from(config);
    if (model_type.empty()) config.fail("model_type", "is missing");
    config.fail("model_type", "is '" + model_type + "', which is not supported (supported: gpt2, llama)");
    return {};
}

std::vector<std::string> pretrained_weight_files(const std::string& directory) {
    const fs::path root(directory);
    const fs::path single = root / "model.safetensors";
    const fs::path index = root / "model.safetensors.index.json";
    // transformers' order: the single file first, the sharded index only without it.
    if (fs::is_regular_file(single)) return {single.string()};
    ENGINE_CHECK(fs::is_regular_file(index), "'" << directory << "' has neither model.safetensors nor "
                                                 << "model.safetensors.index.json");
    const json parsed = read_json(index.string());
    ENGINE_CHECK(parsed.is_object() && parsed.contains("weight_map") && parsed["weight_map"].is_object(),
                 "'" << index.string() << "': key 'weight_map' is missing or not an object");
    std::vector<std::string> files;
    std::set<std::string> seen;
    for (const auto& [tensor, file] : parsed["weight_map"].items()) {
        ENGINE_CHECK(file.is_string(), "'" << index.string() << "': weight_map['" << tensor << "'] is not a file name");
        const std::string name = file.get<std::string>();
        ENGINE_CHECK(name.find('/') == std::string::npos && name != ".." && !name.empty(),
                     "'" << index.string() << "': weight_map['" << tensor << "'] names '" << name
                         << "', which is not a file of the directory");
        if (!seen.insert(name).second) continue;
        const fs::path shard = root / name;
        ENGINE_CHECK(fs::is_regular_file(shard), "'" << index.string() << "': shard '" << name << "' (holding '"
                                                     << tensor << "') is missing from " << directory);
        files.push_back(shard.string());
    }
    ENGINE_CHECK(!files.empty(), "'" << index.string() << "': weight_map names no file");
    return files;
}

void load_pretrained_into(CausalLM& model, const std::string& directory) {
    CheckpointNames names;
    if (model.architecture() == "llama") {
        names.accepted_prefix = ""; // the names are LlamaForCausalLM's own, "model." included
        names.tied_table = "model.embed_tokens.weight";
    }
    load_safetensors_into(model, pretrained_weight_files(directory), names);
}

std::optional<int> pretrained_end_of_text(const std::string& directory) {
    const json config = read_json(config_path(directory));
    if (!config.is_object() || !config.contains("eos_token_id")) return std::nullopt;
    const json& value = config["eos_token_id"];
    const json& first = value.is_array() && !value.empty() ? value[0] : value;
    if (!first.is_number_integer() || first.get<int64_t>() < 0 || first.get<int64_t>() > INT32_MAX) return std::nullopt;
    return static_cast<int>(first.get<int64_t>());
}

void save_pretrained(const CausalLM& model, const std::string& directory, std::optional<DType> requested_dtype,
                     const std::string& source_directory) {
    // A quantised layer's weight is no parameter: the file would lack it, and a reader would take the directory
    // for a whole model.
    ENGINE_CHECK(model.buffer_bytes() == 0,
                 "save_pretrained: the model holds weights in NF4 (nn::quantize_nf4), which a pretrained directory "
                 "does not store; save the adapter (save_adapter) and load the dense base again to merge it");
    // One dtype for the whole file: the widest of the parameters' (frozen ones are bf16 under bf16 compute,
    // and widen exactly), unless one is asked for.
    std::optional<DType> file_dtype = requested_dtype;
    if (!file_dtype) {
        file_dtype = DType::bf16;
        for (const Tensor& parameter : model.parameters())
            if (parameter.dtype() == DType::f64 || (parameter.dtype() == DType::f32 && *file_dtype == DType::bf16))
                file_dtype = parameter.dtype();
    }
    json base = json::object();
    if (!source_directory.empty() && is_pretrained_directory(source_directory))
        base = read_json(config_path(source_directory));
    const json config = config_json(model, base, file_dtype); // throws before anything is written
    std::error_code error;
    fs::create_directories(directory, error);
    ENGINE_CHECK(!error && fs::is_directory(directory),
                 "save_pretrained: cannot create the directory '" << directory << "' (" << error.message() << ")");
    const fs::path root(directory);
    // The weights first: a directory whose config.json exists is taken for a whole model by readers.
    save_safetensors(model, (root / "model.safetensors").string(), file_dtype,
                     model.architecture() == "gpt2" ? "transformer." : "");
    // Shards an earlier save (or the source itself) left here would be stale next to the new single file:
    // remove the index and every shard it names, so the directory holds one set of weights.
    remove_stale_shards(root);
    write_text_atomically((root / "config.json").string(), config.dump(2) + "\n");
    if (source_directory.empty() || fs::equivalent(source_directory, directory, error)) return;
    for (const char* name : companion_files) {
        const fs::path from = fs::path(source_directory) / name;
        if (!fs::is_regular_file(from)) continue;
        const std::vector<uint8_t> bytes = io::read_file_bytes(from.string());
        io::write_file_atomically((root / name).string(),
                                  [&](const io::ByteSink& sink) { sink(bytes.data(), bytes.size()); });
    }
}

} // namespace engine::nn
