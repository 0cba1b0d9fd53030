// The LoRA and QLoRA step's memory (planner/adapter_step.h, issue 28 item 6) against the allocator's accounting, to
// the byte: the joint peak of real optim::Trainer steps and every category, for Llama over target sets (PEFT's
// default, the attention, the MLP, all-linear, one layer's), dense and NF4 bases, f32 and bf16, adapter dropout,
// every checkpoint policy with and without offload, the fused classifier and the streaming head, accumulation and
// packed documents' positions; and what the replay refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapter_training.h"
#include "expect_error.h"
#include "llama_step.h"
#include "nn/model_config.h"
#include "nn/qlora.h"
#include "engine/memory_timeline.h"
#include "planner/adapter_step.h"
#include "planner/memory_model.h"
#include "planner/planner.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;

struct AdapterRun {
    nn::ModelConfig config;
    std::vector<std::string> targets;
    bool nf4 = false;
    bool bf16 = false;
    CheckpointPolicy policy;
    int micro_batch = 2, accumulation = 1, length = 33;
    int loss_chunk = 0;
    double dropout = 0.0;
    int rank = 4;
    int mlp_tile = 0;
};

std::string describe(const AdapterRun& run) {
    std::string text = run.config.to_string();
    if (run.targets.empty()) text += ", full fine-tune";
    else text += (run.nf4 ? ", QLoRA r " : ", LoRA r ") + std::to_string(run.rank) + " on";
    for (const std::string& target : run.targets) text += " " + target;
    text += std::string(run.bf16 ? ", bf16" : ", f32") + ", " + run.policy.to_string() + ", B " +
            std::to_string(run.micro_batch) + " x " + std::to_string(run.accumulation) + ", T " +
            std::to_string(run.length) + ", loss chunks " + std::to_string(run.loss_chunk) + ", MLP tiles " +
            std::to_string(run.mlp_tile) + ", dropout " + std::to_string(run.dropout);
    return text;
}

nn::LoraConfig lora_of(const AdapterRun& run) {
    nn::LoraConfig lora;
    lora.r = run.rank;
    lora.lora_alpha = 8.0;
    lora.lora_dropout = run.dropout;
    lora.target_modules = run.targets;
    return lora;
}

struct Trained {
    std::vector<size_t> peaks; // each step's joint peak above what the process held before the model
    std::vector<MemoryStats> memory;
    size_t before = 0;
};

// The run's model, adapted (and quantised) as train_gpt does it (no targets: a full fine-tune's), and the trainer's
// config for it.
std::unique_ptr<nn::CausalLM> adapted_model(const AdapterRun& run) {
    std::unique_ptr<nn::CausalLM> model = run.config.build(11, Device::cpu, DType::f32);
    if (run.targets.empty()) return model; // a full fine-tune
    nn::apply_lora(*model, lora_of(run));
    if (run.nf4) nn::quantize_nf4(*model);
    return model;
}

optim::TrainerConfig trainer_config(const AdapterRun& run, int steps) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = run.micro_batch;
    config.shape.gradient_accumulation_steps = run.accumulation;
    config.shape.checkpointing = run.policy;
    config.shape.precision = run.bf16 ? Precision::bf16 : Precision::fp32;
    config.shape.loss_chunk_tokens = run.loss_chunk;
    config.shape.mlp_tile_tokens = run.mlp_tile;
    config.learning_rate = 1e-2;
    config.max_steps = steps;
    return config;
}

Trained train(const AdapterRun& run, int steps = 2) {
    current_tape().clear();
    Trained trained;
    trained.before = memory_stats(Device::cpu).current_bytes;
    const std::unique_ptr<nn::CausalLM> model = adapted_model(run);
    optim::Trainer trainer(*model, trainer_config(run, steps));
    int cursor = 0;
    const nn::BatchSource source = token_stream_batches(run.config.vocab_size(), run.micro_batch, run.length, cursor);
    for (int step = 0; step < steps; ++step) {
        const optim::StepResult result = *trainer.train_step(source);
        EXPECT_TRUE(std::isfinite(result.loss));
        trained.peaks.push_back(result.memory.peak_bytes - trained.before);
        trained.memory.push_back(result.memory);
    }
    return trained;
}

