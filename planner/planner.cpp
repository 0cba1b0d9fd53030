// The planner's search: every plan the memory model and the cost model can price, the fastest that fits, and
// the table that says why the others lost.
#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "engine/cuda/runtime.h"

namespace engine::planner {
namespace {

using checkpoint::CheckpointPolicy;

// Off, and every (every_n_layers, segment_size) pair with 1 <= each <= L that builds segments no earlier pair
// built: runs of segment_size blocks, the 1st and every n-th run after it checkpointed (plan_segments). With R =
// ceil(L / segment_size) runs, every n >= R checkpoints the first run only, as n = R does, so n stops at R: about
// L·ln L pairs instead of L² (80 layers: 438 instead of 6400), the same plans, each once (the search's stable sort
// kept the first of equal ones before). With offload, each enabled one again with its saved inputs in pinned
// host memory.
std::vector<CheckpointPolicy> candidate_policies(int layers, bool allow_offload) {
    std::vector<CheckpointPolicy> policies = {CheckpointPolicy{}};
    for (bool offload : {false, true}) {
        if (offload && !allow_offload) continue;
        for (int size = 1; size <= layers; ++size) {
            const int runs = (layers + size - 1) / size;
            for (int every = 1; every <= runs; ++every) policies.push_back(CheckpointPolicy{true, every, size, offload, false});
        }
    }
    return policies;
}

std::string seconds_text(double seconds) {
    std::ostringstream text;
    text << std::fixed << std::setprecision(seconds < 1.0 ? 2 : 3) << (seconds < 1.0 ? seconds * 1e3 : seconds)
         << (seconds < 1.0 ? " ms" : " s");
    return text.str();
}

// Why `plan` lost to `chosen`: over a budget, or which of its costs is larger.
std::string why_lost(const Plan& plan, const Plan& chosen, size_t budget, size_t host_budget, size_t pinned_budget) {
    if (plan.peak_bytes > budget)
        return "peak " + format_bytes(plan.peak_bytes) + " exceeds the budget by " + format_bytes(plan.peak_bytes - budget);
    if (plan.host_peak_bytes > host_budget)
        return "host peak " + format_bytes(plan.host_peak_bytes) + " exceeds the host budget by " +
               format_bytes(plan.host_peak_bytes - host_budget);
    if (plan.pinned_peak_bytes > pinned_budget)
        return "pinned peak " + format_bytes(plan.pinned_peak_bytes) + " exceeds the pinned budget by " +
               format_bytes(plan.pinned_peak_bytes - pinned_budget);
    std::ostringstream text;
    text << "+" << std::fixed << std::setprecision(1) << 100.0 * (plan.cost.seconds / chosen.cost.seconds - 1.0)
         << "% time:";
    std::vector<std::string> reasons;
    if (plan.memory.recomputed_blocks > chosen.memory.recomputed_blocks)
        reasons.push_back("recomputes " + std::to_string(plan.memory.recomputed_blocks) + " blocks per micro-batch");
    if (plan.cost.transfer_seconds > chosen.cost.transfer_seconds) reasons.push_back("offload copies");
    const StepShape& shape = plan.shape;
    if (shape.gradient_accumulation_steps > chosen.shape.gradient_accumulation_steps)
        reasons.push_back(std::to_string(shape.gradient_accumulation_steps) + " micro-batches (more ops)");
    if (plan.cost.gemm_seconds > chosen.cost.gemm_seconds && shape.precision != chosen.shape.precision)
        reasons.push_back("slower GEMMs");
    if (shape.zero_stage != chosen.shape.zero_stage) reasons.push_back("ZeRO stage " + std::to_string(shape.zero_stage));
    if (plan.cost.host_seconds > chosen.cost.host_seconds) reasons.push_back("the optimizer on the host");
    if (plan.cost.communication_seconds > chosen.cost.communication_seconds) reasons.push_back("more collectives");
    if (reasons.empty()) reasons.push_back("larger predicted time");
    for (size_t index = 0; index < reasons.size(); ++index) text << (index ? ", " : " ") << reasons[index];
    return text.str();
}

} // namespace

std::string format_bytes(size_t bytes) {
    std::ostringstream text;
    const double value = static_cast<double>(bytes);
    if (bytes >= (size_t(1) << 30)) text << std::fixed << std::setprecision(2) << value / (1 << 30) << " GiB";
    else if (bytes >= (size_t(1) << 20)) text << std::fixed << std::setprecision(2) << value / (1 << 20) << " MiB";
    else if (bytes >= 1024) text << std::fixed << std::setprecision(2) << value / 1024 << " KiB";
    else text << bytes << " B";
    return text.str();
}

std::string PlanSearch::no_fit_message() const {
    ENGINE_CHECK(!plans.empty(), "planner: no plan was searched");
    const Plan& least = plans[smallest];
    std::ostringstream message;
    const Plan* pinned_least = nullptr; // of the plans within the device and host budgets, the least pinned
    for (const Plan& plan : plans)
        if (plan.peak_bytes <= budget && plan.host_peak_bytes <= host_budget &&
            (pinned_least == nullptr || plan.pinned_peak_bytes < pinned_least->pinned_peak_bytes))
            pinned_least = &plan;
    if (pinned_least != nullptr) {
        message << "no plan fits in " << format_bytes(pinned_budget) << " of pinned host memory: the plans within the "
                << "device and host budgets pin at least " << format_bytes(pinned_least->pinned_peak_bytes) << " ("
                << pinned_least->pinned_peak_bytes << " B), with " << pinned_least->flags();
        return message.str();
    }
    if (least.peak_bytes <= budget) {
        // Some plan fits the device; every such plan is over the host budget: name the least host peak.
        const Plan* lightest = nullptr;
        for (const Plan& plan : plans)
            if (plan.peak_bytes <= budget && (lightest == nullptr || plan.host_peak_bytes < lightest->host_peak_bytes))
                lightest = &plan;
        message << "no plan fits in " << format_bytes(budget) << " of device memory and " << format_bytes(host_budget)
                << " of host memory: the plans within the device budget need at least "
                << format_bytes(lightest->host_peak_bytes) << " (" << lightest->host_peak_bytes << " B) of host memory, with "
                << lightest->flags();
        return message.str();
    }
    message << "no plan fits in " << format_bytes(budget) << " (" << budget << " B): the smallest peak any plan reaches is "
            << format_bytes(least.peak_bytes) << " (" << least.peak_bytes << " B), with " << least.flags();
    return message.str();
}

PlanSearch search_plans(const nn::ModelConfig& config, size_t budget, int global_batch, const PlannerOptions& options) {
    config.validate();
    ENGINE_CHECK(options.ranks >= 1, "planner: ranks " << options.ranks << " must be >= 1");
    ENGINE_CHECK(global_batch >= 1 && global_batch % options.ranks == 0,
                 "planner: the global batch " << global_batch << " must be a positive multiple of the "
                                              << options.ranks << " ranks");
    const int seq_len = options.seq_len > 0 ? options.seq_len : config.max_seq_len();
    ENGINE_CHECK(seq_len <= config.max_seq_len(),
                 "planner: seq_len " << seq_len << " exceeds the model maximum " << config.max_seq_len());
    ENGINE_CHECK(!options.precisions.empty(), "planner: no precision to search");
    std::vector<bool> optimizer_tiers = {false};
    const bool lora = options.tuning.lora.has_value();
    ENGINE_CHECK(options.eval_batches >= 0, "planner: eval_batches " << options.eval_batches << " must be >= 0");
    const int invariant_chunk = options.batch_invariant_chunk; // the mode keeps the state on the device, stages 0 and 1
    if (options.device != Device::cpu && options.allow_offload_optimizer && !lora && invariant_chunk == 0)
        optimizer_tiers.push_back(true);
    std::vector<int> zero_stages = {0};
    if (options.ranks > 1 && options.allow_zero && !lora) zero_stages.push_back(1);
    if (options.ranks > 1 && options.allow_zero && !lora && invariant_chunk == 0) zero_stages.insert(zero_stages.end(), {2, 3});
    const int per_rank = global_batch / options.ranks;
    ENGINE_CHECK(invariant_chunk >= 0 && (invariant_chunk == 0 || (per_rank % invariant_chunk == 0 && !lora)),
                 "planner: the batch-invariant chunk of " << invariant_chunk << " sequences must divide each rank's "
                     << per_rank << " sequences of the global batch " << global_batch
                     << (lora ? ", and LoRA is not planned in the mode yet" : ""));

    PlanSearch search;
    search.budget = budget;
    search.host_budget = options.host_budget;
    search.pinned_budget = options.pinned_budget;
    search.device = options.device;
    search.global_batch = global_batch;
    const std::vector<CheckpointPolicy> policies = candidate_policies(config.layers(), options.allow_offload);
    // Every candidate first, in the order the table lists equal plans; then each priced on its own (the memory walk
    // and the cost model read nothing shared), in parallel, into its slot: the same plans in the same order at any
    // thread count.
    struct Candidate {
        Precision precision;
        int zero_stage;
        int micro_batch;
        const CheckpointPolicy* policy;
        bool offload_optimizer;
        GradientOffload gradients;
        bool offload_parameters;
    };
    std::vector<Candidate> candidates;
    // Each precision's ceilings, once, before the threads (the CPU's are measured on first use).
    std::vector<Ceilings> ceilings_of;
    for (Precision precision : options.precisions)
        ceilings_of.push_back(options.ceilings ? *options.ceilings : ceilings_for(options.device, precision_dtype(precision)));
    for (Precision precision : options.precisions)
        for (int zero_stage : zero_stages)
            for (int micro_batch = 1; micro_batch <= per_rank; ++micro_batch) {
                if (per_rank % micro_batch != 0) continue;
                if (invariant_chunk > 0 && micro_batch % invariant_chunk != 0) continue; // the mode's chunk divides it
                for (const CheckpointPolicy& policy : policies)
                    for (bool offload_optimizer : optimizer_tiers)
                        for (GradientOffload gradients : {GradientOffload::window, GradientOffload::stream}) {
                            // Streaming needs the optimizer on the host and checkpointed segments.
                            if (gradients == GradientOffload::stream && (!offload_optimizer || !policy.enabled)) continue;
                            // ZeRO-2 reduces each checkpointed segment's gradients as its backward ends: on the device,
                            // or streamed to the host.
                            if (zero_stage >= 2 && (!policy.enabled || (offload_optimizer && gradients != GradientOffload::stream)))
                                continue;
                            for (bool offload_parameters : {false, true}) {
                                if (offload_parameters && (!offload_optimizer || !policy.enabled)) continue;
                                // ZeRO-3 brings the segments' weights for each use itself.
                                if (offload_parameters && zero_stage == 3) continue;
                                // The evaluation beside streamed parameters is not modelled: such plans wait.
                                if (offload_parameters && options.eval_batches > 0) continue;
                                candidates.push_back({precision, zero_stage, micro_batch, &policy, offload_optimizer,
                                                      gradients, offload_parameters});
                            }
                        }
            }
    const auto price = [&](const Candidate& candidate) {
        const Precision precision = candidate.precision;
        const DType dtype = precision_dtype(precision);
        const size_t which = static_cast<size_t>(
            std::find(options.precisions.begin(), options.precisions.end(), precision) - options.precisions.begin());
        const Ceilings& ceilings = ceilings_of[which];
        const int zero_stage = candidate.zero_stage, micro_batch = candidate.micro_batch;
        const ZeroSharding shards = ZeroSharding::of(zero_stage, options.ranks);
        const CheckpointPolicy& policy = *candidate.policy;
        const bool offload_optimizer = candidate.offload_optimizer, offload_parameters = candidate.offload_parameters;
        const GradientOffload gradients = candidate.gradients;
        const auto plan_with = [&](int loss_chunk, int mlp_tile) {
            Plan plan;
            plan.shape = StepShape{micro_batch, per_rank / micro_batch, policy, precision,
                                   zero_stage, offload_optimizer, gradients, offload_parameters,
                                   loss_chunk, mlp_tile};
            plan.ranks = options.ranks;
            const int steps = plan.shape.gradient_accumulation_steps;
            plan.memory =
                predict_memory(config, micro_batch, seq_len, policy, dtype, options.optimizer,
                               shards, steps, offload_optimizer, gradients, offload_parameters,
                               loss_chunk, mlp_tile, options.packed_documents, options.tuning, invariant_chunk);
            // ZeRO-3 with the model state on the host: each segment's working copies are rounded on the host from the
            // masters gathered there and cross up, for its forward and its recompute.
            const bool gathered_on_host = zero_stage == 3 && offload_optimizer;
            // The mode runs chunks: their GEMMs and launches, and per chunk the fold over every gradient (read 4 + 8,
            // write 4 + 8 bytes a parameter).
            const int forward_batch = invariant_chunk > 0 ? invariant_chunk : micro_batch;
            const int forwards = invariant_chunk > 0 ? steps * (micro_batch / invariant_chunk) : steps;
            plan.cost = predict_cost(config, forward_batch, forwards, seq_len, policy, dtype,
                                     options.optimizer, shards.ranks, ceilings, offload_optimizer,
                                     gradients, offload_parameters, loss_chunk, mlp_tile, gathered_on_host);
            if (invariant_chunk > 0) {
                const double fold = static_cast<double>(forwards) * 24.0 *
                                    static_cast<double>(parameter_count(config, config.vocab_size())) /
                                    ceilings.memory_bytes_per_second;
                plan.cost.memory_seconds += fold;
                plan.cost.seconds += fold;
            }
            // ZeRO-3 under bf16 gathers the copies its owners rounded; f32 masters in fp32 or on the host.
            const int gathered_element = dtype == DType::bf16 && !offload_optimizer ? 2 : 4;
            add_communication(plan.cost, config, steps, policy, zero_stage, options.ranks, ceilings, gathered_element,
                              sharded_table_elements(config, shards, offload_optimizer),
                              config.is_llama() && config.llama().tie_word_embeddings ? 1 : 2, invariant_chunk > 0);
            // The rank that holds the most (ZeRO-3's parts differ in how much of the sharded layers they hold).
            plan.peak_bytes = plan.memory.peak_on(options.device) + plan.memory.largest_rank_extra_bytes;
            plan.host_peak_bytes = plan.memory.host_peak_bytes + plan.memory.host_largest_rank_extra_bytes;
            // Pinned memory is the device's page-locked host memory; the CPU backend pins nothing.
            plan.pinned_peak_bytes = options.device == Device::cpu ? 0 : plan.memory.pinned_peak_bytes;
            if (options.state_phases) {
                const StatePhasesPrediction phases = predict_state_phases(plan.memory, options.device, offload_optimizer);
                plan.host_peak_bytes = std::max({plan.host_peak_bytes, phases.host_save_peak, phases.host_resume_peak});
                plan.pinned_peak_bytes = std::max(plan.pinned_peak_bytes, phases.pinned_peak);
            }
            // The evaluation between steps, only where the step fits (a plan that does not fit is out either way).
            if (options.eval_batches > 0 && plan.peak_bytes <= budget) {
                plan.evaluation_peak_bytes =
                    predict_evaluation_memory(config, micro_batch, seq_len, policy, dtype, options.optimizer, shards,
                                              offload_optimizer, gradients, false, options.eval_batches, loss_chunk,
                                              mlp_tile,
                                              options.packed_documents, options.tuning, invariant_chunk)
                        .peak_on(options.device) +
                    plan.memory.largest_rank_extra_bytes; // ZeRO-3: the rank holding the most, as for the step
                plan.peak_bytes = std::max(plan.peak_bytes, plan.evaluation_peak_bytes);
            }
            return plan;
        };
        const int rows = (invariant_chunk > 0 ? invariant_chunk : micro_batch) * seq_len; // a forward's tokens
        const auto fits = [&](const Plan& plan) { return plan.fits(budget, options.host_budget, options.pinned_budget); };
        // Of two plans the one that fits, else the smaller peak: when nothing fits, the search
        // still names the smallest peak any chunk and tile reach (which need not be the
        // smallest ones: a single tile, say, never holds its result beside its first tile).
        const auto better = [&](Plan first, Plan second) {
            if (fits(first) != fits(second)) return fits(first) ? first : second;
            return second.peak_bytes < first.peak_bytes && !fits(first) ? second : first;
        };
        const auto halve_chunk = [&](Plan plan) {
            Plan best = plan;
            while (!fits(plan) && plan.shape.loss_chunk_tokens / 2 >= minimum_loss_chunk) {
                plan = plan_with(plan.shape.loss_chunk_tokens / 2, plan.shape.mlp_tile_tokens);
                best = better(best, plan);
            }
            return best;
        };
        // auto chunk: one chunk of every token, halved while the plan does not fit (down to
        // minimum_loss_chunk): the same FLOPs at any chunk, and each chunk more re-reads the
        // head's gradient, so the largest that fits. auto tile: none while the plan fits at
        // some chunk; else one tile of every token, halved the same way, each with the largest
        // chunk that fits beside it (any tile costs one more MLP forward, each tile more a few
        // launches).
        const int tile = options.mlp_tile_tokens ? std::min(*options.mlp_tile_tokens, rows) : 0;
        const auto with_tile = [&](int mlp_tile) {
            return options.loss_chunk_tokens
                       ? plan_with(std::min(*options.loss_chunk_tokens, rows), mlp_tile)
                       : halve_chunk(plan_with(rows, mlp_tile));
        };
        Plan plan = with_tile(tile);
        for (int tried = rows; !options.mlp_tile_tokens && !fits(plan) && tried >= minimum_mlp_tile;
             tried /= 2)
            plan = better(plan, with_tile(tried));
        return plan;
    };
    search.plans.resize(candidates.size());
    std::vector<std::exception_ptr> failures(candidates.size());
#pragma omp parallel for schedule(dynamic)
    for (size_t index = 0; index < candidates.size(); ++index) {
        try {
            search.plans[index] = price(candidates[index]);
        } catch (...) {
            failures[index] = std::current_exception(); // an exception must not leave the parallel region
        }
    }
    for (const std::exception_ptr& failure : failures)
        if (failure) std::rethrow_exception(failure); // the first candidate's, as a serial search would throw
    // Least time first; equal times (policies that build the same segments) keep the smaller peak first, then
    // the order above (the simpler flags).
    std::stable_sort(search.plans.begin(), search.plans.end(), [](const Plan& left, const Plan& right) {
        if (left.cost.seconds != right.cost.seconds) return left.cost.seconds < right.cost.seconds;
        return left.peak_bytes < right.peak_bytes;
    });
    for (size_t index = 0; index < search.plans.size(); ++index) {
        if (!search.chosen && search.plans[index].fits(budget, options.host_budget, options.pinned_budget))
            search.chosen = index;
        if (search.plans[index].peak_bytes < search.plans[search.smallest].peak_bytes) search.smallest = index;
    }
    return search;
}

Plan plan_for_budget(const nn::ModelConfig& config, size_t budget, int global_batch, const PlannerOptions& options) {
    const PlanSearch search = search_plans(config, budget, global_batch, options);
    if (!search.chosen) throw NoPlanFits(search.no_fit_message(), search.plans[search.smallest]);
    return search.plans[*search.chosen];
}

std::string plan_table(const PlanSearch& search, const nn::ModelConfig& config, int alternatives) {
    std::ostringstream text;
    text << "planner: " << search.plans.size() << " plans for " << config.architecture() << ", a global batch of " << search.global_batch
         << " under a budget of " << format_bytes(search.budget) << " (" << search.budget << " B)\n";
    if (!search.chosen) return text.str() + "no plan fits\n";
    const Plan& chosen = search.plans[*search.chosen];
    const bool evaluation = chosen.evaluation_peak_bytes > chosen.memory.peak_on(search.device);
    text << "chosen: " << chosen.summary() << "\n  flags: " << chosen.flags() << "\n  predicted peak "
         << format_bytes(chosen.peak_bytes) << " (" << chosen.peak_bytes << " B) at "
         << (evaluation ? "the evaluation (the step's " + format_bytes(chosen.memory.peak_on(search.device)) + ")"
                        : chosen.memory.peak_moment)
         << "; step " << chosen.cost.to_string() << "\n";
    // The fastest plans that did not fit, then the next fastest that did: what the budget cost, and what
    // the chosen plan beat.
    // Plans whose policies build the same segments price the same: each summary once.
    std::vector<size_t> shown;
    std::set<std::string> summaries = {chosen.summary()};
    auto show = [&](size_t index) {
        if (summaries.insert(search.plans[index].summary()).second) shown.push_back(index);
    };
    for (size_t index = 0; index < *search.chosen && static_cast<int>(shown.size()) < alternatives / 2; ++index)
        show(index);
    for (size_t index = *search.chosen + 1; index < search.plans.size() && static_cast<int>(shown.size()) < alternatives;
         ++index)
        if (search.plans[index].fits(search.budget, search.host_budget, search.pinned_budget)) show(index);
    size_t width = 44; // the plan column: as wide as the longest summary shown
    for (size_t index : shown) width = std::max(width, search.plans[index].summary().size() + 1);
    width = std::max(width, chosen.summary().size() + 1);
    text << "  " << std::left << std::setw(static_cast<int>(width)) << "plan" << std::right;
    for (int category = 0; category < memory_category_count; ++category)
        text << std::setw(11) << std::string(memory_category_name(static_cast<MemoryCategory>(category))).substr(0, 10);
    text << std::setw(11) << "peak" << std::setw(11) << "time" << "  why it lost\n";
    auto row = [&](const Plan& plan, const std::string& verdict) {
        text << "  " << std::left << std::setw(static_cast<int>(width)) << plan.summary() << std::right;
        for (int category = 0; category < memory_category_count; ++category)
            text << std::setw(11) << format_bytes(plan.memory.of(static_cast<MemoryCategory>(category)));
        text << std::setw(11) << format_bytes(plan.peak_bytes) << std::setw(11) << seconds_text(plan.cost.seconds) << "  "
             << verdict << "\n";
    };
    row(chosen, "chosen");
    for (size_t index : shown) row(search.plans[index], why_lost(search.plans[index], chosen, search.budget, search.host_budget, search.pinned_budget));
    return text.str();
}

size_t parse_memory_size(const std::string& text) {
    size_t position = 0;
    while (position < text.size() && (std::isdigit(static_cast<unsigned char>(text[position])) || text[position] == '.'))
        ++position;
    const std::string number = text.substr(0, position), unit = text.substr(position);
    ENGINE_CHECK(!number.empty() && std::count(number.begin(), number.end(), '.') <= 1 && number != ".",
                 "'" << text << "' is not a size: bytes, or a number with KiB, MiB or GiB (e.g. 3.5MiB, 16GiB)");
    double scale = 0;
    if (unit.empty() || unit == "B") scale = 1;
    else if (unit == "KiB") scale = 1024.0;
    else if (unit == "MiB") scale = 1024.0 * 1024.0;
    else if (unit == "GiB") scale = 1024.0 * 1024.0 * 1024.0;
    else if (unit == "TiB") scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
    ENGINE_CHECK(scale > 0, "'" << text << "': unknown unit '" << unit << "' (KiB, MiB, GiB or TiB; no unit: bytes)");
    ENGINE_CHECK(scale > 1 || number.find('.') == std::string::npos,
                 "'" << text << "': a size in bytes is a whole number (decimals need a unit, e.g. 3.5MiB)");
    const double bytes = std::floor(std::strtod(number.c_str(), nullptr) * scale);
    ENGINE_CHECK(bytes >= 1 && bytes < 1.8e19, "'" << text << "' is not a positive size that fits in 64 bits");
    return static_cast<size_t>(bytes);
}

AutoBudget automatic_budget(Device device) {
    AutoBudget budget;
    if (device == Device::cpu) {
        std::ifstream meminfo("/proc/meminfo");
        std::string key;
        size_t kibibytes = 0;
        std::string unit;
        while (meminfo >> key >> kibibytes >> unit)
            if (key == "MemAvailable:") {
                budget.free_bytes = kibibytes * 1024;
                break;
            }
        ENGINE_CHECK(budget.free_bytes > 0, "--max-memory auto: cannot read MemAvailable from /proc/meminfo");
    } else {
        ENGINE_CHECK(cuda::device_available(), "automatic_budget: no CUDA device (or this build of libengine has no CUDA backend)");
        size_t free = 0, total = 0;
        cuda::memory_info(free, total);
        budget.free_bytes = free;
    }
    budget.margin_bytes = budget.free_bytes / 10;
    return budget;
}

} // namespace engine::planner
