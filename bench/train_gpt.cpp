// train_gpt, the main job: trains a GPT-2 or a Llama-family model (from a named size or a Hugging Face
// directory) with gradient accumulation and prints one line per optimizer step
// (loss, lr, grad norm, throughput, peak memory by category). With no flags it trains the tiny model on the
// built-in corpus on the CPU in well under a minute. `train_gpt --help` lists the flags; docs/TRAINING.md
// explains the figures.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/memory_timeline.h"
#include "engine/profiling.h"
#include "nn/io/peft.h"
#include "nn/io/pretrained.h"
#include "nn/io/safetensors.h"
#include "nn/io/token_data.h"
#include "nn/qlora.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "train_gpt_options.h"
#include "train_gpt_outputs.h"
#include "train_gpt_plan.h"
#include "train_gpt_records.h"
#include "engine/cuda/runtime.h"

namespace {

// Whether the steps began: an out-of-memory failure before them was the model's set-up (train_gpt --memory-limit
// below what the model state holds), not a step's.
bool steps_started = false;

using namespace engine;
using train_gpt::Options;
using train_gpt::check_replicas;
using train_gpt::mebibytes;
using train_gpt::profile_record;
using train_gpt::profile_warmup_steps;
using train_gpt::replica_hash;
using train_gpt::run_config_json;
using train_gpt::step_line;
using train_gpt::step_record;

constexpr size_t builtin_corpus_tokens = 1 << 18; // 256 KiB of text: ~500 windows of 64 at the defaults

// The token stream: the --data file (llm.c shard or bytes), else the built-in corpus. Ids are validated
// against the vocabulary.
std::vector<int32_t> load_training_tokens(const Options& options) {
    if (!options.data.empty()) return nn::load_tokens(options.data, options.model.vocab_size());
    std::vector<int32_t> tokens = nn::builtin_corpus(builtin_corpus_tokens, options.trainer.seed);
    nn::validate_tokens(tokens, options.model.vocab_size(), "the built-in corpus (bytes; needs --vocab-size >= 256)");
    return tokens;
}

// The loader settings training and validation share: per_device_train_batch_size windows of seq_len tokens
// (or documents, padded) per micro-batch, full batches only; each rank reads its part of every global batch.
nn::DataLoaderOptions loader_options(const Options& options, const distributed::Communicator& communicator) {
    nn::DataLoaderOptions loader;
    loader.layout = options.data_layout;
    loader.end_of_text = options.eot_token;
    loader.rank = communicator.rank();
    loader.world_size = communicator.world_size();
    loader.batch_size = options.trainer.shape.per_device_train_batch_size;
    loader.sequence_length = options.seq_len;
    loader.seed = options.trainer.seed;
    loader.drop_last = true;
    loader.device = options.resolved_device;
    loader.max_tokens = options.max_tokens_per_micro_batch;
    if (loader.max_tokens > 0 && loader.world_size > 1)
        throw train_gpt::UsageError("--max-tokens-per-micro-batch",
                                    "works on one rank; this run has " + std::to_string(loader.world_size));
    return loader;
}

// The training batches, shuffled with the seed, cycling over epochs; max_steps bounds the run.
std::unique_ptr<nn::DataLoader> make_loader(const Options& options, const distributed::Communicator& communicator) {
    nn::DataLoaderOptions loader = loader_options(options, communicator);
    loader.shuffle = true;
    return std::make_unique<nn::DataLoader>(load_training_tokens(options), loader);
}

// --eval-data: the same first K batches of the file for every evaluation, so that their losses compare. Its
// loader is its own (the training loader's cursor never moves for it), in file order, rewound before each
// evaluation; with data parallelism each rank reads its part of every global batch and Trainer::evaluate
// all-reduces the sums. Reads and checks the file now, before training, naming the flag at fault.
class Validation {
public:
    Validation(const Options& options, const distributed::Communicator& communicator) {
        nn::DataLoaderOptions settings = loader_options(options, communicator);
        settings.shuffle = false;
        try {
            loader_ = std::make_unique<nn::DataLoader>(nn::load_tokens(options.eval_data, options.model.vocab_size()),
                                                       settings);
        } catch (const EngineError& error) {
            throw train_gpt::flag_error("--eval-data", error);
        }
        start_ = loader_->cursor();
        const int64_t available = loader_->batches_per_epoch();
        batch_count_ = options.eval_steps.value_or(std::min(train_gpt::default_eval_steps, available));
        // More would repeat the file's batches, weighting some twice.
        if (batch_count_ > available)
            throw train_gpt::UsageError("--eval-steps", std::to_string(batch_count_) + " batches exceed the " +
                                                            std::to_string(available) + " that " + options.eval_data +
                                                            " holds at this batch size and sequence length");
    }

