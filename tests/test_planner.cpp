// The planner (planner/planner.h) on the CPU: a grid of budgets from the smallest feasible to unconstrained for
// the tiny and small models, each chosen plan trained for 2 steps: measured peak <= budget and == predicted to
// the byte, no enumerated feasible plan predicted faster, and the losses of the plain plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <omp.h>

#include "optim/trainer.h"
#include "engine/io/state_file.h"
#include "planner/planner.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;

constexpr int global_batch = 8;
constexpr int steps = 2;

struct Trained {
    std::vector<double> seconds; // each step's wall time
    std::vector<double> losses;
    std::vector<size_t> peaks; // each step's peak total above what the process held before the model
};

Trained train(const nn::GPTConfig& config, int micro_batch, int accumulation, const CheckpointPolicy& policy,
              int step_count = steps, bool bf16 = false, int loss_chunk = 0, int mlp_tile = 0) {
    current_tape().clear();
    const size_t before = memory_stats(Device::cpu).current_bytes;
    Trained trained;
    {
        nn::GPT model(config, 11, Device::cpu, DType::f32);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = micro_batch;
        trainer_config.shape.gradient_accumulation_steps = accumulation;
        trainer_config.shape.checkpointing = policy;
        trainer_config.learning_rate = 1e-2;
        trainer_config.max_steps = step_count;
        trainer_config.shape.precision = bf16 ? Precision::bf16 : Precision::fp32;
        trainer_config.shape.loss_chunk_tokens = loss_chunk;
        trainer_config.shape.mlp_tile_tokens = mlp_tile;
        optim::Trainer trainer(model, trainer_config);
        int cursor = 0;
        const nn::BatchSource source = token_stream_batches(config.vocab_size, micro_batch, config.max_seq_len, cursor);
        for (int step = 0; step < step_count; ++step) {
            const optim::StepResult result = *trainer.train_step(source);
            trained.seconds.push_back(result.seconds);
            trained.losses.push_back(result.loss);
            trained.peaks.push_back(result.memory.peak_bytes - before);
        }
    }
    return trained;
}

// The test's own enumeration: every micro-batch dividing the global batch, and every policy spelled out
// field by field (not through the planner's list), priced with the library's two models.
struct Alternative {
    int micro_batch;
    CheckpointPolicy policy;
    size_t peak;
    double seconds;
};
std::vector<Alternative> enumerate(const nn::GPTConfig& config, const planner::Ceilings& ceilings) {
    std::vector<Alternative> alternatives;
    for (int micro_batch = 1; micro_batch <= global_batch; ++micro_batch) {
        if (global_batch % micro_batch != 0) continue;
        const int accumulation = global_batch / micro_batch;
        std::vector<CheckpointPolicy> policies = {CheckpointPolicy{false, 1, 1, false, false}};
        for (int offload = 0; offload < 2; ++offload)
            for (int every = 1; every <= config.n_layer; ++every)
                for (int size = 1; size <= config.n_layer; ++size)
                    policies.push_back(CheckpointPolicy{true, every, size, offload == 1, false});
        // The loss chunk the planner starts every plan at: the whole micro-batch.
        const int chunk = micro_batch * config.max_seq_len;
        for (const CheckpointPolicy& policy : policies) {
            const auto memory = planner::predict_memory(config, micro_batch, config.max_seq_len, policy, DType::f32,
                                                        planner::OptimizerKind::adamw, 1, accumulation, false,
                                                        GradientOffload::window, false, chunk);
            const auto cost = planner::predict_cost(config, micro_batch, accumulation, config.max_seq_len, policy,
                                                    DType::f32, planner::OptimizerKind::adamw, 1, ceilings, false,
                                                    GradientOffload::window, false, chunk);
            alternatives.push_back({micro_batch, policy, memory.unified_peak_bytes, cost.seconds});
        }
    }
    return alternatives;
}

