// The memory planner: for a model, a memory budget and a global batch, the fastest training plan (micro-batch
// and accumulation, checkpoint policy, offload, precision, ZeRO stage) whose predicted peak fits, chosen
// before anything is allocated. docs/MEMORY.md ("Planning for a budget").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "nn/model_config.h"
#include "planner/cost_model.h"
#include "planner/memory_model.h"
#include "planner/step_shape.h"

namespace engine::planner {

struct PlannerOptions {
    Device device = Device::cpu; // whose memory the budget is (on the CPU it holds the offloaded inputs too)
    int seq_len = 0;             // 0: the model's max_seq_len
    OptimizerKind optimizer = OptimizerKind::adamw;
    // The precisions searched, in this order. bf16 changes what is learned, so it is opt-in: train_gpt's
    // --precision auto asks for both.
    std::vector<Precision> precisions = {Precision::fp32};
    int ranks = 1;               // data-parallel ranks; the global batch is split over them
    bool packed_documents = false; // micro-batches carry positions (predict_memory's packed_documents)
    bool allow_zero = true;      // with ranks > 1, also search ZeRO stage 1
    bool allow_offload = true;
    // Off a CUDA device, also search optimizer offload (the model state in host memory), which costs the
    // update's host time and the PCIe copies: chosen only when nothing faster fits.
    bool allow_offload_optimizer = true;
    // Host memory the plan may use (the offloaded model state, pinned inputs): plans whose host peak exceeds
    // it are refused. SIZE_MAX: no limit.
    size_t host_budget = SIZE_MAX;
    // Of that, what may be pinned (page-locked: the offloaded segment inputs, the parked working copies, the staged
    // ids, the save's block); a host may lock less than it has. Off the CPU backend only. SIZE_MAX: no limit.
    size_t pinned_budget = SIZE_MAX;
    std::optional<Ceilings> ceilings; // default: ceilings_for(device, dtype)
    // The streaming LM head's chunk (StepShape::loss_chunk_tokens) every plan takes, at most its micro-batch's
    // B·T (0: the whole logits). Unset (auto): per plan one chunk of all B·T tokens, halved while the plan does
    // not fit, down to minimum_loss_chunk (the largest chunk that fits is the fastest: each chunk more re-reads
    // the head's gradient).
    std::optional<int> loss_chunk_tokens;
    // The MLP tile (StepShape::mlp_tile_tokens) every plan takes, at most its micro-batch's B·T (0: the whole
    // MLP). Unset (auto): untiled while the plan fits; a plan that does not fit with its smallest loss chunk tries
    // tiles of all B·T tokens, halved while it does not fit, down to minimum_mlp_tile (tiling costs one more MLP
    // forward at any tile, and each tile more some launches: the largest that fits).
    std::optional<int> mlp_tile_tokens;
    // What trains (predict_memory's FineTuning): a LoRA or QLoRA run is planned with its own step (the replay,
    // planner/adapter_step.h), on the device with the optimizer (its adapters' state is small), without ZeRO-1.
    // The cost model still counts a full fine-tune's FLOPs: it ranks the plans, it does not time a LoRA step.
    FineTuning tuning;
    // train_gpt's --eval-data: the K batches of each evaluation. > 0: each plan's evaluation phase
    // (predict_evaluation_memory at its micro-batch) is a peak it must fit too, so that a run planned for a budget
    // stays within it between steps as well; plans that stream the parameters from the host, beside which the phase
    // is not modelled, are not searched then. The save and the resume hold less than the step (predict_state_phases).
    int eval_batches = 0;
    // train_gpt's --out or --resume: the save's and the resume's host peaks (predict_state_phases: the host's tiers
    // and the pinned block they stream through) are within the host budget too. Their device peaks never pass the
    // step's.
    bool state_phases = false;
    // The batch-invariant mode's chunk (optim::TrainerConfig::batch_invariant_chunk; 0: off): only micro-batches it
    // divides, ZeRO stage 0 or 1, the model state on the device; each plan's memory and time those of its chunks
    // (predict_memory's batch_invariant_chunk; the fold's pass over the gradients per chunk priced at memory bandwidth).
    int batch_invariant_chunk = 0;
};

struct Plan {
    StepShape shape; // what the trainer runs: TrainerConfig::shape = plan.shape
    int ranks = 1;
    MemoryPrediction memory;
    StepCost cost;
    size_t peak_bytes = 0; // memory.peak_on(device), or the evaluation's when larger: what the budget is compared with
    size_t evaluation_peak_bytes = 0; // with PlannerOptions::eval_batches: the evaluation phase's peak on the device
    size_t host_peak_bytes = 0; // memory.host_peak_bytes with optimizer offload: what the host budget is compared with
    size_t pinned_peak_bytes = 0; // of it pinned (memory.pinned_peak_bytes, the save's block): the pinned budget's
    bool fits(size_t budget, size_t host_budget, size_t pinned_budget = SIZE_MAX) const {
        return peak_bytes <= budget && host_peak_bytes <= host_budget && pinned_peak_bytes <= pinned_budget;
    }

