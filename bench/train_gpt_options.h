// train_gpt's command line: every flag, its default, and the validation that turns a bad flag into one
// "train_gpt: error: --flag: reason" line (exit status 2) before anything is built.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "nn/lora.h"
#include "nn/model_config.h"
#include "nn/io/token_data.h"
#include "optim/trainer.h"

namespace train_gpt {

// A flag that cannot be used, with the reason; main prints it as one line and exits 2.
class UsageError : public std::runtime_error {
public:
    UsageError(const std::string& flag, const std::string& reason)
        : std::runtime_error(flag + ": " + reason), flag(flag) {}
    std::string flag;
};

// An engine error reported against the flag that caused it (without the source file:line suffix).
UsageError flag_error(const std::string& flag, const std::exception& error);

// The flag of a TrainerConfig field: "--" and the field with '-' for '_' (Hugging Face's names; the step
// shape's fields and its checkpoint policy's are named so too).
std::string flag_for_field(const std::string& field);
// TrainerConfig::problem(), the one check of the training flags' values, as a UsageError naming the flag.
void check_trainer_config(const engine::optim::TrainerConfig& config);

// Flag values, each throwing UsageError naming the flag (shared with generate_gpt).
int64_t parse_integer(const std::string& flag, const std::string& text);
int parse_int(const std::string& flag, const std::string& text);
double parse_number(const std::string& flag, const std::string& text); // finite
bool parse_bool(const std::string& flag, const std::string& text);
void require(bool condition, const std::string& flag, const std::string& reason);
// What `path` is, in words: "no such file", "a regular file", "a directory", "a character device", ...
std::string path_kind(const std::string& path);
// A regular file, or one UsageError naming the flag and what the path is instead (missing, a directory, a device).
void require_file(const std::string& flag, const std::string& path);

using FlagSetter = std::function<void(const std::string& flag, const std::string& value)>;
// Walks the command line: `--flag value` and `--flag=value` to the valued setters, `--flag` and
// `--flag=BOOL` to the switches (-h is --help); anything else is a UsageError naming it. Returns the flags given.
std::set<std::string> apply_flags(const std::vector<std::string>& arguments,
                                  const std::map<std::string, FlagSetter>& valued,
                                  const std::map<std::string, bool*>& switches);

struct Options {
    engine::nn::ModelConfig model; // --model's named size with the size flags, or --init DIR's config.json
    std::string model_name = "tiny";
    int seq_len = 0; // 0: the model's max_seq_len
    engine::optim::TrainerConfig trainer;
    std::string data;      // empty: the built-in corpus
    engine::nn::DataLayout data_layout = engine::nn::DataLayout::packed;
    int eot_token = -1;    // padded layout's end of text; -1: 50256 when the vocabulary has it, else '\n' (bytes)
    int max_tokens_per_micro_batch = 0; // a token budget per micro-batch (DataLoaderOptions::max_tokens); 0: none
    // Data parallelism (docs/DISTRIBUTED.md): auto is nccl on CUDA and mpi on the CPU when a launcher (mpirun)
    // started several ranks, else none.
    std::string communicator = "auto";
    bool check_replicas = false; // after every step, compare a hash of each rank's weights and optimizer state
    std::string init;      // weights to start from: a Hugging Face model directory (config.json decides the model) or a safetensors file
    std::string save;      // after training: FILE.safetensors, or a Hugging Face model directory (any other path)
    std::string log;       // JSON lines
    // --memory-timeline FILE: every allocation and free of step --memory-timeline-step (default: the run's first),
    // in Chrome's trace format (engine/memory_timeline.h); scripts/plot_memory.py draws it.
    std::string memory_timeline;
    int64_t memory_timeline_step = 0; // 0: the run's first step
    std::string out;       // training-state directory (optim/training_state.h): every --save-every steps and at the end
    int64_t save_every = 0; // 0: only at the end (when --out is given)
    std::string resume;    // training-state directory to continue from
    // Validation: every eval_every optimizer steps and after the last, the token mean of the loss over the
    // first eval_steps batches of eval_data (same layout, batch size and sequence length as training, in file
    // order, from its beginning each time). Empty eval_data: no evaluation. eval_steps unset: the default,
    // lowered to the batches the file holds.
    std::string eval_data;
    std::optional<int64_t> eval_steps;
    int64_t eval_every = 10;
    std::string device = "auto";
    engine::Device resolved_device = engine::Device::cpu;
    // CUDA GEMM and attention math: TF32 tensor cores (true) or full fp32 (false). Unset: TF32 on CUDA (the
    // engine's default). Hugging Face's `tf32`.
    std::optional<bool> tf32;
    // --precision fp32|bf16 sets trainer.shape.precision; --save-dtype: what --save writes (default the
    // parameters' dtype: the f32 masters).
    std::optional<engine::DType> save_dtype;
    bool plan = false;     // print the memory plan and exit
    bool batch_invariant = false; // --batch-invariant: chunk 1 unless --batch-invariant-chunk says
    // --max-memory SIZE|auto: the planner (planner/planner.h) picks the micro-batch, accumulation, checkpoint
    // policy, offload (and precision with --precision auto, ZeRO stage with several ranks) whose predicted peak
    // fits, for --global-batch-size sequences per optimizer step (default: the flags' b x N x ranks).
    std::optional<size_t> max_memory; // bytes
    bool max_memory_auto = false;     // free device memory minus 10%
    // --memory-limit SIZE: the run's device account refuses allocations past it (engine::set_memory_limit), as a
    // device of that size would: a smaller GPU's failures reproduced on any machine.
    std::optional<size_t> memory_limit;
    // --max-host-memory SIZE|auto: the host memory the model state offloaded to it may take (the planner's host
    // budget, and a check of --offload-optimizer cpu before anything is built). Unset: auto, the machine's
    // available memory minus 10%.
    std::optional<size_t> max_host_memory;
    // --max-pinned-memory SIZE: of the host memory, what may be pinned on a device (the planner's pinned budget, and
    // a check of the run's prediction before anything is built). Unset: no limit.
    std::optional<size_t> max_pinned_memory;
    // --world-size N, with --plan only: plan for N data-parallel ranks (ZeRO-1's shards, --max-memory's split of the
    // global batch) without launching them. Unset: the launcher's.
    std::optional<int> world_size;
    int global_batch_size = 0;
    bool precision_auto = false;      // --precision auto: the planner also tries bf16
    // --loss-chunk-tokens N|off|auto: the streaming LM head's chunk (StepShape::loss_chunk_tokens; off is 0).
    // Unset (auto): planner::automatic_loss_chunk, or under --max-memory the planner's choice.
    std::optional<int> loss_chunk_tokens;
    // --mlp-tile-tokens N|off|auto: the sequence-tiled MLP's tile (StepShape::mlp_tile_tokens; off is 0). Unset
    // (auto): planner::automatic_mlp_tile, or under --max-memory the planner's choice.
    std::optional<int> mlp_tile_tokens;
    // --profile (or ENGINE_PROFILE=1): the op profiler (engine/profiling.h) over the training steps after the
    // first two; its table is printed after training and logged under "profile" on the last --log line.
    bool profile = false;
    // LoRA (docs/TRAINING.md, "LoRA"): --lora-r N, or --init-adapter DIR (PEFT's adapter_config.json gives r,
    // alpha, dropout and targets), freezes the model and trains adapters; --save-adapter DIR writes PEFT's files
    // after training and --merge DIR a Hugging Face model directory with the adapters merged into the weights.
    std::optional<engine::nn::LoraConfig> lora;
    std::string init_adapter, save_adapter, merge;
    // --load-in-4bit (docs/TRAINING.md, "QLoRA"; transformers' load_in_4bit with bnb_4bit_quant_type nf4 and
    // double quantisation): every linear layer but the head in NF4 under the adapters (nn::quantize_nf4), on the
    // host before the model goes to the device. Needs LoRA; --merge then merges into the dense base.
    bool load_in_4bit = false;
    bool help = false;
};

inline constexpr int64_t default_eval_steps = 20;

// The defaults train the tiny model on the built-in corpus on the CPU in well under a minute.
Options default_options();
// --save PATH: a directory (save_pretrained) unless it names a .safetensors file.
bool saves_directory(const std::string& path);
// Parses and validates argv; throws UsageError naming the flag.
Options parse_options(const std::vector<std::string>& arguments);
std::string usage();

} // namespace train_gpt