TEST(Planner, GridOfBudgetsFitsMatchesThePredictionAndLearnsTheSame) {
    const planner::Ceilings ceilings = planner::cpu_ceilings();
    planner::PlannerOptions options;
    options.ceilings = ceilings;
    for (const char* name : {"tiny", "small"}) {
        const nn::GPTConfig config = nn::GPTConfig::named(name);
        const std::vector<Alternative> alternatives = enumerate(config, ceilings);
        const planner::PlanSearch everything = planner::search_plans(config, SIZE_MAX, global_batch, options);
        const size_t smallest = everything.plans[everything.smallest].peak_bytes;
        const size_t fastest = everything.plans.front().peak_bytes; // unconstrained: the fastest plan's peak
        ASSERT_LT(smallest, fastest) << name;
        // 12 budgets: the smallest feasible, 10 between, and unconstrained.
        std::vector<size_t> budgets;
        for (int index = 0; index <= 10; ++index)
            budgets.push_back(static_cast<size_t>(std::llround(
                static_cast<double>(smallest) * std::pow(static_cast<double>(fastest) / smallest, index / 10.0))));
        budgets.push_back(SIZE_MAX);

        const Trained plain = train(config, global_batch, 1, CheckpointPolicy{});
        std::map<std::string, Trained> runs; // by flags: budgets that choose the same plan train it once
        for (size_t budget : budgets) {
            const planner::Plan plan = planner::plan_for_budget(config, budget, global_batch, options);
            const std::string context = std::string(name) + ", budget " + std::to_string(budget) + ": " + plan.flags();
            if (!runs.contains(plan.flags()))
                runs[plan.flags()] = train(config, plan.shape.per_device_train_batch_size, plan.shape.gradient_accumulation_steps,
                                          plan.shape.checkpointing, steps, false, plan.shape.loss_chunk_tokens,
                                          plan.shape.mlp_tile_tokens);
            const Trained& trained = runs[plan.flags()];
            std::printf("  %-6s budget %9zu B -> %-44s predicted %8zu B, measured %8zu / %8zu B, %.3f ms\n", name,
                        budget == SIZE_MAX ? 0 : budget, plan.summary().c_str(), plan.peak_bytes, trained.peaks[0],
                        trained.peaks[1], plan.cost.seconds * 1e3);
            for (int step = 0; step < steps; ++step) {
                EXPECT_LE(trained.peaks[step], budget) << context;
                EXPECT_EQ(trained.peaks[step], plan.peak_bytes) << context << ", step " << step + 1;
                if (plan.shape.per_device_train_batch_size == global_batch)
                    EXPECT_EQ(trained.losses[step], plain.losses[step]) << context << ": only checkpointing differs";
                else
                    EXPECT_NEAR(trained.losses[step], plain.losses[step], 1e-5 * plain.losses[step])
                        << context << ": accumulation over " << plan.shape.gradient_accumulation_steps << " micro-batches";
            }
            for (const Alternative& alternative : alternatives)
                if (alternative.peak <= budget)
                    EXPECT_LE(plan.cost.seconds, alternative.seconds)
                        << context << " vs b " << alternative.micro_batch << ", " << alternative.policy.to_string();
        }
        EXPECT_GE(runs.size(), 3u) << name << ": the grid should exercise several plans";
    }
}

// Offload on the CPU moves the saved inputs into pinned_host, which the same account holds: the peak the
// planner compares with the budget (unified) is the one measured, and it trains bitwise as the plain plan.
TEST(Planner, OffloadPlanIsExactOnTheCpuAccountAndLearnsBitwiseTheSame) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const CheckpointPolicy offload{true, 1, 1, true, false};
    const Trained plain = train(config, 4, 2, CheckpointPolicy{});
    const Trained offloaded = train(config, 4, 2, offload);
    const auto predicted = planner::predict_memory(config, 4, config.max_seq_len, offload, DType::f32,
                                                   planner::OptimizerKind::adamw, 1, 2);
    for (int step = 0; step < steps; ++step) {
        EXPECT_EQ(offloaded.losses[step], plain.losses[step]);
        EXPECT_EQ(offloaded.peaks[step], predicted.unified_peak_bytes);
    }
    EXPECT_LT(predicted.peak_bytes, predicted.unified_peak_bytes); // on a device of its own, offload saves
}