    std::string flags() const { return shape.flags(); }          // train_gpt's flags for this plan
    std::string summary() const { return shape.summary(ranks); } // "b 4 x 2, checkpoint every 1, fp32"
};

// Every plan searched, and which one won.
struct PlanSearch {
    size_t budget = 0;
    Device device = Device::cpu; // whose budget
    size_t host_budget = SIZE_MAX;
    size_t pinned_budget = SIZE_MAX;
    int global_batch = 0;
    std::vector<Plan> plans;       // all candidates, least predicted time first (ties: smaller peak)
    std::optional<size_t> chosen;  // index into plans of the fastest plan that fits
    size_t smallest = 0;           // index of the plan with the smallest peak

    // Why nothing fits, when nothing does: the budget, the smallest peak any plan reaches and that plan's flags
    // (what NoPlanFits and train_gpt's --max-memory error say, without searching again).
    std::string no_fit_message() const;
};

// Thrown by plan_for_budget when no plan fits: the message names the smallest peak and that plan's flags.
class NoPlanFits : public EngineError {
public:
    NoPlanFits(const std::string& message, Plan smallest_plan) : EngineError(message), smallest(std::move(smallest_plan)) {}
    Plan smallest;
};

// Enumerates micro-batch b with accumulation N (b * N * ranks = global_batch), every checkpoint policy
// (off; every_n_layers 1..L x segment_size 1..L), offload on/off, precision (fp32, and
// bf16 when allowed), ZeRO stage (0, and 1 with several ranks) and, on CUDA, optimizer offload on/off,
// predicting each one's peak and time. A plan fits when its device peak is within the budget and its host
// peak within the host budget.
PlanSearch search_plans(const nn::ModelConfig& config, size_t budget, int global_batch, const PlannerOptions& options);

// The fastest plan whose predicted peak is <= budget. Throws NoPlanFits when there is none.
Plan plan_for_budget(const nn::ModelConfig& config, size_t budget, int global_batch, const PlannerOptions& options = {});

// The chosen plan and the best alternatives: memory by category, predicted time, and why each lost.
std::string plan_table(const PlanSearch& search, const nn::ModelConfig& config, int alternatives = 6);

// "3.5MiB", "16GiB", "1048576": bytes, or a number (decimals allowed) with KiB, MiB or GiB. Throws EngineError.
size_t parse_memory_size(const std::string& text);
// What `--max-memory auto` budgets: the free memory of the device (on the CPU: MemAvailable from
// /proc/meminfo) minus a margin of 10% of it, for the allocator's rounding, other processes and the
// runtime's own buffers. Throws when the figure cannot be read.
struct AutoBudget {
    size_t free_bytes = 0;
    size_t margin_bytes = 0;
    size_t budget() const { return free_bytes - margin_bytes; }
};
AutoBudget automatic_budget(Device device);

std::string format_bytes(size_t bytes); // "1.50 GiB", "12.34 MiB", "512 B"

} // namespace engine::planner