planner::MemoryPrediction predict(const AdapterRun& run) {
    planner::FineTuning tuning;
    tuning.lora = lora_of(run);
    tuning.nf4 = run.nf4;
    return planner::predict_memory(run.config, run.micro_batch, run.length, run.policy,
                                   run.bf16 ? DType::bf16 : DType::f32, planner::OptimizerKind::adamw, 1,
                                   run.accumulation, false, GradientOffload::window, false, run.loss_chunk,
                                   run.mlp_tile, false, tuning);
}

// A small vocabulary and a wide MLP: the peak moves from the LM head into a layer's backward.
nn::LlamaConfig wide_mlp_config() {
    nn::LlamaConfig config = test::small_llama_config(false);
    config.vocab_size = 16;
    config.intermediate_size = 192;
    return config;
}

// Each run's two trainer steps: the joint peak and the persistent categories equal the prediction's.
void expect_exact_peaks(const std::vector<AdapterRun>& runs) {
    for (const AdapterRun& run : runs) {
        const planner::MemoryPrediction predicted = predict(run);
        const Trained trained = train(run);
        std::printf("  %-150s peak predicted %8zu B, measured %8zu / %8zu B (%s)\n", describe(run).c_str(),
                    predicted.unified_peak_bytes, trained.peaks[0], trained.peaks[1], predicted.peak_moment.c_str());
        for (size_t step = 0; step < trained.peaks.size(); ++step) {
            EXPECT_EQ(trained.peaks[step], predicted.unified_peak_bytes) << describe(run) << ", step " << step + 1;
            for (MemoryCategory category :
                 {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state})
                EXPECT_EQ(trained.memory[step].current(category), predicted.of(category))
                    << describe(run) << ": " << memory_category_name(category);
        }
    }
}

TEST(AdapterMemory, TrainerStepPeakIsExactToTheByte) {
    const nn::LlamaConfig untied = test::small_llama_config(false), tied = test::small_llama_config(true);
    const nn::LlamaConfig wide = wide_mlp_config();
    const std::vector<std::string> peft_default = {"q_proj", "v_proj"}, all = {"all-linear"};
    const std::vector<std::string> mlp = {"gate_proj", "up_proj", "down_proj"};
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, every_other{true, 2, 1, false},
        pairs_offloaded{true, 1, 2, true}, offloaded{true, 1, 1, true}, third{true, 3, 1, false};
    std::vector<AdapterRun> runs = {
        {untied, peft_default, false, false, plain},
        {tied, peft_default, false, false, every},
        {untied, all, false, false, plain},
        {untied, all, false, false, every_other},
        {wide, mlp, false, false, plain},
        {wide, mlp, false, false, third},
        {wide, {"o_proj"}, false, false, offloaded},
        {untied, {"layers.2.self_attn.k_proj"}, false, false, plain},
        {untied, all, true, false, plain},
        {wide, all, true, false, pairs_offloaded},
        {untied, peft_default, false, true, plain},
        {tied, all, false, true, every},
        {wide, all, true, true, offloaded},
        {untied, peft_default, true, true, every_other},
    };
    // Accumulation, the streaming head, adapter dropout, a larger rank.
    runs.push_back({untied, peft_default, false, false, plain, 2, 2, 33, 16});
    runs.push_back({wide, all, false, true, every, 1, 3, 33, 7});
    runs.push_back({untied, all, false, false, plain, 2, 1, 33, 0, 0.1});
    runs.push_back({wide, mlp, true, false, offloaded, 2, 2, 20, 0, 0.25});
    runs.push_back({tied, all, false, false, every_other, 2, 1, 33, 66, 0.0, 12});
    // The tiled MLP: alone, with a shorter last tile, checkpointed with offload, QLoRA, bf16 and the streaming head.
    runs.push_back({wide, mlp, false, false, plain, 2, 1, 33, 0, 0.0, 4, 8});
    runs.push_back({untied, all, false, false, every, 2, 1, 33, 0, 0.0, 4, 5});
    runs.push_back({wide, all, true, true, offloaded, 2, 2, 33, 16, 0.1, 4, 16});
    runs.push_back({untied, peft_default, false, false, plain, 1, 1, 33, 0, 0.0, 4, 66});
    expect_exact_peaks(runs);
}