// bf16 plans, trained: the joint peak of a mixed-precision step (f32 masters and bf16 copies, bf16
// activations, f32 statistics and gradients) equals the prediction to the byte too, under each policy kind.
TEST(Planner, Bf16PlansAreExactOnTheCpu) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 1, 1, false, false},
                                           CheckpointPolicy{true, 2, 1, true, false}}) {
        const Trained trained = train(config, 4, 2, policy, steps, /*bf16=*/true);
        const auto predicted = planner::predict_memory(config, 4, config.max_seq_len, policy, DType::bf16,
                                                       planner::OptimizerKind::adamw, 1, 2);
        for (int step = 0; step < steps; ++step)
            EXPECT_EQ(trained.peaks[step], predicted.unified_peak_bytes) << policy.to_string() << ", step " << step + 1;
    }
}

// The cost model's predicted step time against the measured one across plans (documentation, docs/PERF.md;
// no threshold). Slow and machine-dependent: runs only with ENGINE_PLANNER_TIMING=1.
TEST(Planner, CostModelErrorAcrossPlans) {
    if (std::getenv("ENGINE_PLANNER_TIMING") == nullptr) GTEST_SKIP() << "set ENGINE_PLANNER_TIMING=1 to time the plans";
    const planner::Ceilings& ceilings = planner::cpu_ceilings();
    std::printf("  ceilings: GEMM %.1f GFLOP/s, attention %.2f GFLOP/s, memory %.1f GB/s, copy %.1f GB/s\n",
                ceilings.gemm_flops_per_second / 1e9, ceilings.attention_flops_per_second / 1e9,
                ceilings.memory_bytes_per_second / 1e9, ceilings.host_link_bytes_per_second / 1e9);
    double sum_error = 0, worst = 0;
    int count = 0;
    for (const char* name : {"tiny", "small"}) {
        const nn::GPTConfig config = nn::GPTConfig::named(name);
        for (int micro_batch : {1, 4, 16}) {
            for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 1, 1, false, false},
                                                   CheckpointPolicy{true, 2, 1, false, false},
                                                   CheckpointPolicy{true, 1, 1, true, false}}) {
                const int accumulation = 16 / micro_batch;
                const auto cost = planner::predict_cost(config, micro_batch, accumulation, config.max_seq_len, policy,
                                                        DType::f32, planner::OptimizerKind::adamw, 1, ceilings);
                const Trained trained = train(config, micro_batch, accumulation, policy, 6);
                std::vector<double> times(trained.seconds.begin() + 1, trained.seconds.end()); // the 1st warms up
                std::sort(times.begin(), times.end());
                const double measured = times[times.size() / 2];
                const double error = cost.seconds / measured - 1.0;
                sum_error += std::abs(error);
                worst = std::max(worst, std::abs(error));
                ++count;
                std::printf("  %-6s b %2d x %2d %-48s predicted %8.2f ms measured %8.2f ms error %+6.1f%%\n", name,
                            micro_batch, accumulation, policy.to_string().c_str(), cost.seconds * 1e3, measured * 1e3,
                            100.0 * error);
            }
        }
    }
    std::printf("  mean |error| %.1f%%, worst %.1f%% over %d plans\n", 100.0 * sum_error / count, 100.0 * worst, count);
}

TEST(Planner, NoPlanFitsNamesTheSmallestPeakAndItsFlags) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    // A budget nothing fits: every plan keeps the smallest peak its loss chunks and MLP tiles reach, as under any
    // budget below that peak.
    const planner::PlanSearch search = planner::search_plans(config, 0, global_batch, {});
    const planner::Plan& smallest = search.plans[search.smallest];
    try {
        planner::plan_for_budget(config, smallest.peak_bytes - 1, global_batch);
        FAIL() << "a budget one byte under the smallest peak must not fit";
    } catch (const planner::NoPlanFits& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find(std::to_string(smallest.peak_bytes) + " B"), std::string::npos) << message;
        EXPECT_NE(message.find(smallest.flags()), std::string::npos) << message;
        EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
    }
    EXPECT_EQ(planner::plan_for_budget(config, smallest.peak_bytes, global_batch).peak_bytes, smallest.peak_bytes);
}

