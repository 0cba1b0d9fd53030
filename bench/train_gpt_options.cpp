// Flag parsing and validation for train_gpt.
#include "train_gpt_options.h"

#include "nn/io/pretrained.h"
#include "planner/planner.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "engine/cuda/runtime.h"

namespace train_gpt {

using engine::EngineError;

int64_t parse_integer(const std::string& flag, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size())
        throw UsageError(flag, "'" + text + "' is not an integer");
    if (errno == ERANGE) throw UsageError(flag, "'" + text + "' is out of range");
    return value;
}

int parse_int(const std::string& flag, const std::string& text) {
    const int64_t value = parse_integer(flag, text);
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
        throw UsageError(flag, "'" + text + "' is out of range");
    return static_cast<int>(value);
}

double parse_number(const std::string& flag, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value))
        throw UsageError(flag, "'" + text + "' is not a finite number");
    return value;
}

bool parse_bool(const std::string& flag, const std::string& text) {
    if (text == "true" || text == "1" || text == "yes") return true;
    if (text == "false" || text == "0" || text == "no") return false;
    throw UsageError(flag, "'" + text + "' is not true or false");
}

void require(bool condition, const std::string& flag, const std::string& reason) {
    if (!condition) throw UsageError(flag, reason);
}

std::string path_kind(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    switch (status.type()) {
    case fs::file_type::not_found: return "no such file";
    case fs::file_type::regular: return "a regular file";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a named pipe";
    case fs::file_type::socket: return "a socket";
    default: return error ? "unreadable (" + error.message() + ")" : "not a regular file";
    }
}

void require_file(const std::string& flag, const std::string& path) {
    std::error_code error;
    if (std::filesystem::is_regular_file(path, error)) return;
    const std::string kind = path_kind(path);
    throw UsageError(flag, kind == "no such file" ? "no such file '" + path + "'"
                                                  : "'" + path + "' is " + kind + ", not a regular file");
}

namespace {

// A directory an output flag writes after training (--save-adapter, --merge): checked now, not after the run.
void require_new_directory(const std::string& flag, const std::string& path) {
    namespace fs = std::filesystem;
    require(!path.empty(), flag, "needs a directory");
    std::error_code error;
    const fs::path target = fs::path(path).lexically_normal();
    const fs::path parent = (target.has_filename() ? target : target.parent_path()).parent_path();
    require(parent.empty() || fs::is_directory(parent, error), flag, "no directory for '" + path + "'");
    require(!fs::exists(target, error) || fs::is_directory(target, error), flag, "'" + path + "' is a file, not a directory");
}

// LoraConfig::problem() names PEFT's field first: its flag.
std::string lora_flag(const std::string& problem) {
    if (problem.rfind("lora_alpha", 0) == 0) return "--lora-alpha";
    if (problem.rfind("lora_dropout", 0) == 0) return "--lora-dropout";
    if (problem.rfind("target_modules", 0) == 0) return "--lora-target-modules";
    return "--lora-r";
}

// The engine's own checks, reported against the flag they came from.
template <typename Function>
auto as_flag(const std::string& flag, Function&& function) {
    try {
        return function();
    } catch (const EngineError& error) {
        throw flag_error(flag, error);
    }
}

} // namespace

std::string flag_for_field(const std::string& field) {
    // LlamaConfig's fields share the GPT-2 flags where the meaning is the same.
    static const std::map<std::string, std::string> llama_flags = {
        {"hidden_size", "--n-embd"},          {"num_hidden_layers", "--n-layer"},
        {"num_attention_heads", "--n-head"},  {"num_key_value_heads", "--n-kv-head"},
        {"max_position_embeddings", "--max-seq-len"}};
    if (const auto found = llama_flags.find(field); found != llama_flags.end()) return found->second;
    std::string flag = "--" + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return flag;
}

void check_trainer_config(const engine::optim::TrainerConfig& config) {
    if (const std::optional<engine::optim::ConfigProblem> problem = config.problem())
        throw UsageError(flag_for_field(problem->field), problem->reason);
}