// GPT-2 (layernorm, biased linears, gelu, dropout in the embeddings, the attention and the MLP, a padded tied head):
// the same exactness over its target sets, checkpointing, NF4, bf16, the streaming head and the tiled MLP.
TEST(AdapterMemory, Gpt2TrainerStepPeakIsExactToTheByte) {
    nn::GPTConfig tiny = nn::ModelConfig::named("tiny").gpt();
    nn::GPTConfig dropping = tiny;
    dropping.dropout = 0.1f;
    const std::vector<std::string> attention = {"c_attn"}, all = {"all-linear"}, mlp = {"c_fc", "mlp.c_proj"};
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, every_other{true, 2, 1, false},
        offloaded{true, 1, 1, true};
    std::vector<AdapterRun> runs = {
        {tiny, attention, false, false, plain, 2, 1, 32},
        {tiny, all, false, false, every, 2, 1, 32},
        {dropping, all, false, false, plain, 2, 1, 32},
        {dropping, mlp, false, false, every_other, 2, 2, 32},
        {tiny, all, true, false, offloaded, 2, 1, 32},
        {tiny, attention, false, true, plain, 2, 1, 32},
        {dropping, all, true, true, every, 2, 1, 32},
        {tiny, all, true, true, plain, 2, 1, 32},
        {tiny, mlp, true, true, plain, 2, 1, 32},
    };
    runs.push_back({tiny, all, false, false, plain, 2, 1, 32, 16, 0.1});
    runs.push_back({dropping, mlp, false, true, offloaded, 2, 2, 32, 0, 0.0, 4, 7});
    runs.push_back({tiny, {"attn.c_proj"}, true, false, every, 1, 2, 32, 20, 0.0, 8, 16});
    expect_exact_peaks(runs);
}

// The allocator's events for one micro-batch of `run` as optim::Trainer runs it (its model set up by a real trainer:
// LoRA, NF4, the compute dtype, checkpointing, MLP tiles), from the embedding to the end of backward.
std::vector<planner::AdapterStepEvent> allocator_events(const AdapterRun& run, bool evaluation = false) {
    current_tape().clear();
    const std::unique_ptr<nn::CausalLM> built = adapted_model(run);
    nn::CausalLM& model = *built;
    const optim::Trainer trainer(model, trainer_config(run, 1));
    model.train(true);
    int cursor = 0;
    const nn::Batch batch = *token_stream_batches(run.config.vocab_size(), run.micro_batch, run.length, cursor)();
    const Tensor targets = optim::Trainer::shift_targets(batch);
    const double factor = 1.0 / static_cast<double>(run.micro_batch * run.length);
    if (evaluation) model.train(false);
    start_memory_timeline();
    {
        std::optional<NoGradGuard> no_grad;
        if (evaluation) no_grad.emplace(); // Trainer::evaluate's forward
        Tensor sum;
        if (run.loss_chunk > 0) {
            sum = linear_cross_entropy(model.forward_hidden(batch.inputs, Tensor()), model.head_weight(), targets,
                                       Reduction::sum, run.loss_chunk, factor, default_ignore_index, model.vocab_size());
        } else {
            const Tensor logits = model.forward_padded(batch.inputs, Tensor());
            sum = cross_entropy_in_place(logits, targets, Reduction::sum, factor, default_ignore_index,
                                         model.vocab_size());
        }
        if (!evaluation) backward(multiply(sum, factor));
    }
    const MemoryTimeline timeline = stop_memory_timeline();
    std::vector<planner::AdapterStepEvent> events;
    for (const MemoryEvent& event : timeline.events) {
        const int account = static_cast<int>(event.category) - static_cast<int>(MemoryCategory::activations);
        if (account >= 0) events.push_back({account, event.bytes});
    }
    current_tape().clear();
    return events;
}