// The search prices its candidates on several threads: one thread and every thread give the same plans, in the same
// order, to the byte and the second, for a full fine-tune over every tier and for a LoRA run.
TEST(Planner, SearchIsTheSameAtAnyThreadCount) {
    const nn::ModelConfig config = nn::ModelConfig::named("llama-tiny");
    planner::PlannerOptions options;
    options.device = Device::cuda; // every tier, optimizer offload included
    options.ceilings = planner::cuda_ceilings(DType::f32);
    options.precisions = {Precision::fp32, Precision::bf16};
    options.ranks = 2;
    planner::PlannerOptions lora = options;
    lora.ranks = 1;
    lora.tuning.lora = nn::LoraConfig{.r = 4, .target_modules = {"all-linear"}};
    for (const planner::PlannerOptions& search : {options, lora}) {
        const int original = omp_get_max_threads();
        omp_set_num_threads(1);
        const planner::PlanSearch serial = planner::search_plans(config, 4 << 20, 8, search);
        omp_set_num_threads(std::max(2, original));
        const planner::PlanSearch parallel = planner::search_plans(config, 4 << 20, 8, search);
        omp_set_num_threads(original);
        ASSERT_EQ(serial.plans.size(), parallel.plans.size());
        ASSERT_GT(serial.plans.size(), 100u);
        for (size_t index = 0; index < serial.plans.size(); ++index) {
            EXPECT_EQ(serial.plans[index].flags(), parallel.plans[index].flags()) << index;
            EXPECT_EQ(serial.plans[index].peak_bytes, parallel.plans[index].peak_bytes) << index;
            EXPECT_EQ(serial.plans[index].cost.seconds, parallel.plans[index].cost.seconds) << index;
        }
        EXPECT_EQ(serial.chosen, parallel.chosen);
        EXPECT_EQ(serial.smallest, parallel.smallest);
    }
}

TEST(Planner, SearchesPrecisionAndZeroOnlyWhereAllowed) {
    const nn::GPTConfig config = nn::GPTConfig::named("gpt2-124M");
    planner::PlannerOptions options;
    options.device = Device::cuda; // CUDA constants: no measurement, and offload saves device memory there
    options.seq_len = 1024;
    const auto fp32 = planner::search_plans(config, SIZE_MAX, 64, options);
    for (const planner::Plan& plan : fp32.plans) EXPECT_TRUE(plan.shape.precision == Precision::fp32 && plan.shape.zero_stage == 0);
    options.precisions = {Precision::fp32, Precision::bf16};
    options.ranks = 8;
    const auto both = planner::search_plans(config, size_t(16) << 30, 64, options);
    const planner::Plan& chosen = both.plans[*both.chosen];
    EXPECT_EQ(chosen.shape.precision, Precision::bf16) << "bf16 is predicted faster on the tensor cores";
    EXPECT_EQ(chosen.shape.per_device_train_batch_size * chosen.shape.gradient_accumulation_steps * 8, 64);
    bool zero_searched = false;
    for (const planner::Plan& plan : both.plans) zero_searched = zero_searched || plan.shape.zero_stage == 1;
    EXPECT_TRUE(zero_searched);
    EXPECT_NE(planner::plan_table(both, config).find("why it lost"), std::string::npos);
}