UsageError flag_error(const std::string& flag, const std::exception& error) {
    std::string reason = error.what();
    const size_t location = reason.rfind(" (");
    if (location != std::string::npos && reason.back() == ')') reason.resize(location); // drop file:line
    return UsageError(flag, reason);
}

std::set<std::string> apply_flags(const std::vector<std::string>& arguments,
                                  const std::map<std::string, FlagSetter>& valued,
                                  const std::map<std::string, bool*>& switches) {
    std::set<std::string> given;
    for (size_t index = 0; index < arguments.size(); ++index) {
        std::string flag = arguments[index];
        std::optional<std::string> value;
        if (const size_t equals = flag.find('='); flag.rfind("--", 0) == 0 && equals != std::string::npos) {
            value = flag.substr(equals + 1);
            flag.resize(equals);
        }
        if (flag == "-h") flag = "--help";
        if (auto found = switches.find(flag); found != switches.end()) {
            *found->second = value ? parse_bool(flag, *value) : true;
            given.insert(flag);
            continue;
        }
        auto found = valued.find(flag);
        if (found == valued.end()) {
            if (flag.rfind("--", 0) != 0) throw UsageError(flag, "unexpected argument (flags start with --)");
            throw UsageError(flag, "unknown flag (see --help)");
        }
        if (!value) {
            if (index + 1 >= arguments.size()) throw UsageError(flag, "needs a value");
            value = arguments[++index];
        }
        found->second(flag, *value);
        given.insert(flag);
    }
    return given;
}

bool saves_directory(const std::string& path) {
    return std::filesystem::path(path).extension() != ".safetensors";
}

Options default_options() {
    Options options;
    options.model = engine::nn::GPTConfig::named("tiny");
    engine::optim::TrainerConfig& trainer = options.trainer;
    trainer.shape.per_device_train_batch_size = 8;
    trainer.shape.gradient_accumulation_steps = 2;
    trainer.learning_rate = 3e-3;
    trainer.weight_decay = 0.1;
    trainer.adam_beta1 = 0.9;
    trainer.adam_beta2 = 0.95;
    trainer.adam_epsilon = 1e-8;
    trainer.max_grad_norm = 1.0;
    trainer.lr_scheduler_type = "cosine";
    trainer.warmup_steps = 3;
    trainer.min_lr_ratio = 0.1;
    trainer.max_steps = 40;
    trainer.seed = 42;
    trainer.logging_steps = 1;
    return options;
}