// The replay's events against the allocator's: equal in order, or the first difference and its neighbours named.
void expect_same_events(const std::vector<planner::AdapterStepEvent>& replayed,
                        const std::vector<planner::AdapterStepEvent>& measured, const std::string& what) {
    size_t same = 0;
    while (same < replayed.size() && same < measured.size() && replayed[same].account == measured[same].account &&
           replayed[same].bytes == measured[same].bytes)
        ++same;
    std::string around; // the events about the first difference: account and signed bytes, replay | allocator
    for (size_t k = same > 3 ? same - 3 : 0; k < same + 3; ++k) {
        const auto show = [&](const std::vector<planner::AdapterStepEvent>& events) {
            return k < events.size() ? std::to_string(events[k].account) + ":" + std::to_string(events[k].bytes)
                                     : std::string("-");
        };
        around += " [" + std::to_string(k) + "] " + show(replayed) + " | " + show(measured);
    }
    EXPECT_TRUE(same == measured.size() && same == replayed.size())
        << what << ": the replay's " << replayed.size() << " events and the allocator's " << measured.size()
        << " first differ at event " << same << ":" << around;
    std::printf("  %-150s %zu events, the same in order\n", what.c_str(), same);
}

// Stronger than the peaks: the replay's every allocation and free, in order, is the allocator's, so a rule that is
// wrong where no peak falls in these shapes still shows.
TEST(AdapterMemory, EveryAllocationAndFreeIsTheAllocatorsInOrder) {
    const nn::LlamaConfig untied = test::small_llama_config(false), tied = test::small_llama_config(true);
    nn::GPTConfig dropping = nn::ModelConfig::named("tiny").gpt();
    dropping.dropout = 0.1f;
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, pairs_offloaded{true, 1, 2, true},
        third{true, 3, 1, false};
    const std::vector<std::string> peft_default = {"q_proj", "v_proj"}, all = {"all-linear"};
    std::vector<AdapterRun> runs = {
        {untied, peft_default, false, false, plain},
        {tied, all, true, true, every},
        {wide_mlp_config(), {"down_proj", "k_proj"}, true, false, pairs_offloaded},
        {untied, all, false, true, third, 2, 1, 33, 16, 0.1, 4, 8},
        {dropping, all, true, true, every, 2, 1, 32},
        {dropping, {"c_attn", "c_fc"}, false, false, pairs_offloaded, 2, 1, 32, 20, 0.25, 4, 7},
    };
    for (const AdapterRun& run : runs) {
        std::vector<planner::AdapterStepEvent> replayed;
        planner::walk_adapter_step(run.config, run.micro_batch, run.length, run.policy,
                                   run.bf16 ? DType::bf16 : DType::f32, lora_of(run), run.nf4, run.loss_chunk,
                                   run.mlp_tile, &replayed);
        expect_same_events(replayed, allocator_events(run), describe(run));
    }
}

// Evaluations to check: full fine-tunes (no targets) and LoRA and QLoRA runs of GPT-2 and Llama, f32 and bf16,
// plain, checkpointed and offloaded, chunked and tiled, with dropout to switch off.
std::vector<AdapterRun> evaluation_runs() {
    const nn::LlamaConfig untied = test::small_llama_config(false), tied = test::small_llama_config(true);
    nn::GPTConfig dropping = nn::ModelConfig::named("tiny").gpt();
    dropping.dropout = 0.1f;
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, pairs_offloaded{true, 1, 2, true};
    const std::vector<std::string> all = {"all-linear"};
    return {
        {untied, {}, false, false, plain},
        {tied, {}, false, true, every, 2, 2, 33, 16},
        {wide_mlp_config(), {}, false, false, pairs_offloaded, 1, 1, 33, 0, 0.0, 4, 8},
        {untied, all, true, true, pairs_offloaded, 2, 1, 33, 0, 0.1, 4, 8},
        {untied, {"q_proj", "v_proj"}, false, false, plain, 3, 1, 20},
        {dropping, {}, false, false, plain, 2, 1, 32},
        {dropping, {}, false, true, every, 2, 1, 32, 20, 0.0, 4, 7},
        {dropping, {"c_attn"}, true, false, pairs_offloaded, 2, 1, 32, 0, 0.25},
    };
}