// A run that saves or resumes (--out, --resume) streams a device's tensors through one pinned block on the host: the
// planner keeps that within the host budget too (here by moving the optimizer to the host, where no block is needed),
// and names the host budget when nothing fits it.
TEST(Planner, KeepsTheSavesPinnedBlockWithinTheHostBudget) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    planner::PlannerOptions options;
    options.device = Device::cuda;
    options.ceilings = planner::cpu_ceilings();
    options.host_budget = io::state_staging_bytes - 1;
    const planner::PlanSearch without = planner::search_plans(config, SIZE_MAX, 4, options);
    ASSERT_TRUE(without.chosen.has_value());
    const planner::Plan& chosen = without.plans[*without.chosen];
    EXPECT_FALSE(chosen.shape.offload_optimizer);
    options.state_phases = true;
    const planner::PlanSearch with = planner::search_plans(config, SIZE_MAX, 4, options);
    for (const planner::Plan& plan : with.plans) {
        const planner::StatePhasesPrediction phases =
            planner::predict_state_phases(plan.memory, Device::cuda, plan.shape.offload_optimizer);
        EXPECT_EQ(plan.host_peak_bytes, std::max({plan.memory.host_peak_bytes, phases.host_save_peak,
                                                  phases.host_resume_peak}))
            << plan.flags();
        // A plan whose saved tensors are on the device streams them through the block; with the optimizer on the
        // host every saved tensor is there already, and none is needed.
        if (!plan.shape.offload_optimizer) EXPECT_GE(plan.host_peak_bytes, io::state_staging_bytes) << plan.flags();
        else EXPECT_EQ(phases.staging, 0u) << plan.flags();
    }
    // Under this host budget only the plans with the optimizer on the host fit now.
    ASSERT_TRUE(with.chosen.has_value());
    EXPECT_TRUE(with.plans[*with.chosen].shape.offload_optimizer) << with.plans[*with.chosen].flags();
    options.allow_offload_optimizer = false;
    const planner::PlanSearch on_device = planner::search_plans(config, SIZE_MAX, 4, options);
    EXPECT_FALSE(on_device.chosen.has_value());
    EXPECT_NE(on_device.no_fit_message().find("host"), std::string::npos) << on_device.no_fit_message();
    options.allow_offload_optimizer = true;
    options.host_budget = chosen.host_peak_bytes + io::state_staging_bytes;
    const planner::PlanSearch room = planner::search_plans(config, SIZE_MAX, 4, options);
    ASSERT_TRUE(room.chosen.has_value());
    EXPECT_EQ(room.plans[*room.chosen].summary(), chosen.summary());
}

// Pinned memory has a budget of its own: a plan pins its parked copies and the larger of its offloaded inputs and one
// staged ids tensor (MemoryPrediction::pinned_peak_bytes), and the planner keeps that within the pinned budget.
TEST(Planner, KeepsWhatItPinsWithinThePinnedBudget) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    planner::PlannerOptions options;
    options.device = Device::cuda;
    options.ceilings = planner::cpu_ceilings();
    const planner::PlanSearch free = planner::search_plans(config, SIZE_MAX, 16, options);
    ASSERT_TRUE(free.chosen.has_value());
    for (const planner::Plan& plan : free.plans) {
        const size_t ids = static_cast<size_t>(plan.shape.per_device_train_batch_size) * config.max_seq_len * 4;
        EXPECT_EQ(plan.pinned_peak_bytes,
                  plan.memory.parked_working_copies + std::max(plan.memory.of(MemoryCategory::pinned_host), ids))
            << plan.flags();
    }
    const size_t unbounded = free.plans[*free.chosen].pinned_peak_bytes;
    options.pinned_budget = unbounded - 1;
    const planner::PlanSearch bounded = planner::search_plans(config, SIZE_MAX, 16, options);
    ASSERT_TRUE(bounded.chosen.has_value());
    const planner::Plan& chosen = bounded.plans[*bounded.chosen];
    EXPECT_LE(chosen.pinned_peak_bytes, options.pinned_budget) << chosen.flags();
    EXPECT_LT(chosen.shape.per_device_train_batch_size, free.plans[*free.chosen].shape.per_device_train_batch_size);
    options.pinned_budget = 100; // below one sequence's ids
    const planner::PlanSearch none = planner::search_plans(config, SIZE_MAX, 16, options);
    EXPECT_FALSE(none.chosen.has_value());
    EXPECT_NE(none.no_fit_message().find("of pinned host memory"), std::string::npos) << none.no_fit_message();
    // The CPU backend pins nothing: no plan there is held to it.
    options.device = Device::cpu;
    const planner::PlanSearch cpu = planner::search_plans(config, SIZE_MAX, 16, options);
    ASSERT_TRUE(cpu.chosen.has_value());
    for (const planner::Plan& plan : cpu.plans) EXPECT_EQ(plan.pinned_peak_bytes, 0u);
}