    // Every rank calls it (Trainer::evaluate's two collectives).
    optim::Trainer::Evaluation evaluate(optim::Trainer& trainer) {
        loader_->restore(start_);
        std::vector<nn::Batch> batches;
        batches.reserve(static_cast<size_t>(batch_count_));
        for (int64_t index = 0; index < batch_count_; ++index) batches.push_back(*loader_->next());
        return trainer.evaluate(batches);
    }

    int64_t batch_count() const { return batch_count_; }
    int64_t batch_count_available() const { return loader_->batches_per_epoch(); }

private:
    std::unique_ptr<nn::DataLoader> loader_;
    nn::LoaderCursor start_;
    int64_t batch_count_ = 0;
};

// --init: a Hugging Face directory (config.json already read into the model's shape), or one safetensors file
// with the architecture's Hugging Face names.
void load_initial_weights(nn::CausalLM& model, const std::string& path) {
    if (nn::is_pretrained_directory(path)) return nn::load_pretrained_into(model, path);
    if (model.architecture() == "llama") {
        nn::CheckpointNames names;
        names.accepted_prefix = "";
        names.tied_table = "model.embed_tokens.weight";
        return nn::load_safetensors_into(model, std::vector<std::string>{path}, names);
    }
    nn::load_safetensors_into(model, path);
}

// Which backend this run uses: --communicator, or under a launcher with several ranks NCCL for CUDA tensors
// and MPI for host ones.
distributed::Backend choose_backend(const Options& options) {
    if (options.communicator != "auto") return distributed::parse_backend(options.communicator);
    const distributed::LaunchEnvironment launch = distributed::launch_environment();
    if (!launch.launched || launch.world_size == 1) return distributed::Backend::none;
    // With the model state on the host, the gradients are reduced there.
    const bool device_tensors = options.resolved_device == Device::cuda && !options.trainer.shape.offload_optimizer;
    return device_tensors ? distributed::Backend::nccl : distributed::Backend::mpi;
}

int run(const Options& flags) {
    const int planned_ranks = flags.world_size ? *flags.world_size
                              : choose_backend(flags) == distributed::Backend::none
                                  ? 1
                                  : distributed::launch_environment().world_size;
    const Options options =
        flags.max_memory || flags.max_memory_auto ? train_gpt::apply_memory_plan(flags, planned_ranks) : flags;
    const optim::TrainerConfig& config = options.trainer;
    if (!options.plan) train_gpt::check_host_budget(options);
    if (options.plan) return train_gpt::print_plan(options);

    // First, so that an NCCL rank binds its GPU before anything touches the device.
    const std::unique_ptr<distributed::Communicator> communicator = distributed::make_communicator(choose_backend(options));
    const bool lead = communicator->rank() == 0; // only rank 0 prints, logs and writes files
    if (communicator->world_size() == 1 && distributed::launch_environment().world_size > 1)
        std::cerr << "train_gpt: warning: launched as one of " << distributed::launch_environment().world_size
                  << " ranks with --communicator " << options.communicator
                  << ": each process trains alone on the same data and writes the same files\n";
    const int world_size = communicator->world_size();
    std::unique_ptr<nn::DataLoader> loader;
    try {
        loader = make_loader(options, *communicator);
    } catch (const EngineError& error) {
        // A vocabulary from --init DIR is not a flag to change: the data is what must fit it.
        const bool vocabulary_given = !options.data.empty() || nn::is_pretrained_directory(options.init);
        throw train_gpt::flag_error(vocabulary_given ? "--data" : "--vocab-size", error);
    }
    std::optional<Validation> validation;
    if (!options.eval_data.empty()) validation.emplace(options, *communicator);
    if (options.resolved_device == Device::cuda) engine::cuda::set_tf32_enabled(options.tf32.value_or(true));
    if (options.memory_limit) engine::set_memory_limit(options.resolved_device, *options.memory_limit);
    // With the optimizer on the host the masters are built there, and only the working copies ever reach the
    // device: the device never holds the f32 masters the plan took off it.
    // A 4-bit base is quantised on the host too, so that the device never holds the dense f32 weights.
    const bool offload = config.shape.offload_optimizer;
    const bool on_host_first = offload || options.load_in_4bit;
    const std::unique_ptr<nn::CausalLM> built =
        options.model.build(options.trainer.seed, on_host_first ? Device::cpu : options.resolved_device, DType::f32);
    nn::CausalLM& model = *built;
    std::ostringstream setup; // what the set-up reports, printed once the outputs are checked
    const auto load_init = [&] {
        if (options.init.empty()) return;
        // The load phase's peaks, as --plan predicts them: the weights stream from the files into the model.
        reset_peak(model.device());
        reset_peak(Device::cpu);
        try {
            load_initial_weights(model, options.init);
        } catch (const EngineError& error) {
            throw train_gpt::flag_error("--init", error);
        }
        if (lead) setup << "loaded --init " << options.init << " (" << train_gpt::phase_peaks(model.device()) << ")\n";
    };
    // LoRA: the base weights first (--init holds no adapter), then the adapters, before any working copy or
    // placement, which then treat them as the layers' own parameters.
    const bool lora = options.lora || !options.init_adapter.empty();
    std::optional<nn::LoraConfig> lora_config = options.lora;
    if (lora) {
        load_init();
        nn::ParameterOptions adapter_options;
        adapter_options.generator = std::make_shared<nn::Generator>(options.trainer.seed + 1);
        try {
            if (!options.init_adapter.empty()) lora_config = nn::load_adapter(model, options.init_adapter, adapter_options);
            else nn::apply_lora(model, *options.lora, adapter_options);
        } catch (const EngineError& error) {
            const bool rank = std::string(error.what()).find("LoRA: r ") != std::string::npos;
            throw train_gpt::flag_error(!options.init_adapter.empty() ? "--init-adapter"
                                        : rank                        ? "--lora-r"
                                                                      : "--lora-target-modules",
                                        error);
        }
        if (lead)
            setup << "LoRA: r " << lora_config->r << ", alpha " << lora_config->lora_alpha << ", dropout "
                      << lora_config->lora_dropout << ", " << nn::adapted_layers(model).size() << " layers adapted; "
                      << model.trainable_parameter_count() << " of " << model.parameter_count()
                      << " parameters train\n";
    }
    if (options.load_in_4bit) {
        const std::vector<std::string> quantized = nn::quantize_nf4(model);
        if (lead)
            setup << "NF4: " << quantized.size() << " linear layers in 4 bits (" << model.buffer_bytes()
                      << " B of codes and scales); " << model.parameter_count() << " parameters stay dense\n";
        if (!offload && options.resolved_device != Device::cpu) model.to(options.resolved_device);
    }
    if (offload) {
        // The streamed layers' copies parked and without device buffers as they are made (the trainer applies
        // the same precision and policy again, which changes nothing).
        if (config.shape.precision == Precision::bf16) model.set_compute_dtype(DType::bf16);
        model.set_checkpointing(config.shape.checkpointing);
        optim::mark_streamed_layers(model, config.shape, world_size > 1);
        model.set_master_device(Device::cpu, options.resolved_device);
    }
    if (!lora) load_init();
    // Rank 0's weights everywhere: every rank starts from the same replica whatever each one loaded. At ZeRO-3 before
    // the trainer takes each rank's shard of them (and releases the segments' storage); otherwise after a resume.
    const auto broadcast_replica = [&] {
        for (const Tensor& parameter : model.parameters()) communicator->broadcast(parameter, 0);
        model.refresh_working_copies();
    };
    const bool sharded_parameters = world_size > 1 && config.shape.zero_stage == 3;
    if (sharded_parameters) broadcast_replica();
    optim::Trainer trainer(model, config, world_size > 1 ? communicator.get() : nullptr);
    if (!options.resume.empty()) {
        optim::ResumedRun resumed;
        // The resume phase's peaks, as --plan predicts them: the state streams from the file into the trainer's tensors.
        reset_peak(model.device());
        reset_peak(Device::cpu);
        try {
            resumed = optim::resume_training_state(options.resume, trainer, loader.get());
        } catch (const EngineError& error) {
            throw train_gpt::flag_error("--resume", error);
        }
        const std::string resume_peaks = train_gpt::phase_peaks(model.device());
        // The model state's tier is part of the run: a state saved with the optimizer on the host resumes so.
        const nlohmann::json saved = nlohmann::json::parse(resumed.config_json, nullptr, false);
        const bool saved_offload = saved.is_object() && saved.value("offload_optimizer", false);
        if (saved_offload != config.shape.offload_optimizer)
            throw train_gpt::UsageError("--resume", resumed.path + " was saved with --offload-optimizer " +
                                                        (saved_offload ? "cpu" : "none") + "; this run has " +
                                                        (config.shape.offload_optimizer ? "cpu" : "none"));
        // So is the ZeRO stage: the stages sum the ranks' and the micro-batches' gradients in other orders, so a
        // state resumed at another one would no longer continue its run bit for bit (the file itself is the same).
        if (saved.is_object() && saved.contains("zero_stage") && saved["zero_stage"] != config.shape.zero_stage)
            throw train_gpt::UsageError("--resume", resumed.path + " was saved at --zero-stage " + saved["zero_stage"].dump() +
                                                        "; this run has " + std::to_string(config.shape.zero_stage) +
                                                        ": resume at the stage the state was saved at");
        // The data cursor counts windows, and what a window is (documents, packs, the batches a token budget cuts)
        // depends on these: a state saved with others would read other data, silently.
        const nlohmann::json now = nlohmann::json::parse(run_config_json(options));
        for (const auto& [key, flag] : {std::pair{"data_layout", "--data-layout"}, std::pair{"eot_token", "--eot-token"},
                                        std::pair{"max_tokens_per_micro_batch", "--max-tokens-per-micro-batch"}})
            if (saved.is_object() && saved.contains(key) && saved[key] != now[key])
                throw train_gpt::UsageError("--resume", resumed.path + " was saved with " + flag + " " + saved[key].dump() +
                                                            " and this run has " + now[key].dump() +
                                                            "; its data cursor counts that run's windows: resume with the same");
        if (lead) std::cout << "resumed from " << resumed.path << " at step " << resumed.step << " (" << resume_peaks << ")\n";
        if (lead && !resumed.refused_reason.empty()) std::cerr << "train_gpt: warning: " << resumed.refused_reason << "\n";
        // Allowed (e.g. more --max-steps), but the run then no longer equals one uninterrupted run.
        if (lead && resumed.config_json != run_config_json(options))
            std::cerr << "train_gpt: warning: flags differ from the saved run: saved " << resumed.config_json
                      << ", now " << run_config_json(options) << "\n";
    }

    if (world_size > 1 && !sharded_parameters) broadcast_replica();

    {
        // Every output proven writable, with room for what it will hold, before the first step: a run must not train
        // and then fail to write its result (docs/RELIABILITY.md, "Outputs"). Rank 0 writes them and checks; every
        // rank learns the answer, so none waits in a collective for a rank that stopped.
        std::optional<train_gpt::UsageError> refused;
        if (lead) {
            const train_gpt::OutputSizes sizes = train_gpt::output_sizes(options, model);
            try {
                train_gpt::check_outputs(options, sizes);
            } catch (const train_gpt::UsageError& error) {
                refused = error;
            }
        }
        const bool failed = world_size > 1 ? communicator->all_reduce_count(refused ? 1 : 0) > 0 : refused.has_value();
        if (refused) throw *refused;
        if (failed) throw train_gpt::UsageError("--out", "rank 0's outputs failed their check before the first step");
        if (lead) std::cout << setup.str();
    }
    std::ofstream log;
    if (lead && !options.log.empty()) {
        // A resumed run continues its log rather than erasing the steps before the saved state.
        log.open(options.log, options.resume.empty() ? std::ios::trunc : std::ios::app);
        if (!log) throw train_gpt::UsageError("--log", "cannot write '" + options.log + "'");
    }
    const StepShape& shape = config.shape;
    // With a token budget, at most: every micro-batch the worst the budget allows.
    const auto [batch_rows, batch_length] =
        nn::largest_batch_shape(shape.per_device_train_batch_size, options.seq_len, options.max_tokens_per_micro_batch,
                                options.data_layout == nn::DataLayout::packed);
    const int64_t tokens_per_step =
        int64_t{batch_rows} * shape.gradient_accumulation_steps * world_size * batch_length;
    const int padded_vocabulary = options.model.padded_vocab_size();
    const std::string padding = padded_vocabulary == options.model.vocab_size()
                                    ? ""
                                    : "; wte stored as " + std::to_string(padded_vocabulary) + " rows, the padding zero";
    if (lead) {
        std::cout << "model: " << options.model.to_string() << " (" << model.parameter_count() << " parameters"
                  << padding << ")" << (options.init.empty() ? "" : ", from " + options.init) << "\n"
                  << "data: " << (options.data.empty() ? "built-in corpus" : options.data) << ", "
                  << loader->window_count()
                  << (options.data_layout == nn::DataLayout::padded             ? " documents padded to "
                      : options.data_layout == nn::DataLayout::packed_documents ? " rows of documents packed into "
                                                                                : " windows of ")
                  << options.seq_len << " tokens"
                  << (options.data_layout != nn::DataLayout::packed
                          ? " (end of text " + std::to_string(options.eot_token) + ")"
                          : std::string())
                  << (options.max_tokens_per_micro_batch > 0
                          ? ", at most " + std::to_string(options.max_tokens_per_micro_batch) +
                                " tokens a micro-batch (rows cut to the longest)"
                          : std::string())
                  << "\n";
        if (validation)
            std::cout << "validation: " << options.eval_data << ", the first " << validation->batch_count() << " of its "
                      << validation->batch_count_available() << " batches of " << shape.per_device_train_batch_size
                      << " x " << world_size << " ranks, every " << options.eval_every << " steps\n";
        std::cout
                  << "device: " << device_name(options.resolved_device)
                  << (shape.precision == Precision::bf16 ? " (bf16 mixed precision)"
                      : options.resolved_device == Device::cpu ? "" : options.tf32.value_or(true) ? " (tf32)" : " (fp32)")
                  << " | batch " << shape.per_device_train_batch_size << " x " << shape.gradient_accumulation_steps
                  << " micro-batches x " << world_size << " ranks (" << distributed::backend_name(communicator->backend())
                  << ") = " << (options.max_tokens_per_micro_batch > 0 ? "at most " : "") << tokens_per_step
                  << " token positions per step | "
                  << nn::data_layout_name(options.data_layout) << " data | loss normalization "
                  << config.loss_normalization.name() << " | optimizer " << optimizer_kind_name(config.optimizer)
                  << " | checkpointing " << shape.checkpointing.to_string() << "\n";
    }

    const nn::BatchSource source = loader->source();
    double first_loss = 0.0, last_loss = 0.0, seconds = 0.0;
    int64_t first_logged_step = 0; // the first step that updated the weights in this run
    const int64_t first_step = trainer.step() + 1; // 1, or the step after a resumed state
    // The profiler runs only inside train_step, so evaluation, replica checks and saves stay out of its table.
    const bool profile = options.profile || profiling::enabled();
    const int64_t profile_warmup =
        config.max_steps - first_step + 1 > profile_warmup_steps ? profile_warmup_steps : 0;
    double profiled_step_seconds = 0.0;
    int64_t profiled_steps = 0;
    profiling::set_enabled(false);
    profiling::reset();
    // --memory-timeline: one step's every allocation and free, written after it (rank 0).
    const int64_t timeline_step =
        options.memory_timeline.empty() ? 0 : (options.memory_timeline_step > 0 ? options.memory_timeline_step : first_step);
    if (timeline_step > 0 && timeline_step < first_step)
        throw train_gpt::UsageError("--memory-timeline-step", "step " + std::to_string(timeline_step) +
                                                                  " is before this resumed run's first step " +
                                                                  std::to_string(first_step));
    steps_started = true;
    for (int64_t step = first_step; step <= config.max_steps; ++step) {
        profiling::set_enabled(profile);
        if (step == timeline_step) start_memory_timeline();
        struct StopRecording { // also when the step throws
            bool on;
            ~StopRecording() { if (on && memory_timeline_recording()) stop_memory_timeline(); }
        } stop_recording{step == timeline_step};
        // Where the step begins, so that an out-of-memory failure can write the state as it was (train_gpt_outputs.h).
        const nn::LoaderCursor cursor_before = loader->cursor();
        const RngState rng_before = rng_state();
        note_last_kernel(nullptr); // an out-of-memory record names this step's ops only
        clear_out_of_memory();
        std::optional<optim::StepResult> result;
        try {
            result = trainer.train_step(source);
        } catch (const OutOfMemoryError&) {
            profiling::set_enabled(false);
            train_gpt::report_out_of_memory(options, trainer, *loader, cursor_before, rng_before, step,
                                            run_config_json(options), world_size);
            throw;
        }
        profiling::set_enabled(false);
        if (step == timeline_step) {
            const MemoryTimeline timeline = stop_memory_timeline();
            if (lead && result) train_gpt::write_memory_timeline(options, timeline, *result, step);
        }
        if (!result) break; // cannot happen with a cycling loader; kept for finite sources
        if (profile) {
            if (step - first_step < profile_warmup) {
                profiling::reset(); // a warm-up step: its kernels fill caches, so they stay out of the table
            } else {
                profiled_step_seconds += result->seconds;
                ++profiled_steps;
            }
        }
        if (!result->skipped) {
            if (first_logged_step == 0) first_loss = result->loss, first_logged_step = step;
            last_loss = result->loss;
        }
        seconds += result->seconds;
        nlohmann::json record = step_record(*result);
        if (options.check_replicas) {
            const uint64_t hash = replica_hash(trainer);
            if (world_size > 1) check_replicas(*communicator, hash, step);
            char text[17];
            std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
            record["replica_hash"] = text;
            record["replicas_identical"] = true; // check_replicas threw otherwise
        }
        const bool evaluating = validation && (step % options.eval_every == 0 || step == config.max_steps);
        std::optional<optim::Trainer::Evaluation> evaluation;
        if (evaluating) {
            // The evaluation phase's joint peak on the device's account, as --plan predicts it.
            reset_peak(model.device());
            evaluation = validation->evaluate(trainer);
            record["eval_peak_total_bytes"] = memory_stats(model.device()).peak_bytes;
            record["eval_loss"] = evaluation->loss;
            record["eval_batches"] = validation->batch_count();
            record["eval_num_items"] = evaluation->num_items_in_batch;
        }
        if (profile && step == config.max_steps)
            record["profile"] = profile_record(profiling::snapshot(), profiled_step_seconds, profiled_steps, profile_warmup);
        // An evaluated step is always logged, so that its eval_loss reaches the log.
        if (lead && (step % config.logging_steps == 0 || step == 1 || step == config.max_steps || evaluating)) {
            std::cout << step_line(*result, config.max_steps) << std::endl;
            if (evaluation) {
                char line[128];
                std::snprintf(line, sizeof line, "eval step %lld: loss %.4f (%lld batches, %lld tokens)",
                              static_cast<long long>(step), evaluation->loss,
                              static_cast<long long>(validation->batch_count()),
                              static_cast<long long>(evaluation->num_items_in_batch));
                std::cout << line << std::endl;
            }
            if (log) log << record.dump() << "\n" << std::flush;
        }
        if (!options.out.empty() &&
            ((options.save_every > 0 && step % options.save_every == 0) || step == config.max_steps)) {
            // Every rank takes part (ZeRO-1 gathers each tensor in turn); rank 0 streams them to the file. What the save
            // added to the device's account at its high-water mark is printed (0: the state streams to the file), and
            // the phase's peaks, as --plan predicts them.
            const Device device = model.device();
            const size_t before_save = memory_stats(device).current_bytes;
            reset_peak(device);
            reset_peak(Device::cpu);
            const std::string path =
                optim::save_training_state(options.out, trainer, loader.get(), run_config_json(options), lead);
            const size_t save_rise = memory_stats(device).peak_bytes - before_save;
            if (lead)
                std::cout << "saved training state " << path << " (device memory +" << save_rise << " B; "
                          << train_gpt::phase_peaks(device) << ")" << std::endl;
        }
    }
    // ZeRO-3: --save and --merge read the whole model on rank 0, gathered on every rank (a collective) once the
    // steps are over, as DeepSpeed gathers a stage-3 model to save it.
    std::optional<optim::WholeParameters> whole;
    if (trainer.releases_parameters() && (!options.save.empty() || !options.merge.empty() || !options.save_adapter.empty()))
        whole.emplace(trainer);
    if (!lead) return 0;
    if (first_logged_step == 0) {
        std::printf("no step was trained (already at step %lld of %lld)\n", static_cast<long long>(trainer.step()),
                    static_cast<long long>(config.max_steps));
    } else {
        std::printf("first loss %.4f -> last loss %.4f (%+.1f%%) in %lld steps, %.1f s of training\n", first_loss,
                    last_loss, 100.0 * (last_loss - first_loss) / first_loss, static_cast<long long>(trainer.step()),
                    seconds);
    }
    if (trainer.skipped_steps() > 0)
        std::printf("skipped %lld steps with non-finite loss or gradients\n", static_cast<long long>(trainer.skipped_steps()));
    if (profile && profiled_steps > 0) {
        std::printf("\nop profile (CPU kernels) over %lld steps%s:\n", static_cast<long long>(profiled_steps),
                    profile_warmup > 0 ? ", the first 2 left out (they warm caches and buffers)"
                                       : " (all of them: too few to leave out the 2 warm-up steps)");
        if (options.resolved_device != Device::cpu)
            std::printf("(the run is on %s: only host-side kernels are timed; device kernels are in the unprofiled "
                        "remainder)\n", device_name(options.resolved_device));
        std::cout << profiling::format_report(profiling::snapshot(), profiled_step_seconds) << std::flush;
    }
    if (!options.save.empty()) {
        if (train_gpt::saves_directory(options.save)) {
            const bool from_directory = !options.init.empty() && nn::is_pretrained_directory(options.init);
            nn::save_pretrained(model, options.save, options.save_dtype, from_directory ? options.init : "");
        } else {
            nn::save_safetensors(model, options.save, options.save_dtype);
        }
        std::cout << "saved " << options.save << "\n";
    }
    if (lead && !options.save_adapter.empty()) {
        nn::save_adapter(model, *lora_config, options.save_adapter, options.init);
        std::cout << "saved adapter " << options.save_adapter << "\n";
    }
    if (lead && !options.merge.empty()) {
        // Merged on a plain f32 copy on the host: the trained model may have working copies or masters apart.
        // With a 4-bit base the dense base is --init's weights (or the seed's), which the merged copy loads itself.
        const std::unique_ptr<nn::CausalLM> merged = options.model.build(options.trainer.seed, Device::cpu, DType::f32);
        if (options.load_in_4bit && !options.init.empty()) load_initial_weights(*merged, options.init);
        nn::apply_lora(*merged, *lora_config);
        std::map<std::string, Tensor> trained;
        for (const auto& [name, parameter] : model.named_parameters()) trained.emplace(name, parameter);
        // Frozen weights trained under bf16 are stored in bf16 (docs/TRAINING.md): they widen exactly.
        for (const auto& [name, copy] : merged->named_parameters())
            if (const auto found = trained.find(name); found != trained.end())
                convert_into(copy, found->second.to(Device::cpu));
        nn::merge_lora(*merged);
        const bool from_directory = !options.init.empty() && nn::is_pretrained_directory(options.init);
        nn::save_pretrained(*merged, options.merge, options.save_dtype, from_directory ? options.init : "");
        std::cout << "saved merged model " << options.merge << "\n";
    }
    return 0;
}

} // namespace

