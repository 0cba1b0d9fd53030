// train_gpt's planning (bench/train_gpt_plan.h): --max-memory's search written into the flags, --plan's report, and
// the host budget of an offloaded model state, each before anything is allocated.
#include "train_gpt_plan.h"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "nn/io/peft.h"
#include "planner/memory_model.h"
#include "planner/planner.h"

namespace train_gpt {

using namespace engine;

namespace {

// --max-host-memory, or the host's available memory minus 10%.
size_t host_budget(const Options& options) {
    if (options.max_host_memory) return *options.max_host_memory;
    try {
        return planner::automatic_budget(Device::cpu).budget();
    } catch (const EngineError& error) {
        throw flag_error("--max-host-memory", error);
    }
}

} // namespace

// --offload-optimizer cpu without the planner: the model state must fit the host before anything is built. And with
// --max-pinned-memory, what the run pins (its steps, and its saves and resume) must fit that.
void check_host_budget(const Options& options) {
    const StepShape& shape = options.trainer.shape;
    if (options.max_pinned_memory) {
        if (const std::optional<planner::MemoryPrediction> step = predicted_step_memory(options)) {
            size_t pinned = step->pinned_peak_bytes;
            if (!options.out.empty() || !options.resume.empty())
                pinned = std::max(pinned, planner::predict_state_phases(*step, options.resolved_device,
                                                                        shape.offload_optimizer)
                                              .pinned_peak);
            if (pinned > *options.max_pinned_memory)
                throw UsageError("--max-pinned-memory",
                                 "this run pins " + planner::format_bytes(pinned) + " (" + std::to_string(pinned) +
                                     " B) of host memory; the budget is " +
                                     planner::format_bytes(*options.max_pinned_memory) + " (" +
                                     std::to_string(*options.max_pinned_memory) + " B)");
        }
    }
    if (!shape.offload_optimizer) return;
    // LoRA: the host holds the adapters' masters and moments, a small part of the model (docs/MEMORY.md, "LoRA and
    // QLoRA"); the model state's report (--plan) counts them.
    if (options.lora || !options.init_adapter.empty()) return;
    // A token budget: the worst micro-batch it allows.
    const auto [rows, length] =
        nn::largest_batch_shape(shape.per_device_train_batch_size, options.seq_len, options.max_tokens_per_micro_batch,
                                                        options.data_layout == nn::DataLayout::packed);
    const planner::MemoryPrediction predicted = planner::predict_memory(
        options.model, rows, length, shape.checkpointing, precision_dtype(shape.precision), options.trainer.optimizer,
        engine::ZeroSharding::of(shape.zero_stage, planned_world_size(options)), shape.gradient_accumulation_steps, true,
        shape.offload_gradients,
        shape.offload_parameters, shape.loss_chunk_tokens, shape.mlp_tile_tokens,
        options.data_layout == nn::DataLayout::packed_documents);
    const size_t budget = host_budget(options);
    // ZeRO-3: the rank whose part holds the most of the layers' masters, whichever rank this is.
    const size_t needed = predicted.host_peak_bytes + predicted.host_largest_rank_extra_bytes;
    if (needed > budget)
        throw UsageError(
            "--max-host-memory", "the offloaded model state needs " + planner::format_bytes(needed) +
                                     " (" + std::to_string(needed) + " B) of host memory; the budget is " +
                                     planner::format_bytes(budget) + " (" + std::to_string(budget) + " B)");
}

// --max-memory: the planner's choice written into the trainer's flags, before anything is allocated. Prints
// the chosen plan and the alternatives (rank 0); no plan fits: a UsageError naming the smallest peak.
Options apply_memory_plan(const Options& options, int ranks) {
    Options planned = options;
    optim::TrainerConfig& config = planned.trainer;
    const distributed::LaunchEnvironment launch = distributed::launch_environment();
    planner::PlannerOptions search;
    search.device = options.resolved_device;
    search.seq_len = options.seq_len;
    search.optimizer = config.optimizer;
    search.precisions = options.precision_auto ? std::vector<Precision>{Precision::fp32, Precision::bf16}
                                               : std::vector<Precision>{config.shape.precision};
    search.ranks = ranks;
    search.host_budget = options.resolved_device == Device::cpu ? SIZE_MAX : host_budget(options);
    search.pinned_budget = options.max_pinned_memory.value_or(SIZE_MAX); // refused on the CPU by the flags' checks
    search.loss_chunk_tokens = options.loss_chunk_tokens;
    search.mlp_tile_tokens = options.mlp_tile_tokens;
    search.packed_documents = options.data_layout == nn::DataLayout::packed_documents;
    search.tuning = fine_tuning(options).value_or(planner::FineTuning{});
    search.batch_invariant_chunk = config.batch_invariant_chunk; // plans whose micro-batch the chunk divides
    // The evaluation between steps must fit the budget too (its K batches of the plan's micro-batch).
    if (!options.eval_data.empty()) search.eval_batches = static_cast<int>(options.eval_steps.value_or(default_eval_steps));
    // So must the save's and the resume's host memory (the pinned block a device's tensors stream through).
    search.state_phases = !options.out.empty() || !options.resume.empty();
    const int global_batch =
        options.global_batch_size > 0
            ? options.global_batch_size
            : config.shape.per_device_train_batch_size * config.shape.gradient_accumulation_steps * ranks;
    if (global_batch % ranks != 0)
        throw UsageError("--global-batch-size", std::to_string(global_batch) + " does not split over " +
                                                               std::to_string(ranks) + " ranks");
    if (const int chunk = config.batch_invariant_chunk; chunk > 0 && (global_batch / ranks) % chunk != 0)
        throw UsageError("--batch-invariant-chunk", std::to_string(chunk) + " does not divide each rank's " +
                                                        std::to_string(global_batch / ranks) + " sequences of the global batch " +
                                                        std::to_string(global_batch));
    size_t budget = options.max_memory.value_or(0);
    std::string budget_source = "--max-memory";
    if (options.max_memory_auto) {
        planner::AutoBudget automatic;
        try {
            automatic = planner::automatic_budget(options.resolved_device);
        } catch (const EngineError& error) {
            throw flag_error("--max-memory", error);
        }
        budget = automatic.budget();
        budget_source = "--max-memory auto: " + planner::format_bytes(automatic.free_bytes) + " free minus a 10% margin of " +
                        planner::format_bytes(automatic.margin_bytes);
    }
    const planner::PlanSearch result = planner::search_plans(options.model, budget, global_batch, search);
    if (!result.chosen) {
        // The flag of the budget that binds: the device's, else the host's, else the pinned memory's.
        const auto any = [&](auto&& fits) { return std::any_of(result.plans.begin(), result.plans.end(), fits); };
        const bool device_fits = any([&](const planner::Plan& plan) { return plan.peak_bytes <= result.budget; });
        const bool host_fits = any([&](const planner::Plan& plan) {
            return plan.peak_bytes <= result.budget && plan.host_peak_bytes <= result.host_budget;
        });
        throw UsageError(!device_fits ? "--max-memory" : !host_fits ? "--max-host-memory" : "--max-pinned-memory",
                         result.no_fit_message());
    }
    config.shape = result.plans[*result.chosen].shape;
    if (launch.rank == 0)
        std::cout << "budget " << planner::format_bytes(budget) << " (" << budget_source << ")"
                  << (options.resolved_device == Device::cpu ? ""
                                                             : ", host budget " + planner::format_bytes(search.host_budget))
                  << "\n"
                  << planner::plan_table(result, options.model);
    return planned;
}

std::optional<planner::FineTuning> fine_tuning(const Options& options) {
    if (!options.lora && options.init_adapter.empty()) return std::nullopt;
    planner::FineTuning tuning;
    tuning.nf4 = options.load_in_4bit;
    try {
        tuning.lora = options.lora ? *options.lora : nn::read_adapter_config(options.init_adapter);
    } catch (const EngineError& error) {
        throw flag_error("--init-adapter", error);
    }
    return tuning;
}

namespace {

// A phase's predicted peaks, for the run's: on the device's account (the one account on the CPU) and on the host's.
struct PhasePeak {
    std::string name;
    size_t device = 0;
    size_t host = 0;
};

// --plan's last line: the run's peaks, each phase's largest, and which phase reaches them.
std::string run_peaks_line(const std::vector<PhasePeak>& phases, Device device) {
    if (phases.size() < 2) return "";
    const auto largest = [&](auto member) {
        return *std::max_element(phases.begin(), phases.end(),
                                 [&](const PhasePeak& a, const PhasePeak& b) { return a.*member < b.*member; });
    };
    const PhasePeak on_device = largest(&PhasePeak::device), on_host = largest(&PhasePeak::host);
    std::string line = "the run's peak: " + planner::mebibytes(on_device.device) + " (" + std::to_string(on_device.device) +
                       " B), the " + on_device.name + "'s";
    if (device != Device::cpu)
        line += "; on the host " + planner::mebibytes(on_host.host) + " (" + std::to_string(on_host.host) + " B), the " +
                on_host.name + "'s";
    return line + "\n";
}

// --plan with --eval-data: the evaluation phase's peak (planner::predict_evaluation_memory) and the run's, the larger
// of it and the step's; or why it is not predicted.
std::string evaluation_report(const Options& options, int rows, int length, engine::ZeroSharding shards,
                              std::vector<PhasePeak>& peaks) {
    const StepShape& shape = options.trainer.shape;
    const int64_t batches = options.eval_steps.value_or(default_eval_steps);
    const planner::FineTuning tuning = fine_tuning(options).value_or(planner::FineTuning{});
    std::ostringstream text;
    text << "evaluation (--eval-data, " << batches << " batches of " << rows << " x " << length << "; "
         << (options.eval_steps ? "--eval-steps" : "at most, fewer if the file holds fewer") << "): ";
    try {
        const planner::PhasePrediction evaluation = planner::predict_evaluation_memory(
            options.model, rows, length, shape.checkpointing, precision_dtype(shape.precision), options.trainer.optimizer,
            shards, shape.offload_optimizer, shape.offload_gradients, shape.offload_parameters, static_cast<int>(batches),
            shape.loss_chunk_tokens, shape.mlp_tile_tokens, options.data_layout == nn::DataLayout::packed_documents,
            tuning, options.trainer.batch_invariant_chunk);
        const size_t peak = evaluation.peak_on(options.resolved_device);
        peaks.push_back({"evaluation", peak, 0});
        text << "peak " << planner::mebibytes(peak) << " (" << peak << " B) at " << evaluation.moment;
        if (const std::optional<size_t> step = predicted_step_peak(options))
            text << "; the run's peak " << planner::mebibytes(std::max(peak, *step)) << " ("
                 << (peak > *step ? "the evaluation's" : "the step's") << ")";
        text << "\n";
    } catch (const EngineError& error) {
        text << "not predicted for these flags (" << error.what() << ")\n";
    }
    return text.str();
}

// --plan with --init, --out or --resume: the load's, the save's and the resume's peaks (planner::predict_load_phase,
// predict_state_phases), which stream the weights and the state; or why they are not predicted.
std::string state_phases_report(const Options& options, std::vector<PhasePeak>& phase_peaks) {
    std::ostringstream text;
    const Device device = options.resolved_device;
    const auto peaks = [&](size_t device_peak, size_t host_peak) {
        if (device == Device::cpu) return "peak " + planner::mebibytes(device_peak) + " (" + std::to_string(device_peak) + " B)";
        return "device peak " + planner::mebibytes(device_peak) + " (" + std::to_string(device_peak) + " B), host peak " +
               planner::mebibytes(host_peak) + " (" + std::to_string(host_peak) + " B)";
    };
    if (!options.init.empty()) {
        // train_gpt builds the model on the host first with the optimizer there or a 4-bit base.
        const planner::LoadPhasePrediction load = planner::predict_load_phase(
            options.model, device, options.trainer.shape.offload_optimizer || options.load_in_4bit);
        phase_peaks.push_back({"load", load.device_peak, load.host_peak});
        text << "load (--init, streamed a chunk at a time): " << peaks(load.device_peak, load.host_peak)
             << ", the model as built\n";
    }
    if (options.out.empty() && options.resume.empty()) return text.str();
    const std::optional<planner::MemoryPrediction> step = predicted_step_memory(options);
    if (!step) return text.str() + "save and resume: not predicted for these flags (the step is not)\n";
    const planner::StatePhasesPrediction phases =
        planner::predict_state_phases(*step, device, options.trainer.shape.offload_optimizer);
    const std::string block =
        phases.staging > 0 ? " with one pinned block of " + std::to_string(phases.staging) + " B" : "";
    if (!options.out.empty()) phase_peaks.push_back({"save", phases.device_save_peak, phases.host_save_peak});
    if (!options.resume.empty()) phase_peaks.push_back({"resume", phases.device_resume_peak, phases.host_resume_peak});
    if (!options.out.empty())
        text << "save (--out, streamed tensor by tensor): " << peaks(phases.device_save_peak, phases.host_save_peak)
             << block << ", the model state alone\n";
    if (!options.resume.empty())
        text << "resume (--resume, streamed tensor by tensor): "
             << peaks(phases.device_resume_peak, phases.host_resume_peak) << block << ", the model state alone\n";
    return text.str();
}

} // namespace

int planned_world_size(const Options& options) {
    return options.world_size.value_or(distributed::launch_environment().world_size);
}

std::optional<size_t> predicted_step_peak(const Options& options) {
    const std::optional<planner::MemoryPrediction> predicted = predicted_step_memory(options);
    if (!predicted) return std::nullopt;
    return predicted->peak_on(options.resolved_device);
}

std::optional<planner::MemoryPrediction> predicted_step_memory(const Options& options) {
    const StepShape& shape = options.trainer.shape;
    const auto [rows, length] = nn::largest_batch_shape(shape.per_device_train_batch_size, options.seq_len,
                                                        options.max_tokens_per_micro_batch,
                                                        options.data_layout == nn::DataLayout::packed);
    const std::optional<planner::FineTuning> tuning = fine_tuning(options);
    try {
        return planner::predict_memory(
            options.model, rows, length, shape.checkpointing, precision_dtype(shape.precision),
            options.trainer.optimizer, engine::ZeroSharding::of(shape.zero_stage, planned_world_size(options)),
            shape.gradient_accumulation_steps, shape.offload_optimizer, shape.offload_gradients,
            shape.offload_parameters, shape.loss_chunk_tokens, shape.mlp_tile_tokens,
            options.data_layout == nn::DataLayout::packed_documents, tuning.value_or(planner::FineTuning{}),
            options.trainer.batch_invariant_chunk);
    } catch (const EngineError&) {
        if (tuning) return std::nullopt; // a LoRA run the step replay does not follow yet (--plan says which)
        throw;
    }
}

// --plan: the predicted memory per category for these flags (with LoRA, the model state), printed by rank 0.
int print_plan(const Options& options) {
    // Per rank: ZeRO-1 over the ranks planned for (--world-size N, or mpirun -np N train_gpt --plan --zero-stage 1),
    // printed once.
    const distributed::LaunchEnvironment launch = distributed::launch_environment();
    const StepShape& shape = options.trainer.shape;
    const engine::ZeroSharding shards = engine::ZeroSharding::of(shape.zero_stage, planned_world_size(options));
    const std::optional<planner::FineTuning> tuning = fine_tuning(options);
    if (tuning) {
        // The model state beside a full fine-tune's, then the step (the replay's refusal, if it does not follow
        // these flags yet).
        std::string report;
        try {
            report = planner::model_state_report(options.model, precision_dtype(shape.precision), options.trainer.optimizer,
                                                 shards.ranks, *tuning);
        } catch (const EngineError& error) {
            throw flag_error(options.lora ? "--lora-target-modules" : "--init-adapter", error);
        }
        if (launch.rank == 0) std::cout << report;
    }
    // A token budget per micro-batch: the plan is the worst micro-batch's, the most positions it allows.
    const auto [rows, length] =
        nn::largest_batch_shape(shape.per_device_train_batch_size, options.seq_len, options.max_tokens_per_micro_batch,
                                                        options.data_layout == nn::DataLayout::packed);
    if (launch.rank == 0 && options.max_tokens_per_micro_batch > 0)
        std::cout << "token budget " << options.max_tokens_per_micro_batch
                  << " per micro-batch: planned for its worst, " << rows << " x " << length << " tokens\n";
    std::string report;
    try {
        report = planner::plan_report(options.model, rows, length, shape.checkpointing, precision_dtype(shape.precision),
                                      options.trainer.optimizer, shards, shape.gradient_accumulation_steps,
                                      shape.offload_optimizer, shape.offload_gradients, shape.offload_parameters,
                                      shape.loss_chunk_tokens, shape.mlp_tile_tokens,
                                      options.data_layout == nn::DataLayout::packed_documents,
                                      tuning.value_or(planner::FineTuning{}), options.trainer.batch_invariant_chunk);
    } catch (const EngineError& error) {
        if (!tuning) throw;
        report = std::string("the step's activations and workspace: not predicted for these flags (") + error.what() +
                 ")\n";
    }
    std::vector<PhasePeak> peaks;
    if (const std::optional<planner::MemoryPrediction> step = predicted_step_memory(options))
        peaks.push_back({"step", step->peak_on(options.resolved_device),
                         options.resolved_device == Device::cpu ? 0 : step->host_peak_bytes});
    if (shards.parameters) {
        // ZeRO-3 shards the model as the trainer starts: every rank builds it whole first, with its gradient buffers
        // (and under bf16 its working copies as the trainer makes them), which the step's figures leave out.
        // With the optimizer on the host it is built there, and placed a module's working copies at a time.
        const bool on_host = options.trainer.shape.offload_optimizer;
        const planner::LoadPhasePrediction built =
            planner::predict_load_phase(options.model, options.resolved_device, on_host);
        peaks.push_back({"build", built.device_peak, built.host_peak}); // a lower bound, as the line says
        const size_t bound = on_host ? built.host_peak : built.device_peak;
        report += std::string("build (ZeRO-3: every rank builds the model whole") + (on_host ? " in host memory" : "") +
                  " before the trainer shards it): at least " + planner::mebibytes(bound) + " (" + std::to_string(bound) +
                  " B)" + (on_host && options.resolved_device != Device::cpu ? " on the host" : "") +
                  ", the parameters and gradients as built\n";
    }
    if (!options.eval_data.empty()) report += evaluation_report(options, rows, length, shards, peaks);
    if (!options.out.empty() || !options.resume.empty() || !options.init.empty())
        report += state_phases_report(options, peaks);
    if (peaks.size() > 1 && peaks.front().name == "step") report += run_peaks_line(peaks, options.resolved_device);
    if (launch.rank == 0) std::cout << report;
    return 0;
}

} // namespace train_gpt