Options parse_options(const std::vector<std::string>& arguments) {
    Options options = default_options();
    engine::optim::TrainerConfig& trainer = options.trainer;
    engine::StepShape& shape = trainer.shape;
    // Dimension overrides apply after --model, whatever the order on the command line.
    std::map<std::string, std::function<void(engine::nn::ModelConfig&)>> overrides;
    // A size flag sets the field of the same meaning in either architecture; a Llama-only flag is refused for
    // GPT-2 and --dropout for Llama, naming the flag.
    auto both = [&](const std::string& flag, int n, auto gpt_field, auto llama_field) {
        overrides[flag] = [n, gpt_field, llama_field](engine::nn::ModelConfig& c) {
            if (c.is_llama()) c.llama().*llama_field = n;
            else c.gpt().*gpt_field = n;
        };
    };
    auto llama_only = [&](const std::string& flag, int n, int engine::nn::LlamaConfig::*field) {
        overrides[flag] = [flag, n, field](engine::nn::ModelConfig& c) {
            require(c.is_llama(), flag, "is for Llama models; --model " + c.architecture() + " has no such setting");
            c.llama().*field = n;
        };
    };
    using engine::nn::GPTConfig;
    using engine::nn::LlamaConfig;
    std::set<std::string> given; // the flags on the command line, for the planner's conflicts
    engine::nn::LoraConfig lora; // --lora-*: applied to options.lora with --lora-r
    lora.target_modules.clear();
    bool lora_given = false;

    const std::map<std::string, FlagSetter> valued = {
        {"--model", [&](auto&, auto& value) { options.model_name = value; }},
        {"--vocab-size", [&](auto& f, auto& v) { both(f, parse_int(f, v), &GPTConfig::vocab_size, &LlamaConfig::vocab_size); }},
        {"--max-seq-len", [&](auto& f, auto& v) { both(f, parse_int(f, v), &GPTConfig::max_seq_len, &LlamaConfig::max_position_embeddings); }},
        {"--n-layer", [&](auto& f, auto& v) { both(f, parse_int(f, v), &GPTConfig::n_layer, &LlamaConfig::num_hidden_layers); }},
        {"--n-head", [&](auto& f, auto& v) { both(f, parse_int(f, v), &GPTConfig::n_head, &LlamaConfig::num_attention_heads); }},
        {"--n-embd", [&](auto& f, auto& v) { both(f, parse_int(f, v), &GPTConfig::n_embd, &LlamaConfig::hidden_size); }},
        {"--n-kv-head", [&](auto& f, auto& v) { llama_only(f, parse_int(f, v), &LlamaConfig::num_key_value_heads); }},
        {"--intermediate-size", [&](auto& f, auto& v) { llama_only(f, parse_int(f, v), &LlamaConfig::intermediate_size); }},
        {"--dropout", [&](auto& f, auto& v) {
             float p = static_cast<float>(parse_number(f, v));
             overrides[f] = [f, p](engine::nn::ModelConfig& c) {
                 require(c.is_gpt(), f, "is for GPT-2; Llama models have no dropout");
                 c.gpt().dropout = p;
             }; }},
        {"--seq-len", [&](auto& f, auto& v) { options.seq_len = parse_int(f, v); require(options.seq_len > 0, f, "must be positive"); }},
        // TrainerConfig's fields: a flag only parses its value; TrainerConfig::problem() is the one check of the
        // values, after every flag (check_trainer_config names the flag).
        {"--per-device-train-batch-size", [&](auto& f, auto& v) { shape.per_device_train_batch_size = parse_int(f, v); }},
        {"--max-tokens-per-micro-batch", [&](auto& f, auto& v) { options.max_tokens_per_micro_batch = parse_int(f, v); }},
        {"--gradient-accumulation-steps", [&](auto& f, auto& v) { shape.gradient_accumulation_steps = parse_int(f, v); }},
        {"--learning-rate", [&](auto& f, auto& v) { trainer.learning_rate = parse_number(f, v); }},
        {"--weight-decay", [&](auto& f, auto& v) { trainer.weight_decay = parse_number(f, v); }},
        {"--adam-beta1", [&](auto& f, auto& v) { trainer.adam_beta1 = parse_number(f, v); }},
        {"--adam-beta2", [&](auto& f, auto& v) { trainer.adam_beta2 = parse_number(f, v); }},
        {"--adam-epsilon", [&](auto& f, auto& v) { trainer.adam_epsilon = parse_number(f, v); }},
        {"--max-grad-norm", [&](auto& f, auto& v) { trainer.max_grad_norm = parse_number(f, v); }},
        {"--batch-invariant-chunk", [&](auto& f, auto& v) { trainer.batch_invariant_chunk = parse_int(f, v); require(trainer.batch_invariant_chunk > 0, f, "must be a number of sequences, 1 or more"); }},
        {"--lr-scheduler-type", [&](auto&, auto& v) { trainer.lr_scheduler_type = v; }},
        {"--warmup-steps", [&](auto& f, auto& v) { trainer.warmup_steps = parse_integer(f, v); }},
        {"--min-lr-ratio", [&](auto& f, auto& v) { trainer.min_lr_ratio = parse_number(f, v); }},
        {"--max-steps", [&](auto& f, auto& v) { trainer.max_steps = parse_integer(f, v); }},
        // A negative seed has no uint64_t to become: a parse error, not a rule.
        {"--seed", [&](auto& f, auto& v) { const int64_t seed = parse_integer(f, v); require(seed >= 0, f, "must be >= 0"); trainer.seed = static_cast<uint64_t>(seed); }},
        {"--logging-steps", [&](auto& f, auto& v) { trainer.logging_steps = parse_integer(f, v); }},
        {"--loss-normalization", [&](auto& f, auto& v) { trainer.loss_normalization = as_flag(f, [&] { return engine::optim::LossNormalization::parse(v); }); }},
        {"--optimizer", [&](auto& f, auto& v) { trainer.optimizer = as_flag(f, [&] { return engine::parse_optimizer_kind(v); }); }},
        {"--sgd-momentum", [&](auto& f, auto& v) { trainer.sgd_momentum = parse_number(f, v); }},
        {"--every-n-layers", [&](auto& f, auto& v) { shape.checkpointing.every_n_layers = parse_int(f, v); }},
        {"--segment-size", [&](auto& f, auto& v) { shape.checkpointing.segment_size = v == "sqrt" ? 0 : parse_int(f, v); }},
        {"--data", [&](auto& f, auto& v) { require_file(f, v); options.data = v; }},
        {"--init", [&](auto& f, auto& v) {
             std::error_code error;
             const std::string kind = path_kind(v);
             require(kind == "a regular file" || kind == "a directory", f,
                     kind == "no such file" ? "no such file or directory '" + v + "'"
                                            : "'" + v + "' is " + kind + ", not a weights file or a model directory");
             options.init = v; }},
        {"--save", [&](auto& f, auto& v) {
             // Checked now, not after training: a path that cannot become what --save writes would lose the run.
             namespace fs = std::filesystem;
             require(!v.empty(), f, "needs a path");
             std::error_code error;
             const fs::path path = fs::path(v).lexically_normal();
             const fs::path target = path.has_filename() ? path : path.parent_path(); // "out/" is the directory out
             const fs::path parent = target.parent_path();
             require(parent.empty() || fs::is_directory(parent, error), f, "no directory for '" + v + "'");
             if (saves_directory(v))
                 require(!fs::exists(target, error) || fs::is_directory(target, error), f,
                         "'" + v + "' is a file; a path not ending in .safetensors names a model directory");
             else
                 require(!fs::is_directory(target, error), f, "'" + v + "' is a directory, not a .safetensors file");
             options.save = v; }},
        {"--log", [&](auto& f, auto& v) { require(!v.empty(), f, "needs a file name"); options.log = v; }},
        {"--memory-timeline", [&](auto& f, auto& v) { require(!v.empty(), f, "needs a file name"); options.memory_timeline = v; }},
        {"--memory-timeline-step", [&](auto& f, auto& v) { options.memory_timeline_step = parse_integer(f, v); require(options.memory_timeline_step > 0, f, "must be a step, 1 or more"); }},
        {"--out", [&](auto& f, auto& v) { require(!v.empty(), f, "needs a directory"); options.out = v; }},
        {"--save-every", [&](auto& f, auto& v) { options.save_every = parse_integer(f, v); require(options.save_every > 0, f, "must be positive"); }},
        {"--resume", [&](auto& f, auto& v) {
             std::error_code error;
             require(std::filesystem::is_directory(v, error), f, "no such directory '" + v + "'");
             options.resume = v; }},
        {"--eval-data", [&](auto& f, auto& v) { require_file(f, v); options.eval_data = v; }},
        {"--eval-steps", [&](auto& f, auto& v) { options.eval_steps = parse_integer(f, v); require(*options.eval_steps >= 1, f, "must be >= 1"); }},
        {"--eval-every", [&](auto& f, auto& v) { options.eval_every = parse_integer(f, v); require(options.eval_every >= 1, f, "must be >= 1"); }},
        {"--tf32", [&](auto& f, auto& v) { options.tf32 = parse_bool(f, v); }},
        {"--precision", [&](auto& f, auto& v) {
             options.precision_auto = v == "auto";
             if (options.precision_auto) return;
             try {
                 shape.precision = engine::parse_precision(v);
             } catch (const EngineError&) {
                 throw UsageError(f, "'" + v + "' is not fp32, bf16 or auto");
             } }},
        {"--max-memory", [&](auto& f, auto& v) {
             options.max_memory_auto = v == "auto";
             if (!options.max_memory_auto) options.max_memory = as_flag(f, [&] { return engine::planner::parse_memory_size(v); }); }},
        {"--memory-limit", [&](auto& f, auto& v) { options.memory_limit = as_flag(f, [&] { return engine::planner::parse_memory_size(v); }); }},
        {"--max-host-memory", [&](auto& f, auto& v) {
             if (v != "auto") options.max_host_memory = as_flag(f, [&] { return engine::planner::parse_memory_size(v); }); }},
        {"--max-pinned-memory", [&](auto& f, auto& v) {
             options.max_pinned_memory = as_flag(f, [&] { return engine::planner::parse_memory_size(v); }); }},
        {"--global-batch-size", [&](auto& f, auto& v) { options.global_batch_size = parse_int(f, v); require(options.global_batch_size > 0, f, "must be positive"); }},
        {"--save-dtype", [&](auto& f, auto& v) {
             require(v == "fp32" || v == "bf16", f, "'" + v + "' is not fp32 or bf16");
             options.save_dtype = v == "bf16" ? engine::DType::bf16 : engine::DType::f32; }},
        {"--zero-stage", [&](auto& f, auto& v) { shape.zero_stage = parse_int(f, v); }},
        {"--world-size", [&](auto& f, auto& v) {
             options.world_size = parse_int(f, v);
             require(*options.world_size >= 1 && *options.world_size <= 1 << 20, f, "must be 1 to 1048576 ranks");
         }},
        {"--offload-optimizer", [&](auto& f, auto& v) {
             require(v == "none" || v == "cpu", f, "'" + v + "' is not none or cpu");
             shape.offload_optimizer = v == "cpu"; }},
        {"--offload-gradients", [&](auto& f, auto& v) {
             shape.offload_gradients = as_flag(f, [&] { return engine::parse_gradient_offload(v); }); }},
        {"--loss-chunk-tokens", [&](auto& f, auto& v) {
             if (v == "auto") return options.loss_chunk_tokens.reset();
             if (v == "off") return void(options.loss_chunk_tokens = 0);
             options.loss_chunk_tokens = parse_int(f, v);
             require(*options.loss_chunk_tokens >= 1, f, std::to_string(*options.loss_chunk_tokens) +
                                                             " must be >= 1 (off: the whole logits; auto: chosen)"); }},
        {"--mlp-tile-tokens", [&](auto& f, auto& v) {
             if (v == "auto") return options.mlp_tile_tokens.reset();
             if (v == "off") return void(options.mlp_tile_tokens = 0);
             options.mlp_tile_tokens = parse_int(f, v);
             require(*options.mlp_tile_tokens >= 1, f, std::to_string(*options.mlp_tile_tokens) +
                                                           " must be >= 1 (off: the whole MLP; auto: chosen)"); }},
        {"--offload-parameters", [&](auto& f, auto& v) {
             require(v == "none" || v == "cpu", f, "'" + v + "' is not none or cpu");
             shape.offload_parameters = v == "cpu"; }},
        {"--data-layout", [&](auto& f, auto& v) { options.data_layout = as_flag(f, [&] { return engine::nn::parse_data_layout(v); }); }},
        {"--eot-token", [&](auto& f, auto& v) { options.eot_token = parse_int(f, v); require(options.eot_token >= 0, f, "must be >= 0"); }},
        {"--communicator", [&](auto& f, auto& v) {
             require(v == "auto" || v == "none" || v == "mpi" || v == "nccl", f, "'" + v + "' is not auto, none, mpi or nccl");
             options.communicator = v; }},
        {"--lora-r", [&](auto& f, auto& v) { lora.r = parse_int(f, v); lora_given = true; }},
        {"--lora-alpha", [&](auto& f, auto& v) { lora.lora_alpha = parse_number(f, v); }},
        {"--lora-dropout", [&](auto& f, auto& v) { lora.lora_dropout = parse_number(f, v); }},
        {"--lora-target-modules", [&](auto& f, auto& v) {
             lora.target_modules.clear();
             std::stringstream names(v);
             for (std::string name; std::getline(names, name, ',');) lora.target_modules.push_back(name);
             require(!lora.target_modules.empty(), f, "needs a comma-separated list of layer names"); }},
        {"--init-adapter", [&](auto& f, auto& v) {
             std::error_code error;
             require(std::filesystem::is_regular_file(std::filesystem::path(v) / "adapter_config.json", error), f,
                     "'" + v + "' holds no adapter_config.json");
             options.init_adapter = v; }},
        {"--save-adapter", [&](auto& f, auto& v) { require_new_directory(f, v); options.save_adapter = v; }},
        {"--merge", [&](auto& f, auto& v) { require_new_directory(f, v); options.merge = v; }},
        {"--device", [&](auto& f, auto& v) { require(v == "auto" || v == "cpu" || v == "cuda", f, "'" + v + "' is not auto, cpu or cuda"); options.device = v; }},
    };
    const std::map<std::string, bool*> switches = {
        {"--gradient-checkpointing", &shape.checkpointing.enabled},
        {"--offload", &shape.checkpointing.offload},
        {"--prefetch", &shape.checkpointing.prefetch},
        {"--skip-nonfinite", &trainer.skip_nonfinite},
        {"--batch-invariant", &options.batch_invariant},
        {"--plan", &options.plan},
        {"--check-replicas", &options.check_replicas},
        {"--profile", &options.profile},
        {"--load-in-4bit", &options.load_in_4bit},
        {"--help", &options.help},
    };

    given = apply_flags(arguments, valued, switches);
    if (options.help) return options;
    // LoRA: every flag checked now, the targets against the model once it is built (before anything is written).
    const bool lora_flags = given.contains("--lora-alpha") || given.contains("--lora-dropout") ||
                            given.contains("--lora-target-modules");
    require(!options.init_adapter.empty() || lora_given || !lora_flags,
            given.contains("--lora-alpha") ? "--lora-alpha" : given.contains("--lora-dropout") ? "--lora-dropout"
                                                                                              : "--lora-target-modules",
            "needs --lora-r N (or --init-adapter DIR)");
    require(options.init_adapter.empty() || !(lora_given || lora_flags), "--init-adapter",
            "its adapter_config.json sets r, alpha, dropout and targets; leave the --lora-* flags out");
    require(lora_given || !options.init_adapter.empty() || !options.load_in_4bit, "--load-in-4bit",
            "the 4-bit base is frozen: QLoRA trains adapters over it; add --lora-r N (or --init-adapter DIR)");
    for (const char* lora_output : {"--save-adapter", "--merge"})
        require(lora_given || !options.init_adapter.empty() || !given.contains(lora_output), lora_output,
                "needs --lora-r N or --init-adapter DIR");
    if (lora_given || !options.init_adapter.empty()) {
        require(options.save.empty(), "--save", "writes the whole model; with LoRA use --save-adapter DIR or --merge DIR");
    }
    require(options.save_every == 0 || !options.out.empty(), "--save-every", "needs --out DIR");
    require(options.memory_timeline_step == 0 || !options.memory_timeline.empty(), "--memory-timeline-step",
            "needs --memory-timeline FILE");
    require(options.memory_timeline_step <= trainer.max_steps, "--memory-timeline-step",
            std::to_string(options.memory_timeline_step) + " is past --max-steps " + std::to_string(trainer.max_steps));
    require(!options.save_dtype || !options.save.empty(), "--save-dtype", "needs --save FILE|DIR");
    for (const char* eval_flag : {"--eval-steps", "--eval-every"})
        require(!options.eval_data.empty() || !given.contains(eval_flag), eval_flag, "needs --eval-data FILE");

    const bool init_directory = !options.init.empty() && std::filesystem::is_directory(options.init);
    if (init_directory) {
        // The directory's config.json is the model: a named size or a size flag would contradict it.
        for (const std::string& flag : {"--model", "--vocab-size", "--max-seq-len", "--n-layer", "--n-head", "--n-embd",
                                        "--n-kv-head", "--intermediate-size"})
            require(!given.contains(flag), flag,
                    "the model comes from --init " + options.init + "/config.json; leave " + flag + " out");
        options.model = as_flag("--init", [&] { return engine::nn::read_pretrained_config(options.init); });
        options.model_name = options.init;
    } else {
        options.model = as_flag("--model", [&] { return engine::nn::ModelConfig::named(options.model_name); });
    }
    for (const auto& [flag, apply] : overrides) apply(options.model);
    const engine::nn::ModelConfig& model = options.model;
    if (lora_given) {
        // PEFT's default targets for the architecture (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
        if (lora.target_modules.empty())
            lora.target_modules = model.is_llama() ? std::vector<std::string>{"q_proj", "v_proj"}
                                                   : std::vector<std::string>{"c_attn"};
        if (const std::optional<std::string> problem = lora.problem()) throw UsageError(lora_flag(*problem), *problem);
        options.lora = lora;
    }
    // The model's own rules (GPTConfig::problem, LlamaConfig::problem), named by the flag of the field.
    if (const std::optional<engine::ConfigProblem> problem = model.problem())
        throw UsageError(flag_for_field(problem->field), problem->reason);
    if (options.seq_len == 0) options.seq_len = model.max_seq_len();
    // The end of text that splits padded documents: the directory's eos_token_id when it names a token of the
    // vocabulary (transformers' tiny test configs keep GPT-2's 50256 over 64 ids), else GPT-2's rule.
    if (options.eot_token < 0 && init_directory) {
        const std::optional<int> end_of_text =
            as_flag("--init", [&] { return engine::nn::pretrained_end_of_text(options.init); });
        if (end_of_text && *end_of_text < model.vocab_size()) options.eot_token = *end_of_text;
    }
    if (options.eot_token < 0) options.eot_token = model.vocab_size() > 50256 ? 50256 : '\n';
    require(options.eot_token < model.vocab_size(), "--eot-token",
            std::to_string(options.eot_token) + " is outside the vocabulary of " + std::to_string(model.vocab_size()));
    require(options.seq_len <= model.max_seq_len(), "--seq-len",
            std::to_string(options.seq_len) + " exceeds the model's max sequence length " +
                std::to_string(model.max_seq_len()));
    const bool planned = options.max_memory || options.max_memory_auto;
    if (given.contains("--max-tokens-per-micro-batch")) {
        require(options.max_tokens_per_micro_batch >= options.seq_len, "--max-tokens-per-micro-batch",
                std::to_string(options.max_tokens_per_micro_batch) + " is below one sequence of --seq-len " +
                    std::to_string(options.seq_len) + " tokens");
        require(!planned, "--max-tokens-per-micro-batch",
                "the planner chooses the micro-batch under --max-memory; give one or the other");
    }
    require(planned || options.global_batch_size == 0, "--global-batch-size", "needs --max-memory (it is the planner's)");
    require(planned || !options.precision_auto, "--precision", "auto needs --max-memory (the planner chooses it)");
    for (const char* chosen : {"--per-device-train-batch-size", "--gradient-accumulation-steps", "--gradient-checkpointing",
                               "--every-n-layers", "--segment-size", "--offload", "--prefetch", "--zero-stage",
                               "--offload-optimizer", "--offload-gradients", "--offload-parameters"})
        require(!planned || !given.contains(chosen), chosen,
                "the planner chooses it under --max-memory; leave it out (give --global-batch-size instead)");
    // The batch-invariant mode: --batch-invariant alone takes chunks of one sequence, which divide every micro-batch.
    require(!given.contains("--batch-invariant") || options.batch_invariant || !given.contains("--batch-invariant-chunk"),
            "--batch-invariant", "false contradicts --batch-invariant-chunk");
    if (options.batch_invariant && trainer.batch_invariant_chunk == 0) trainer.batch_invariant_chunk = 1;
    // A token budget gives micro-batches of varying rows, which a chunk of several need not divide: refused now, not at
    // the first batch it does not divide.
    require(trainer.batch_invariant_chunk <= 1 || !given.contains("--max-tokens-per-micro-batch"),
            "--batch-invariant-chunk", std::to_string(trainer.batch_invariant_chunk) +
                                           " need not divide the rows --max-tokens-per-micro-batch gives each micro-batch; "
                                           "use chunks of 1 (--batch-invariant)");
    // In the mode a forward sees one chunk's rows, so the head's and the MLP's automatic tiles are sized for those (and so
    // are the same whatever the micro-batch, as the mode needs).
    const int forward_rows =
        trainer.batch_invariant_chunk > 0 ? trainer.batch_invariant_chunk : shape.per_device_train_batch_size;
    // The streaming head's chunk: a fixed one must fit in the micro-batch; auto is chosen here, or per plan.
    const std::string rows_name = trainer.batch_invariant_chunk > 0 ? "chunk's " : "micro-batch's ";
    if (options.loss_chunk_tokens && !planned) {
        const int64_t tokens = int64_t(forward_rows) * options.seq_len;
        require(*options.loss_chunk_tokens <= tokens, "--loss-chunk-tokens",
                std::to_string(*options.loss_chunk_tokens) + " is larger than the " + rows_name +
                    std::to_string(forward_rows) + " x " + std::to_string(options.seq_len) + " = " +
                    std::to_string(tokens) + " tokens");
    }
    if (options.mlp_tile_tokens && !planned) {
        const int64_t tokens = int64_t(forward_rows) * options.seq_len;
        require(*options.mlp_tile_tokens <= tokens, "--mlp-tile-tokens",
                std::to_string(*options.mlp_tile_tokens) + " is larger than the " + rows_name +
                    std::to_string(forward_rows) + " x " + std::to_string(options.seq_len) + " = " +
                    std::to_string(tokens) + " tokens");
    }
    if (!planned && forward_rows > 0) {
        const engine::DType dtype = engine::precision_dtype(shape.precision);
        shape.loss_chunk_tokens = options.loss_chunk_tokens.value_or(
            engine::planner::automatic_loss_chunk(model, forward_rows, options.seq_len, dtype));
        shape.mlp_tile_tokens = options.mlp_tile_tokens.value_or(
            engine::planner::automatic_mlp_tile(model, forward_rows, options.seq_len, dtype));
    }
    // Every rule on the training flags, in TrainerConfig. Under --max-memory the micro-batch is the planner's, a multiple
    // of the batch-invariant chunk it keeps (apply_memory_plan refuses a global batch the chunk cannot split).
    engine::optim::TrainerConfig checked = trainer;
    if (planned && checked.batch_invariant_chunk > 0) checked.shape.per_device_train_batch_size = checked.batch_invariant_chunk;
    check_trainer_config(checked);

    if (options.device == "cuda" || options.device == "auto") {
        const bool available = engine::cuda::device_available();
        // --plan predicts and allocates nothing: it may plan for a CUDA device this machine does not have.
        const bool planning_for_cuda = options.plan && options.device == "cuda";
        require(available || options.device == "auto" || planning_for_cuda, "--device",
                engine::cuda::backend_built ? "no CUDA device is present" : "this build of libengine has no CUDA backend");
        options.resolved_device = available || planning_for_cuda ? engine::Device::cuda : engine::Device::cpu;
    }
    // Offload moves model state from the device to the host: on the host there is nothing to move.
    require(!shape.offload_optimizer || options.resolved_device != engine::Device::cpu || options.plan,
            "--offload-optimizer",
            "cpu moves the model state from the device to host memory, but this run is on the CPU already");
    // Planning for ranks that are not launched: only a plan can be made for them.
    const engine::distributed::LaunchEnvironment launch = engine::distributed::launch_environment();
    require(!options.world_size || options.plan, "--world-size",
            "plans for N ranks without launching them (with --plan); to train on N ranks launch them: mpirun -np N");
    require(!options.world_size || !launch.launched || launch.world_size == 1 || *options.world_size == launch.world_size,
            "--world-size", std::to_string(options.world_size.value_or(0)) + " differs from the " +
                                std::to_string(launch.world_size) + " ranks launched");
    // Pinned memory is a device's page-locked host memory: the CPU backend pins nothing.
    require(!options.max_pinned_memory || options.resolved_device != engine::Device::cpu, "--max-pinned-memory",
            "budgets the host memory a device pins; this run is on the CPU, which pins none");
    // TF32 is a CUDA math mode: asking for it on the CPU is a mistake worth naming (false is harmless).
    require(!(options.tf32.value_or(false) && options.resolved_device != engine::Device::cuda), "--tf32",
            "true needs the CUDA device; this run is on the CPU, which computes in full fp32");
    return options;
}

} // namespace train_gpt