// A rank that failed on its own: the others may wait in a collective for it, so the whole job ends now
// (distributed::abort_job) rather than whenever the launcher notices this rank's exit. A usage error is every rank's
// alike and exits with its one line.
int end_other_ranks(int exit_code) {
    std::cerr.flush();
    if (distributed::launch_environment().world_size > 1) distributed::abort_job(exit_code);
    return exit_code;
}

int main(int argc, char** argv) {
    try {
        const Options options = train_gpt::parse_options(std::vector<std::string>(argv + 1, argv + argc));
        if (options.help) {
            std::cout << train_gpt::usage();
            return 0;
        }
        return run(options);
    } catch (const train_gpt::UsageError& error) {
        std::cerr << "train_gpt: error: " << error.what() << "\n";
        return 2;
    } catch (const OutOfMemoryError& error) {
        if (!steps_started && (memory_limit(Device::cpu) != SIZE_MAX || memory_limit(Device::cuda) != SIZE_MAX)) {
            std::cerr << "train_gpt: error: --memory-limit: below what the model, its gradients and its optimizer "
                         "state hold before the first step: "
                      << error.what() << "\n";
            return 2;
        }
        std::cerr << "train_gpt: error: " << (steps_started ? "" : "before the first step, building the model: ")
                  << error.what() << "\n";
        return end_other_ranks(1);
    } catch (const std::exception& error) {
        std::cerr << "train_gpt: error: " << error.what() << "\n";
        return end_other_ranks(1);
    }
}