// Streamed parameters save device memory and move more over the link: each such plan has a twin without them
// that peaks no lower and moves fewer bytes; with no budget the planner streams nothing, and under one below
// every other plan's peak it streams.
TEST(Planner, StreamsParametersOnlyWhenTheBudgetNeedsIt) {
    const nn::GPTConfig config = nn::GPTConfig::named("gpt2-124M");
    planner::PlannerOptions options;
    options.device = Device::cuda;
    options.seq_len = 1024;
    options.precisions = {Precision::bf16};
    const planner::PlanSearch all = planner::search_plans(config, SIZE_MAX, 8, options);
    ASSERT_TRUE(all.chosen.has_value());
    EXPECT_FALSE(all.plans[*all.chosen].shape.offload_parameters);
    size_t least_without = SIZE_MAX;
    int streamed = 0;
    for (const planner::Plan& plan : all.plans) {
        if (!plan.shape.offload_parameters) {
            least_without = std::min(least_without, plan.peak_bytes);
            continue;
        }
        ++streamed;
        EXPECT_TRUE(plan.shape.offload_optimizer && plan.shape.checkpointing.enabled) << plan.flags();
        StepShape twin = plan.shape;
        twin.offload_parameters = false;
        const auto found = std::find_if(all.plans.begin(), all.plans.end(),
                                        [&](const planner::Plan& other) { return other.shape == twin; });
        ASSERT_NE(found, all.plans.end()) << plan.flags();
        // Equal when the largest segment holds every layer there is, at the peak (one checkpointed segment of
        // 8 of the 12 layers, with the other 4 kept).
        EXPECT_LE(plan.peak_bytes, found->peak_bytes) << plan.flags();
        // More crosses the link (every micro-batch's forward and recompute); the prefetched part may hide
        // behind the compute, so the time need not grow (and the once-a-step upload of the copies is gone).
        EXPECT_GT(plan.cost.host_device_bytes, found->cost.host_device_bytes) << plan.flags();
        EXPECT_LE(plan.cost.hidden_transfer_seconds, plan.cost.host_device_bytes / 50e9) << plan.flags();
        EXPECT_EQ(plan.memory.host_peak_bytes - found->memory.host_peak_bytes, plan.memory.parked_working_copies)
            << plan.flags();
    }
    EXPECT_GT(streamed, 0);
    const planner::PlanSearch tight = planner::search_plans(config, least_without - 1, 8, options);
    ASSERT_TRUE(tight.chosen.has_value()) << "streamed parameters reach below every other plan";
    EXPECT_TRUE(tight.plans[*tight.chosen].shape.offload_parameters);
    EXPECT_NE(tight.plans[*tight.chosen].flags().find("--offload-parameters cpu"), std::string::npos);

    StepShape shape;
    shape.offload_parameters = true;
    ASSERT_TRUE(shape.problem().has_value());
    EXPECT_EQ(shape.problem()->field, "offload_parameters");
    shape.offload_optimizer = true;
    ASSERT_TRUE(shape.problem().has_value()) << "without checkpointing";
    EXPECT_EQ(shape.problem()->field, "offload_parameters");
    shape.checkpointing.enabled = true;
    EXPECT_FALSE(shape.problem().has_value());
}