// An evaluation's forward (eval mode, no-grad): the replay's events are the allocator's, for a full fine-tune (the
// runs without targets) and for LoRA and QLoRA runs; the padded GPT-2 head's copy of its real columns included.
TEST(AdapterMemory, EvaluationEventsAreTheAllocatorsInOrder) {
    const std::vector<AdapterRun> runs = evaluation_runs();
    for (const AdapterRun& run : runs) {
        planner::FineTuning tuning;
        if (!run.targets.empty()) tuning.lora = lora_of(run), tuning.nf4 = run.nf4;
        std::vector<planner::AdapterStepEvent> replayed;
        planner::walk_evaluation(run.config, run.micro_batch, run.length, run.policy, run.bf16 ? DType::bf16 : DType::f32,
                                 tuning, run.loss_chunk, run.mlp_tile, &replayed);
        expect_same_events(replayed, allocator_events(run, true), describe(run) + ", evaluation");
    }
}

// The evaluation phase (Trainer::evaluate after a step, K batches): its joint peak on the allocator's account equals
// predict_evaluation_memory to the byte, full fine-tunes and LoRA and QLoRA runs alike.
TEST(AdapterMemory, EvaluationPhasePeakIsExactToTheByte) {
    const std::vector<AdapterRun> runs = evaluation_runs();
    for (const AdapterRun& run : runs)
        for (const int eval_batches : {1, 3}) {
            planner::FineTuning tuning;
            if (!run.targets.empty()) tuning.lora = lora_of(run), tuning.nf4 = run.nf4;
            const planner::PhasePrediction predicted = planner::predict_evaluation_memory(
                run.config, run.micro_batch, run.length, run.policy, run.bf16 ? DType::bf16 : DType::f32,
                planner::OptimizerKind::adamw, 1, false, GradientOffload::window, false, eval_batches, run.loss_chunk,
                run.mlp_tile, false, tuning);
            current_tape().clear();
            const size_t before = memory_stats(Device::cpu).current_bytes;
            size_t measured = 0;
            {
                const std::unique_ptr<nn::CausalLM> model = adapted_model(run);
                optim::Trainer trainer(*model, trainer_config(run, 2));
                int cursor = 0;
                const nn::BatchSource source =
                    token_stream_batches(run.config.vocab_size(), run.micro_batch, run.length, cursor);
                trainer.train_step(source);
                std::vector<nn::Batch> batches;
                int eval_cursor = 100;
                const nn::BatchSource eval_source =
                    token_stream_batches(run.config.vocab_size(), run.micro_batch, run.length, eval_cursor);
                for (int index = 0; index < eval_batches; ++index) batches.push_back(*eval_source());
                reset_peak(Device::cpu);
                EXPECT_TRUE(std::isfinite(trainer.evaluate(batches).loss));
                measured = memory_stats(Device::cpu).peak_bytes - before;
            }
            current_tape().clear();
            const std::string what = describe(run) + ", " + std::to_string(eval_batches) + " evaluation batches";
            EXPECT_EQ(measured, predicted.peak_bytes) << what;
            std::printf("  %-160s evaluation peak predicted %8zu B, measured %8zu B (%s)\n", what.c_str(),
                        predicted.peak_bytes, measured, predicted.moment.c_str());
        }
}

