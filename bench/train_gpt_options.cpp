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

std::string usage() {
    return R"(usage: train_gpt [flags]     (no flags: the tiny GPT on the built-in corpus, on the CPU)

model:
  --model NAME                   GPT-2: tiny | small | gpt2-124M | gpt2-350M | gpt2-774M | gpt2-1558M;
                                 Llama: llama-tiny | smollm-135m (default tiny)
  --vocab-size N --max-seq-len N --n-layer N --n-head N --n-embd N   override the named size
  --n-kv-head N --intermediate-size N    Llama only: key/value heads (grouped-query attention), MLP width
  --dropout P                    GPT-2 only (default 0)
  --seq-len N                    tokens per sequence (default: the model's max)
  --init DIR|FILE.safetensors    start from these weights. DIR: a Hugging Face model directory (config.json with
                                 model.safetensors or sharded files): its config decides the architecture and
                                 every size, so --model and the size flags are refused. FILE: Hugging Face
                                 names of the --model architecture
  --save DIR|FILE.safetensors    write the trained weights (the f32 masters; see --save-dtype). A path ending in
                                 .safetensors: that one file. Any other path (model.bin included, which before
                                 Llama support wrote a file) is a directory transformers' from_pretrained loads:
                                 config.json, model.safetensors, and --init DIR's tokenizer files
  --save-dtype fp32|bf16         the dtype --save writes (default fp32; bf16 rounds to nearest even)
data:
  --data FILE                    llm.c token shard or any file as bytes (default: built-in corpus)
  --data-layout packed|padded|packed-documents
                                 packed: windows of --seq-len tokens (default); padded: one document per
                                 sequence, split at --eot-token, truncated or padded (labels -100);
                                 packed-documents: those documents packed back to back into each sequence,
                                 positions restarting and attention kept inside each document
  --max-tokens-per-micro-batch N a token budget per micro-batch: rows are taken while rows x the longest
                                 stays within N (and within --per-device-train-batch-size), cut to the
                                 longest (padded: its longest document; packed-documents: its fullest row);
                                 at least --seq-len; --plan plans for the worst micro-batch; one rank
  --eot-token N                  end of text for padded and packed-documents (default: --init DIR's
                                 eos_token_id; else 50256 if the vocabulary has it, else 10, '\n')
data parallelism (mpirun -np N train_gpt ...; docs/DISTRIBUTED.md):
  --communicator auto|none|mpi|nccl   auto: nccl on CUDA, mpi on the CPU when launched with several ranks
  --check-replicas[=true|false]  after every step, check every rank holds bitwise the same weights and moments
  --zero-stage 0|1|2             1: each rank keeps the optimizer state of 1/N of the parameters (ZeRO-1);
                                 2: and their summed gradients (ZeRO-2; needs --gradient-checkpointing)
  --world-size N                 with --plan: plan for N data-parallel ranks without launching them (default: the
                                 launcher's, 1 without one)
  --offload-optimizer none|cpu   cpu: the f32 masters, their gradients and the optimizer state live in host
                                 memory and the update runs there; the device keeps the working weights and the
                                 step's gradients (DeepSpeed's offload_optimizer; needs --device cuda)
  --offload-gradients window|stream   with --offload-optimizer cpu, where the step's gradients are summed.
                                 window (default): on the device, copied down once per step. stream: on the host;
                                 each checkpointed segment's gradients exist on the device only during its
                                 backward (needs --gradient-checkpointing)
  --loss-chunk-tokens N|off|auto the streaming LM head: the loss and its gradients over chunks of N of the
                                 micro-batch's B x T tokens, so that the (B,T,V) logits never exist (off: the
                                 whole logits; auto (default): the head's buffers (a chunk's logits, d(hidden),
                                 the losses) within 256 MiB: all tokens when the whole logits fit, else the
                                 largest multiple of 64 that does; under --max-memory the planner's choice)
  --mlp-tile-tokens N|off|auto   the sequence-tiled MLP: every layer's MLP over tiles of N of the micro-batch's
                                 B x T tokens, so that its intermediates exist one tile at a time, for one more
                                 MLP forward in backward (off: the whole MLP; auto (default): off while a layer's
                                 MLP intermediates take at most 256 MiB, else the largest multiple of 64 tokens
                                 whose intermediates take at most 64 MiB; under --max-memory the planner's choice,
                                 and a fixed N is cut to each plan's micro-batch)
  --offload-parameters none|cpu  with --offload-optimizer cpu and --gradient-checkpointing, cpu: the checkpointed
                                 layers' working weights live in host memory too and come to the device for each
                                 segment's forward and again for its recompute and backward, one segment at a time
                                 (DeepSpeed's offload_param); the embeddings and the head stay
LoRA (PEFT's names; docs/TRAINING.md, "LoRA"): the model frozen, adapters on the target layers trained
  --lora-r N                     LoRA of rank N on --lora-target-modules
  --lora-alpha X                 scaling X / r (default 8, PEFT's)
  --lora-dropout P               dropout on the adapters' input (default 0)
  --lora-target-modules A,B,...  layer names or their last parts (default PEFT's: q_proj,v_proj for Llama,
                                 c_attn for GPT-2); all-linear: every linear layer but the head
  --init-adapter DIR             start from a PEFT adapter directory (its config sets r, alpha, dropout, targets)
  --save-adapter DIR             after training, write the adapters as PEFT's adapter_config.json and
                                 adapter_model.safetensors (PeftModel.from_pretrained loads them)
  --merge DIR                    after training, write a Hugging Face model directory with the adapters merged
                                 (with --load-in-4bit: into the dense base, --init's weights)
  --load-in-4bit                 QLoRA: the base's linear layers (not the head) frozen in NF4 with double-
                                 quantised scales, bitsandbytes' layout (0.5 bytes a weight), dequantised for
                                 each use in the compute dtype; needs --lora-r or --init-adapter
training (Hugging Face names; each flag sets the TrainerConfig field of its name, whose validate() is the one
check of the values; the defaults shown are train_gpt's, for a quick run of the tiny model; the library's
TrainerConfig{} differs in: gradient_accumulation_steps 1, learning_rate 1e-3, weight_decay 0, adam_beta2 0.999,
lr_scheduler_type constant, warmup_steps 0, min_lr_ratio 0, max_steps 100):
  --per-device-train-batch-size N   sequences per micro-batch (default 8)
  --gradient-accumulation-steps N   micro-batches per optimizer step (default 2)
  --learning-rate X (3e-3)  --weight-decay X (0.1, 2-D weights only)
  --adam-beta1 X (0.9)  --adam-beta2 X (0.95)  --adam-epsilon X (1e-8)
  --max-grad-norm X (1.0; 0 = off)  --optimizer adamw|sgd  --sgd-momentum X (0.9)
  --lr-scheduler-type constant|cosine (cosine)  --warmup-steps N (3)  --min-lr-ratio X (0.1)
  --max-steps N (40)  --seed N (42)  --logging-steps N (1)
  --loss-normalization tokens|mean  tokens: sum of token losses / targets in the whole step (default)
memory:
  --gradient-checkpointing[=true|false]  --every-n-layers N (1)  --segment-size N|sqrt (1; 0 = sqrt)
  --offload[=true|false]         checkpointed segments' inputs in pinned host memory; needs --gradient-checkpointing
  --prefetch[=true|false]        with --offload: copy the next segment back ahead of its recompute (CUDA copy stream)
  --skip-nonfinite[=true|false]  skip (and count) a step whose loss or grad norm is NaN/Inf; default: stop with an error
  --plan                         print the predicted memory per category for these flags and exit (with LoRA: the
                                 model state beside a full fine-tune's first; with --eval-data: the evaluation's peak)
  --max-memory SIZE|auto         plan for a memory budget: bytes or a number with KiB, MiB, GiB (3.5MiB, 16GiB);
                                 auto: the device's free memory (CPU: MemAvailable) minus 10%. The planner picks
                                 micro-batch, accumulation, checkpointing and offload (and precision with
                                 --precision auto, ZeRO stage with several ranks): the least predicted time that
                                 fits. With --plan it prints the plan and exits; no plan fits: exit 2
  --global-batch-size S          with --max-memory: sequences per optimizer step over all ranks (default b x N)
  --memory-limit SIZE            the device's account refuses allocations past SIZE, as a device of that size
                                 would (out of memory: the phase, the category and the plan's prediction named,
                                 and with --out the training state written before the failed step)
  --max-host-memory SIZE|auto    host memory one rank's offloaded model state may take: the planner's host budget,
                                 and checked against --offload-optimizer cpu's prediction before anything is built
                                 (default auto: MemAvailable minus 10%; ranks sharing a host share it: divide it)
  --max-pinned-memory SIZE       of it, what may be pinned (page-locked) on a device: offloaded segment inputs,
                                 parked weights, staged ids, the save's block: the planner's pinned budget, and
                                 checked against the run's prediction before anything is built (default: none)
  --device auto|cpu|cuda         (auto: cuda when a device is present; with --plan, cuda plans for a CUDA device
                                 even on a machine without one)
  --tf32 true|false              CUDA GEMMs and attention on TF32 tensor cores (default true on CUDA; false:
                                 full fp32, to compare with the CPU)
  --precision fp32|bf16|auto     bf16: mixed precision (Hugging Face's bf16): bf16 activations and working copy
                                 of the weights, f32 master weights and gradient buffers (default fp32);
                                 auto (with --max-memory): the planner may choose bf16
validation:
  --eval-data FILE               held-out tokens (llm.c shard or bytes, as --data): every --eval-every steps
                                 and after the last, print and log (eval_loss) the token mean of the loss over
                                 its first --eval-steps batches, read in file order from its start each time,
                                 in eval mode (no dropout); training is bitwise the same with or without it
  --eval-steps K                 batches per evaluation, each --per-device-train-batch-size sequences per rank
                                 (default 20, or every batch of a smaller file)
  --eval-every M                 optimizer steps between evaluations (default 10)
output:
  --log FILE                     JSON lines, one per logged step, same fields as the printed line (and
                                 eval_loss, eval_batches, eval_num_items on an evaluated step, always logged)
  --out DIR --save-every K       training state (weights, optimizer, RNG, data cursor, config) every K steps
                                 and at the end; DIR keeps the newest two (docs/RELIABILITY.md)
  --resume DIR                   continue from the newest valid training state in DIR
  --memory-timeline FILE         record every allocation and free of one step (category, size, op, phase) in
                                 Chrome's trace format (Perfetto opens it); scripts/plot_memory.py FILE draws it
  --memory-timeline-step K       which step (default: the run's first)
  --profile[=true|false]         time every CPU kernel per op and phase (forward, backward, grad_norm,
                                 optimizer) over the steps after the first two; print the table and the GEMM
                                 share after training, and log it under "profile" on the last --log line
  --help
)";
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
    // The streaming head's chunk: a fixed one must fit in the micro-batch; auto is chosen here, or per plan.
    if (options.loss_chunk_tokens && !planned) {
        const int64_t tokens = int64_t(shape.per_device_train_batch_size) * options.seq_len;
        require(*options.loss_chunk_tokens <= tokens, "--loss-chunk-tokens",
                std::to_string(*options.loss_chunk_tokens) + " is larger than the micro-batch's " +
                    std::to_string(shape.per_device_train_batch_size) + " x " + std::to_string(options.seq_len) +
                    " = " + std::to_string(tokens) + " tokens");
    }
    if (options.mlp_tile_tokens && !planned) {
        const int64_t tokens = int64_t(shape.per_device_train_batch_size) * options.seq_len;
        require(*options.mlp_tile_tokens <= tokens, "--mlp-tile-tokens",
                std::to_string(*options.mlp_tile_tokens) + " is larger than the micro-batch's " +
                    std::to_string(shape.per_device_train_batch_size) + " x " + std::to_string(options.seq_len) +
                    " = " + std::to_string(tokens) + " tokens");
    }
    if (!planned && shape.per_device_train_batch_size > 0) {
        const engine::DType dtype = engine::precision_dtype(shape.precision);
        shape.loss_chunk_tokens = options.loss_chunk_tokens.value_or(
            engine::planner::automatic_loss_chunk(model, shape.per_device_train_batch_size, options.seq_len, dtype));
        shape.mlp_tile_tokens = options.mlp_tile_tokens.value_or(
            engine::planner::automatic_mlp_tile(model, shape.per_device_train_batch_size, options.seq_len, dtype));
    }
    check_trainer_config(trainer); // every rule on the training flags, in TrainerConfig

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