// The streaming head's chunk: with no budget every plan takes one chunk of its B·T tokens (the fastest); under
// a budget below that, the planner halves it until the plan fits; more chunks cost more predicted time (each
// re-reads the head's gradient) and never more memory; a fixed chunk is every plan's, clamped to its B·T.
TEST(Planner, ChunksTheLossHeadOnlyAsFarAsTheBudgetNeeds) {
    const nn::ModelConfig config(nn::GPTConfig::named("gpt2-124M"));
    planner::PlannerOptions options;
    options.device = Device::cuda;
    options.seq_len = 1024;
    options.precisions = {Precision::bf16};
    options.allow_offload_optimizer = false;
    const planner::PlanSearch all = planner::search_plans(config, SIZE_MAX, 8, options);
    for (const planner::Plan& plan : all.plans)
        EXPECT_EQ(plan.shape.loss_chunk_tokens, plan.shape.per_device_train_batch_size * 1024) << plan.flags();
    ASSERT_TRUE(all.chosen.has_value());
    const planner::Plan& fastest = all.plans[*all.chosen];
    EXPECT_EQ(fastest.shape.per_device_train_batch_size, 8);
    // The same plan at every chunk down to 64: peaks fall (or stay), time grows.
    StepShape shape = fastest.shape;
    size_t previous_peak = SIZE_MAX;
    double previous_seconds = 0.0;
    for (int chunk = shape.loss_chunk_tokens; chunk >= planner::minimum_loss_chunk; chunk /= 2) {
        const planner::MemoryPrediction memory =
            planner::predict_memory(config, 8, 1024, shape.checkpointing, DType::bf16, planner::OptimizerKind::adamw, 1,
                                    1, false, GradientOffload::window, false, chunk);
        const planner::StepCost cost =
            planner::predict_cost(config, 8, 1, 1024, shape.checkpointing, DType::bf16, planner::OptimizerKind::adamw,
                                  1, planner::ceilings_for(Device::cuda, DType::bf16), false, GradientOffload::window,
                                  false, chunk);
        EXPECT_LE(memory.peak_on(Device::cuda), previous_peak) << "chunk " << chunk;
        EXPECT_GT(cost.seconds, previous_seconds) << "chunk " << chunk;
        previous_peak = memory.peak_on(Device::cuda);
        previous_seconds = cost.seconds;
    }
    // A budget one byte below the fastest plan's peak: the chosen plan either chunks smaller or differs.
    const planner::PlanSearch tight = planner::search_plans(config, fastest.peak_bytes - 1, 8, options);
    ASSERT_TRUE(tight.chosen.has_value());
    EXPECT_LE(tight.plans[*tight.chosen].peak_bytes, fastest.peak_bytes - 1);
    bool halved = false;
    for (const planner::Plan& plan : tight.plans)
        halved = halved || plan.shape.loss_chunk_tokens < plan.shape.per_device_train_batch_size * 1024;
    EXPECT_TRUE(halved) << "no plan was halved under a budget the whole micro-batches do not all fit";
    options.loss_chunk_tokens = 3000;
    for (const planner::Plan& plan : planner::search_plans(config, SIZE_MAX, 8, options).plans)
        EXPECT_EQ(plan.shape.loss_chunk_tokens, std::min(3000, plan.shape.per_device_train_batch_size * 1024))
            << plan.flags();
    options.loss_chunk_tokens = 0;
    for (const planner::Plan& plan : planner::search_plans(config, SIZE_MAX, 8, options).plans)
        EXPECT_NE(plan.flags().find("--loss-chunk-tokens off"), std::string::npos) << plan.flags();
}

// The MLP tile: none while a plan fits untiled (any tile costs one more MLP forward: priced, so a tiled plan is
// slower than the same plan untiled); under a budget below every untiled plan's smallest peak, the chosen plan
// tiles and fits; a fixed tile goes into every plan.
TEST(Planner, TilesTheMlpOnlyWhenTheBudgetNeedsIt) {
    const nn::ModelConfig config(nn::GPTConfig::named("gpt2-124M"));
    planner::PlannerOptions options;
    options.device = Device::cuda;
    options.seq_len = 1024;
    options.precisions = {Precision::bf16};
    options.allow_offload_optimizer = false;
    const planner::PlanSearch all = planner::search_plans(config, SIZE_MAX, 8, options);
    for (const planner::Plan& plan : all.plans) EXPECT_EQ(plan.shape.mlp_tile_tokens, 0) << plan.flags();
    const planner::Plan& fastest = all.plans[*all.chosen];
    const StepShape& shape = fastest.shape;
    const int rows = shape.per_device_train_batch_size * 1024;
    const auto cost_at = [&](int tile) {
        return planner::predict_cost(config, shape.per_device_train_batch_size, shape.gradient_accumulation_steps, 1024,
                                     shape.checkpointing, DType::bf16, planner::OptimizerKind::adamw, 1,
                                     planner::ceilings_for(Device::cuda, DType::bf16), false, GradientOffload::window,
                                     false, shape.loss_chunk_tokens, tile);
    };
    EXPECT_GT(cost_at(rows).seconds, cost_at(0).seconds) << "one tile still runs the MLP forward once more";
    EXPECT_GT(cost_at(64).seconds, cost_at(rows).seconds) << "more tiles, more launches";

    options.mlp_tile_tokens = 0;
    const planner::PlanSearch untiled = planner::search_plans(config, 0, 8, options);
    const size_t smallest_untiled = untiled.plans[untiled.smallest].peak_bytes;
    options.mlp_tile_tokens.reset();
    const planner::PlanSearch tight = planner::search_plans(config, smallest_untiled - 1, 8, options);
    ASSERT_TRUE(tight.chosen.has_value()) << "tiles reach below the smallest untiled peak " << smallest_untiled;
    const planner::Plan& chosen = tight.plans[*tight.chosen];
    EXPECT_GT(chosen.shape.mlp_tile_tokens, 0) << chosen.flags();
    EXPECT_LE(chosen.peak_bytes, smallest_untiled - 1) << chosen.flags();
    EXPECT_NE(chosen.flags().find("--mlp-tile-tokens " + std::to_string(chosen.shape.mlp_tile_tokens)), std::string::npos);

    options.mlp_tile_tokens = 300;
    for (const planner::Plan& plan : planner::search_plans(config, SIZE_MAX, 8, options).plans)
        EXPECT_EQ(plan.shape.mlp_tile_tokens, std::min(300, plan.shape.per_device_train_batch_size * 1024)) << plan.flags();
}