// The replay skips the MLP tiles whose marks repeat an earlier tile's (the planner's searches try tiles of 64 rows
// at T 4096: 64 a layer); every mark equals the replay of every tile.
TEST(AdapterMemory, SkippedTilesChangeNoMark) {
    const nn::LlamaConfig untied = test::small_llama_config(false);
    nn::GPTConfig dropping = nn::ModelConfig::named("tiny").gpt();
    dropping.dropout = 0.1f;
    const CheckpointPolicy plain{false, 1, 1, false}, every{true, 1, 1, false}, offloaded{true, 2, 1, true};
    for (const nn::ModelConfig& config : {nn::ModelConfig(untied), nn::ModelConfig(dropping)})
        for (const CheckpointPolicy& policy : {plain, every, offloaded})
            for (const int tile : {1, 2, 5, 16, 31, 32, 33, 64})
                for (const bool nf4 : {false, true}) {
                    const AdapterRun run{config, {"all-linear"}, nf4, nf4, policy, 2, 1, 32, 0, 0.0, 4, tile};
                    std::vector<planner::AdapterStepEvent> events;
                    const planner::AdapterStepWalk every_tile =
                        planner::walk_adapter_step(config, 2, 32, policy, run.bf16 ? DType::bf16 : DType::f32,
                                                   lora_of(run), nf4, 0, tile, &events);
                    const planner::AdapterStepWalk skipping = planner::walk_adapter_step(
                        config, 2, 32, policy, run.bf16 ? DType::bf16 : DType::f32, lora_of(run), nf4, 0, tile);
                    EXPECT_EQ(skipping.activations, every_tile.activations) << describe(run);
                    EXPECT_EQ(skipping.workspace, every_tile.workspace) << describe(run);
                    EXPECT_EQ(skipping.pinned_host, every_tile.pinned_host) << describe(run);
                    EXPECT_EQ(skipping.joint, every_tile.joint) << describe(run);
                    EXPECT_EQ(skipping.unified_joint, every_tile.unified_joint) << describe(run);
                    EXPECT_EQ(skipping.joint_moment, every_tile.joint_moment) << describe(run);
                }
}

// --max-memory for a LoRA run: the planner searches with the LoRA step, every plan keeps the optimizer on the
// device without ZeRO, and the chosen plan, trained, peaks where predicted and within the budget.
TEST(AdapterMemory, PlannerChoosesALoraPlanThatFitsAndIsExactWhenTrained) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    constexpr int global_batch = 4;
    planner::PlannerOptions options;
    options.ceilings = planner::cpu_ceilings();
    options.precisions = {Precision::fp32, Precision::bf16};
    AdapterRun run{config, {"all-linear"}, true};
    options.tuning.lora = lora_of(run);
    options.tuning.nf4 = true;
    const planner::PlanSearch everything = planner::search_plans(config, SIZE_MAX, global_batch, options);
    ASSERT_TRUE(everything.chosen.has_value());
    for (const planner::Plan& plan : everything.plans)
        EXPECT_TRUE(!plan.shape.offload_optimizer && plan.shape.zero_stage == 0) << plan.flags();
    const size_t smallest = everything.plans[everything.smallest].peak_bytes;
    const size_t fastest = everything.plans.front().peak_bytes;
    ASSERT_LT(smallest, fastest);
    for (size_t budget : {smallest, (smallest + fastest) / 2}) {
        const planner::Plan plan = planner::plan_for_budget(config, budget, global_batch, options);
        EXPECT_LE(plan.peak_bytes, budget);
        run.micro_batch = plan.shape.per_device_train_batch_size;
        run.accumulation = plan.shape.gradient_accumulation_steps;
        run.length = config.max_position_embeddings;
        run.policy = plan.shape.checkpointing;
        run.bf16 = plan.shape.precision == Precision::bf16;
        run.loss_chunk = plan.shape.loss_chunk_tokens;
        run.mlp_tile = plan.shape.mlp_tile_tokens;
        const Trained trained = train(run);
        std::printf("  budget %9zu B -> %-60s predicted %8zu B, measured %8zu / %8zu B\n", budget,
                    plan.summary().c_str(), plan.peak_bytes, trained.peaks[0], trained.peaks[1]);
        for (size_t peak : trained.peaks) {
            EXPECT_EQ(peak, plan.peak_bytes) << plan.flags();
            EXPECT_LE(peak, budget) << plan.flags();
        }
    }
    EXPECT_THROW(planner::plan_for_budget(config, smallest - 1, global_batch, options), planner::NoPlanFits);
}

