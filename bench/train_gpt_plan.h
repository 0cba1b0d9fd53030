// train_gpt's planning before anything is built: --max-memory (the planner's choice written into the flags), --plan
// (the report, and exit) and the host budget an offloaded model state must fit.
#pragma once

#include <optional>

#include "planner/memory_model.h"

#include "train_gpt_options.h"

namespace train_gpt {

// --max-memory: the planner's choice over `ranks` data-parallel ranks written into the trainer's flags. Prints the
// chosen plan and the alternatives (rank 0); no plan fits: a UsageError naming the smallest peak.
Options apply_memory_plan(const Options& options, int ranks);
// --offload-optimizer cpu without the planner: the model state must fit the host budget (--max-host-memory, or the
// available memory minus 10%), or a UsageError naming both.
void check_host_budget(const Options& options);
// --plan: prints the predicted memory per category for these flags (with LoRA, the model state beside a full
// fine-tune's first) on rank 0; returns the exit code.
int print_plan(const Options& options);
// What of the model trains, for the memory model: nothing (a full fine-tune) without --lora-r or --init-adapter.
std::optional<engine::planner::FineTuning> fine_tuning(const Options& options);
// The step's predicted joint peak on the run's device (planner::predict_memory, what --plan prints), for the
// memory timeline's line and the out-of-memory verdict; nothing for a LoRA run the step replay does not follow
// (planner/adapter_step.h: GPT-2, a tiled MLP, the optimizer off the device, ZeRO-1).
std::optional<size_t> predicted_step_peak(const Options& options);
std::optional<engine::planner::MemoryPrediction> predicted_step_memory(const Options& options);
// The data-parallel ranks the plan is for: --world-size, else the launcher's.
int planned_world_size(const Options& options);

} // namespace train_gpt