// auto's tile: off while a layer's MLP intermediates stay within the head's 256 MiB target, then tiles whose
// intermediates stay within 64 MiB, in multiples of 64 tokens.
TEST(Planner, TheAutomaticMlpTileWaitsForLargeIntermediates) {
    EXPECT_EQ(planner::automatic_mlp_tile(nn::ModelConfig(nn::GPTConfig::named("tiny")), 8, 64, DType::f32), 0);
    const nn::ModelConfig gpt2(nn::GPTConfig::named("gpt2-124M"));
    EXPECT_EQ(planner::automatic_mlp_tile(gpt2, 8, 1024, DType::f32), 0);  // 8 x 1024 x 8C x 4 B = 192 MiB
    EXPECT_EQ(planner::automatic_mlp_tile(gpt2, 16, 1024, DType::f32), 2688); // 384 MiB: 64 MiB / 24 KiB a row
    nn::LlamaConfig one_billion = nn::LlamaConfig::named("smollm-135m");
    one_billion.vocab_size = 128256;
    one_billion.hidden_size = 2048;
    one_billion.intermediate_size = 8192;
    one_billion.num_hidden_layers = 16;
    one_billion.num_attention_heads = 32;
    one_billion.num_key_value_heads = 8;
    one_billion.max_position_embeddings = 8192;
    const nn::ModelConfig llama(one_billion);
    EXPECT_EQ(planner::automatic_mlp_tile(llama, 1, 4096, DType::bf16), 0);   // 3 x 8192 x 2 B a row: 192 MiB
    EXPECT_EQ(planner::automatic_mlp_tile(llama, 1, 8192, DType::bf16), 1344); // 384 MiB: 64 MiB / 48 KiB, to 64
    EXPECT_THROW(planner::automatic_mlp_tile(llama, 0, 8192, DType::bf16), EngineError);
}

TEST(Planner, ParsesMemorySizes) {
    EXPECT_EQ(planner::parse_memory_size("1048576"), 1048576u);
    EXPECT_EQ(planner::parse_memory_size("3.5MiB"), 3670016u);
    EXPECT_EQ(planner::parse_memory_size("16GiB"), size_t(16) << 30);
    EXPECT_EQ(planner::parse_memory_size("0.5KiB"), 512u);
    for (const char* bad : {"", "MiB", "3.5", "1.2.3GiB", "12MB", "-4GiB", "0", "4 GiB"})
        EXPECT_THROW(planner::parse_memory_size(bad), EngineError) << "'" << bad << "'";
    EXPECT_GT(planner::automatic_budget(Device::cpu).budget(), 0u);
}

} // namespace
} // namespace engine::testing