// With --eval-data the planner keeps the evaluation between steps in the budget too: at a budget the fastest plan's
// step fits but its evaluation (many batches held for its length) does not, it chooses another plan, and that plan,
// trained and evaluated, stays within the budget in both phases, each peak as predicted.
TEST(AdapterMemory, PlannerKeepsTheEvaluationWithinTheBudget) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    constexpr int global_batch = 4, eval_batches = 3000;
    planner::PlannerOptions options;
    options.ceilings = planner::cpu_ceilings();
    const planner::PlanSearch steps_only = planner::search_plans(config, SIZE_MAX, global_batch, options);
    const planner::Plan& fastest = steps_only.plans.front();
    const size_t budget = fastest.peak_bytes;
    const int length = config.max_position_embeddings;
    const size_t fastest_evaluation =
        planner::predict_evaluation_memory(config, fastest.shape.per_device_train_batch_size, length,
                                           fastest.shape.checkpointing, DType::f32, planner::OptimizerKind::adamw, 1,
                                           false, GradientOffload::window, false, eval_batches, fastest.shape.loss_chunk_tokens,
                                           fastest.shape.mlp_tile_tokens, false)
            .peak_bytes;
    ASSERT_GT(fastest_evaluation, budget) << "the evaluation must be what the budget binds";
    options.eval_batches = eval_batches;
    const planner::Plan plan = planner::plan_for_budget(config, budget, global_batch, options);
    EXPECT_NE(plan.summary(), fastest.summary());
    EXPECT_GT(plan.evaluation_peak_bytes, plan.memory.peak_on(Device::cpu)) << "the evaluation is this plan's peak";
    EXPECT_EQ(plan.peak_bytes, plan.evaluation_peak_bytes);
    EXPECT_LE(plan.peak_bytes, budget);
    AdapterRun run{config};
    run.micro_batch = plan.shape.per_device_train_batch_size;
    run.accumulation = plan.shape.gradient_accumulation_steps;
    run.length = length;
    run.policy = plan.shape.checkpointing;
    run.loss_chunk = plan.shape.loss_chunk_tokens;
    run.mlp_tile = plan.shape.mlp_tile_tokens;
    current_tape().clear();
    const size_t before = memory_stats(Device::cpu).current_bytes;
    size_t step_peak = 0, evaluation_peak = 0;
    {
        const std::unique_ptr<nn::CausalLM> model = adapted_model(run);
        optim::Trainer trainer(*model, trainer_config(run, 1));
        int cursor = 0;
        const nn::BatchSource source = token_stream_batches(config.vocab_size, run.micro_batch, length, cursor);
        step_peak = trainer.train_step(source)->memory.peak_bytes - before;
        std::vector<nn::Batch> batches;
        int eval_cursor = 100;
        const nn::BatchSource eval_source = token_stream_batches(config.vocab_size, run.micro_batch, length, eval_cursor);
        for (int index = 0; index < eval_batches; ++index) batches.push_back(*eval_source());
        reset_peak(Device::cpu);
        EXPECT_TRUE(std::isfinite(trainer.evaluate(batches).loss));
        evaluation_peak = memory_stats(Device::cpu).peak_bytes - before;
    }
    current_tape().clear();
    EXPECT_EQ(step_peak, plan.memory.peak_on(Device::cpu));
    EXPECT_EQ(evaluation_peak, plan.evaluation_peak_bytes);
    EXPECT_LE(std::max(step_peak, evaluation_peak), budget);
    std::printf("  budget %zu B: without the evaluation %s (its evaluation %zu B); with it %s: step %zu B, "
                "evaluation %zu B, measured %zu B and %zu B\n",
                budget, fastest.summary().c_str(), fastest_evaluation, plan.summary().c_str(),
                plan.memory.peak_on(Device::cpu), plan.evaluation_peak_bytes, step_peak, evaluation_peak);
}

// train_gpt --plan's report for a LoRA run compares like with like: its untiled, whole-logits and unchecked
// alternatives are LoRA steps too.
TEST(AdapterMemory, PlanReportComparesLoraWithLora) {
    const nn::ModelConfig config = nn::ModelConfig::named("llama-tiny");
    planner::FineTuning tuning;
    AdapterRun run{config, {"all-linear"}, true};
    tuning.lora = lora_of(run);
    tuning.nf4 = true;
    const CheckpointPolicy every{true, 1, 1, false};
    const auto predict_with = [&](const CheckpointPolicy& policy, int chunk, int tile) {
        return planner::predict_memory(config, 4, 64, policy, DType::bf16, planner::OptimizerKind::adamw, 1, 1, false,
                                       GradientOffload::window, false, chunk, tile, false, tuning);
    };
    const std::string report = planner::plan_report(config, 4, 64, every, DType::bf16, planner::OptimizerKind::adamw,
                                                    1, 1, false, GradientOffload::window, false, 100, 64, false, tuning);
    const auto line_of = [&](const std::string& start) {
        const size_t at = report.find("\n" + start);
        return at == std::string::npos ? std::string() : report.substr(at + 1, report.find('\n', at + 1) - at - 1);
    };
    const std::string planned = planner::mebibytes(predict_with(every, 100, 64).peak_bytes);
    EXPECT_NE(line_of("MLP: tiled").find("the step peak " + planned + " instead of " +
                                         planner::mebibytes(predict_with(every, 100, 0).peak_bytes)),
              std::string::npos)
        << report;
    EXPECT_NE(line_of("loss: streaming head").find("the step peak " + planned + " instead of " +
                                                   planner::mebibytes(predict_with(every, 0, 64).peak_bytes)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("LoRA: r 4"), std::string::npos) << report;
}

// What the replay does not follow yet is refused by name, and a LoRA config apply_lora would refuse is refused as
// predict_model_state refuses it.
TEST(AdapterMemory, RefusesWhatTheReplayDoesNotFollow) {
    planner::FineTuning tuning;
    nn::LoraConfig lora;
    lora.r = 4;
    lora.target_modules = {"q_proj"};
    tuning.lora = lora;
    const nn::ModelConfig llama = nn::ModelConfig::named("llama-tiny");
    const CheckpointPolicy every{true, 1, 1, false};
    const auto predict = [&](const nn::ModelConfig& config, int shards, bool offload_optimizer, int tile) {
        return planner::predict_memory(config, 2, 16, every, DType::f32, planner::OptimizerKind::adamw, shards, 1,
                                       offload_optimizer, GradientOffload::window, false, 0, tile, false, tuning);
    };
    expect_error([&] { predict(llama, 1, true, 0); }, {"the LoRA step", "optimizer or parameters off the device"});
    expect_error([&] { predict(llama, 2, false, 0); }, {"the LoRA step", "ZeRO-1 (2 shards)"});
    const auto evaluation = [&](int shards, bool offload_optimizer, bool offload_parameters, int batches) {
        return planner::predict_evaluation_memory(llama, 2, 16, every, DType::f32, planner::OptimizerKind::adamw, shards,
                                                  offload_optimizer, GradientOffload::window, offload_parameters,
                                                  batches, 0, 0, false, tuning);
    };
    expect_error([&] { evaluation(2, false, false, 1); }, {"the LoRA step", "ZeRO-1 (2 shards)"});
    expect_error([&] { evaluation(1, true, false, 1); }, {"the LoRA step", "optimizer or parameters off the device"});
    expect_error([&] { evaluation(1, true, true, 1); }, {"predict_evaluation_memory", "parameters streamed from the host"});
    expect_error([&] { evaluation(1, false, false, 0); }, {"predict_evaluation_memory", "eval_batches 0 must be >= 1"});
    nn::LoraConfig zero_rank = *tuning.lora;
    zero_rank.r = 0;
    expect_error([&] { planner::walk_adapter_step(llama, 2, 16, every, DType::f32, zero_rank, false, 0); },
                 {"the LoRA step's replay", "r 0 must be at least 1"});
    expect_error([&] { planner::walk_adapter_step(llama, 2, 100000, every, DType::f32, *tuning.lora, false, 0); },
                 {"the LoRA step's replay", "seq_len 100000"});
    expect_error([&] { planner::walk_adapter_step(llama, 2, 16, every, DType::f32, *tuning.lora, false, -1); },
                 {"loss_chunk_tokens -1"});
    tuning.lora->target_modules = {"c_attn"};
    expect_error([&] { predict(llama, 1, false, 0); }, {"target module 'c_attn'", "matches no adaptable linear layer"});
}

} // namespace
} // namespace engine::testing
