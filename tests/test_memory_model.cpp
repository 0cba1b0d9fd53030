// The analytic memory model (planner/memory_model.h) against the allocator's accounting: every category's
// predicted peak matches the measured one within 5% across model sizes, batch shapes, dtypes and policies.
#include <gtest/gtest.h>

#include <cmath>

#include "planner/memory_model.h"
#include "gradcheck.h"
#include "optim/trainer.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;

constexpr double tolerance = 0.05; // the bound on the model

struct Shape3 {
    nn::GPTConfig config;
    int batch;
    int seq_len;
    DType dtype;
};

nn::GPTConfig config_of(int vocab, int layers, int heads, int width, float dropout, int max_seq_len) {
    nn::GPTConfig config;
    config.vocab_size = vocab;
    config.max_seq_len = max_seq_len;
    config.n_layer = layers;
    config.n_head = heads;
    config.n_embd = width;
    config.dropout = dropout;
    return config;
}

struct Measured {
    size_t parameters = 0, gradients = 0, activations = 0, workspace = 0, pinned_host = 0;
};

// Which loss the measured step runs: predict_memory's (the fused classifier), or plain cross_entropy, which
// keeps the logits and backpropagates into a separate (B,T,V) gradient buffer.
enum class Loss { in_place, plain };

// One step exactly as predict_memory describes it, measured from the allocator.
Measured measure(const Shape3& shape, const CheckpointPolicy& policy, std::mt19937_64& generator,
                 Loss loss_kind = Loss::in_place, int mlp_tile = 0) {
    current_tape().clear();
    const MemoryStats empty = memory_stats(Device::cpu);
    nn::GPT model(shape.config, 7, Device::cpu, shape.dtype);
    model.train(true);
    model.set_checkpointing(policy);
    model.set_mlp_tile_tokens(mlp_tile);
    const MemoryStats built = memory_stats(Device::cpu);
    Measured measured;
    measured.parameters = built.current(MemoryCategory::parameters) - empty.current(MemoryCategory::parameters);
    measured.gradients = built.current(MemoryCategory::gradients) - empty.current(MemoryCategory::gradients);

    std::uniform_int_distribution<int32_t> token(0, shape.config.vocab_size - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(shape.batch * shape.seq_len)), targets(tokens.size());
    for (int32_t& value : tokens) value = token(generator);
    for (int32_t& value : targets) value = token(generator);
    Tensor token_tensor = Tensor::from_vector(tokens, {shape.batch, shape.seq_len}, Device::cpu);
    Tensor target_tensor = Tensor::from_vector(targets, {shape.batch, shape.seq_len}, Device::cpu);

    const MemoryStats before = memory_stats(Device::cpu);
    reset_peak(Device::cpu);
    manual_seed(3);
    {
        Tensor loss;
        {
            const double inverse_items = 1.0 / static_cast<double>(targets.size());
            const int vocabulary = shape.config.vocab_size;
            Tensor logits = loss_kind == Loss::in_place ? model.forward_padded(token_tensor) // (B,T,Vp)
                                                        : model.forward(token_tensor);       // (B,T,V)
            const Tensor token_sum = loss_kind == Loss::in_place
                                         ? cross_entropy_in_place(logits, target_tensor, Reduction::sum, inverse_items,
                                                                  default_ignore_index, vocabulary)
                                         : cross_entropy(logits, target_tensor, Reduction::sum);
            loss = multiply(token_sum, inverse_items);
        }
        backward(loss);
    }
    const MemoryStats after = memory_stats(Device::cpu);
    auto rise = [&](MemoryCategory category) { return after.peak(category) - before.current(category); };
    measured.activations = rise(MemoryCategory::activations);
    measured.workspace = rise(MemoryCategory::workspace);
    measured.pinned_host = rise(MemoryCategory::pinned_host);
    return measured;
}

void expect_close(const char* what, size_t predicted, size_t measured, const std::string& context) {
    const double error = measured == 0 ? (predicted == 0 ? 0.0 : 1.0)
                                       : std::abs(static_cast<double>(predicted) - static_cast<double>(measured)) /
                                             static_cast<double>(measured);
    EXPECT_LE(error, tolerance) << context << ": " << what << " predicted " << predicted << " B, measured " << measured
                                << " B";
}

TEST(MemoryModel, PredictsEveryCategoryWithinFivePercent) {
    std::mt19937_64 generator = fresh_generator();
    const std::vector<Shape3> shapes = {
        {config_of(64, 6, 4, 32, 0.1f, 16), 2, 16, DType::f32},  // the checkpoint tests' model
        {config_of(40, 3, 2, 16, 0.0f, 8), 1, 8, DType::f64},    // no dropout (dropout returns its input), f64
        {config_of(50, 4, 3, 24, 0.2f, 16), 3, 12, DType::f32},  // odd sizes, T < max_seq_len
        {config_of(256, 5, 4, 32, 0.1f, 8), 2, 8, DType::f32},   // logits dominate (V = 8 C)
        {config_of(64, 9, 2, 16, 0.1f, 32), 1, 32, DType::f32},  // deeper, long sequence
        {config_of(64, 6, 4, 32, 0.1f, 16), 2, 16, DType::bf16}, // mixed precision
        {config_of(50, 4, 3, 24, 0.0f, 16), 3, 12, DType::bf16}, // mixed precision, odd sizes, no dropout
    };
    const std::vector<CheckpointPolicy> policies = {
        CheckpointPolicy{false, 1, 1, false}, CheckpointPolicy{true, 1, 1, false}, CheckpointPolicy{true, 2, 1, false},
        CheckpointPolicy{true, 3, 1, false},  CheckpointPolicy{true, 1, 2, false}, CheckpointPolicy{true, 1, 0, false},
        CheckpointPolicy{true, 1, 1, true},   CheckpointPolicy{true, 2, 1, true},  CheckpointPolicy{true, 1, 0, true},
    };
    for (const Shape3& shape : shapes) {
        for (const CheckpointPolicy& policy : policies) {
            const planner::MemoryPrediction predicted =
                planner::predict_memory(shape.config, shape.batch, shape.seq_len, policy, shape.dtype,
                                           planner::OptimizerKind::none);
            const Measured measured = measure(shape, policy, generator);
            const std::string context = shape.config.to_string() + ", B " + std::to_string(shape.batch) + ", T " +
                                        std::to_string(shape.seq_len) + ", " + dtype_name(shape.dtype) + ", " +
                                        policy.to_string();
            std::printf("  %-96s activations %8zu / %8zu B  workspace %7zu / %7zu B  (%s)\n", context.c_str(),
                        predicted.of(MemoryCategory::activations), measured.activations, predicted.of(MemoryCategory::workspace), measured.workspace,
                        predicted.activations_peak_moment.c_str());
            expect_close("parameters", predicted.of(MemoryCategory::parameters), measured.parameters, context);
            expect_close("gradients", predicted.of(MemoryCategory::gradients), measured.gradients, context);
            expect_close("activations", predicted.of(MemoryCategory::activations), measured.activations, context);
            expect_close("workspace", predicted.of(MemoryCategory::workspace), measured.workspace, context);
            expect_close("pinned_host", predicted.of(MemoryCategory::pinned_host), measured.pinned_host, context);
        }
    }
}

// The fused classifier's saving, measured: plain cross_entropy's backward allocates a zeroed (B,T,V) dlogits
// (plus the per-token loss gradients) in workspace; cross_entropy_in_place writes the gradient over the
// logits, and the activations are unchanged. The workspace peak then falls to the blocks' 9-10 A.
TEST(MemoryModel, FusedClassifierDropsTheLogitsGradientBuffer) {
    std::mt19937_64 generator = fresh_generator();
    const Shape3 shape{config_of(1024, 3, 4, 32, 0.1f, 8), 2, 8, DType::f32}; // logits dominate (V = 32 C)
    const size_t logits = size_t(2) * 8 * 1024 * sizeof(float), stream = size_t(2) * 8 * 32 * sizeof(float);
    for (const CheckpointPolicy& policy : {CheckpointPolicy{false, 1, 1, false}, CheckpointPolicy{true, 1, 1, false}}) {
        const Measured plain = measure(shape, policy, generator, Loss::plain);
        const Measured fused = measure(shape, policy, generator, Loss::in_place);
        const planner::MemoryPrediction predicted = planner::predict_memory(
            shape.config, shape.batch, shape.seq_len, policy, shape.dtype, planner::OptimizerKind::none);
        std::printf("  %s: workspace plain %zu B, fused %zu B (predicted %zu B); activations %zu / %zu B\n",
                    policy.to_string().c_str(), plain.workspace, fused.workspace, predicted.of(MemoryCategory::workspace),
                    plain.activations, fused.activations);
        EXPECT_EQ(fused.workspace, predicted.of(MemoryCategory::workspace)) << policy.to_string();
        EXPECT_EQ(fused.activations, predicted.of(MemoryCategory::activations)) << policy.to_string();
        EXPECT_EQ(fused.activations, plain.activations) << policy.to_string();
        EXPECT_EQ(plain.workspace, logits + stream) << policy.to_string(); // dlogits, then d(ln_f out)
        EXPECT_EQ(fused.workspace, (policy.enabled ? 10 : 9) * stream) << policy.to_string();
    }
}

// Mixed precision, measured: every category equals the prediction to the byte; the activation peak is at most
// 0.55 of the f32 one at the same flags (bf16 halves the streams; the f32 statistics keep it above one half);
// the offloaded (pinned) bytes are exactly half; parameters are the f32 masters plus the bf16 copies.
TEST(MemoryModel, Bf16IsExactToTheByteAndHalvesActivationsAndOffload) {
    std::mt19937_64 generator = fresh_generator();
    const std::vector<nn::GPTConfig> configs = {config_of(64, 6, 4, 32, 0.1f, 16), config_of(256, 4, 4, 64, 0.0f, 32)};
    const std::vector<CheckpointPolicy> policies = {CheckpointPolicy{false, 1, 1, false},
                                                    CheckpointPolicy{true, 2, 1, false}, CheckpointPolicy{true, 1, 1, true}};
    for (const nn::GPTConfig& config : configs) {
        for (const CheckpointPolicy& policy : policies) {
            const Shape3 mixed{config, 2, config.max_seq_len, DType::bf16};
            const Shape3 full{config, 2, config.max_seq_len, DType::f32};
            const auto predicted = planner::predict_memory(config, mixed.batch, mixed.seq_len, policy, DType::bf16,
                                                              planner::OptimizerKind::none);
            const Measured bf16 = measure(mixed, policy, generator);
            const Measured f32 = measure(full, policy, generator);
            const std::string context = config.to_string() + ", " + policy.to_string();
            EXPECT_EQ(bf16.parameters, predicted.of(MemoryCategory::parameters)) << context;
            EXPECT_EQ(bf16.gradients, predicted.of(MemoryCategory::gradients)) << context;
            EXPECT_EQ(bf16.activations, predicted.of(MemoryCategory::activations)) << context;
            EXPECT_EQ(bf16.workspace, predicted.of(MemoryCategory::workspace)) << context;
            EXPECT_EQ(bf16.pinned_host, predicted.of(MemoryCategory::pinned_host)) << context;
            const double ratio = static_cast<double>(bf16.activations) / static_cast<double>(f32.activations);
            std::printf("  %-72s activations bf16 %8zu B, f32 %8zu B (%.3f); pinned %zu / %zu B\n", context.c_str(),
                        bf16.activations, f32.activations, ratio, bf16.pinned_host, f32.pinned_host);
            EXPECT_LE(ratio, 0.55) << context;
            EXPECT_EQ(2 * bf16.pinned_host, f32.pinned_host) << context;
            EXPECT_EQ(bf16.parameters, f32.parameters + f32.parameters / 2) << context << ": f32 masters + bf16 copies";
            EXPECT_EQ(bf16.gradients, f32.gradients) << context << ": gradients stay f32";
        }
    }
}

// The tiled MLP (GPT-2: c_fc, gelu and c_proj tiled, the dropout outside): every category of a bare step to the
// byte, for tiles of one row, a few, two with a shorter last and every row; and the joint peak of trainer steps.
TEST(MemoryModel, TiledMlpIsExactToTheByte) {
    std::mt19937_64 generator = fresh_generator();
    const std::vector<Shape3> shapes = {{config_of(64, 6, 4, 32, 0.1f, 16), 2, 16, DType::f32},
                                        {config_of(256, 4, 4, 64, 0.0f, 32), 2, 32, DType::bf16},
                                        {config_of(32, 3, 2, 48, 0.0f, 24), 1, 24, DType::f32}};
    const std::vector<CheckpointPolicy> policies = {CheckpointPolicy{false, 1, 1, false}, CheckpointPolicy{true, 1, 1, false},
                                                    CheckpointPolicy{true, 1, 2, false}, CheckpointPolicy{true, 1, 1, true}};
    for (const Shape3& shape : shapes) {
        const int rows = shape.batch * shape.seq_len;
        for (const int tile : {1, 5, rows - 3, rows}) {
            for (const CheckpointPolicy& policy : policies) {
                const auto predicted = planner::predict_memory(shape.config, shape.batch, shape.seq_len, policy,
                                                               shape.dtype, planner::OptimizerKind::none, 1, 1, false,
                                                               GradientOffload::window, false, 0, tile);
                const Measured measured = measure(shape, policy, generator, Loss::in_place, tile);
                const std::string context = shape.config.to_string() + ", " + dtype_name(shape.dtype) + ", " +
                                            policy.to_string() + ", MLP tiles of " + std::to_string(tile);
                std::printf("  %-110s activations %8zu / %8zu B  workspace %7zu / %7zu B  (%s)\n", context.c_str(),
                            predicted.of(MemoryCategory::activations), measured.activations,
                            predicted.of(MemoryCategory::workspace), measured.workspace,
                            predicted.activations_peak_moment.c_str());
                EXPECT_EQ(predicted.of(MemoryCategory::activations), measured.activations) << context;
                EXPECT_EQ(predicted.of(MemoryCategory::workspace), measured.workspace) << context;
                EXPECT_EQ(predicted.of(MemoryCategory::pinned_host), measured.pinned_host) << context;
            }
        }
    }
    // Trainer steps (AdamW, two micro-batches): the joint peak, with the streaming head too.
    struct Run {
        nn::GPTConfig config;
        CheckpointPolicy policy;
        bool bf16;
        int loss_chunk, mlp_tile;
    };
    for (const Run& run : {Run{config_of(64, 6, 4, 32, 0.1f, 16), CheckpointPolicy{false, 1, 1, false}, false, 0, 5},
                           Run{config_of(64, 6, 4, 32, 0.1f, 16), CheckpointPolicy{true, 1, 1, true}, true, 0, 32},
                           Run{config_of(256, 4, 4, 64, 0.0f, 32), CheckpointPolicy{true, 2, 1, false}, false, 16, 20},
                           Run{config_of(32, 3, 2, 48, 0.0f, 24), CheckpointPolicy{false, 1, 1, false}, true, 7, 1}}) {
        current_tape().clear();
        const size_t before = memory_stats(Device::cpu).current_bytes;
        const DType dtype = run.bf16 ? DType::bf16 : DType::f32;
        const auto predicted = planner::predict_memory(run.config, 2, run.config.max_seq_len, run.policy, dtype,
                                                       planner::OptimizerKind::adamw, 1, 2, false,
                                                       GradientOffload::window, false, run.loss_chunk, run.mlp_tile);
        nn::GPT model(run.config, 11, Device::cpu, DType::f32);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = 2;
        trainer_config.shape.gradient_accumulation_steps = 2;
        trainer_config.shape.checkpointing = run.policy;
        trainer_config.shape.precision = run.bf16 ? Precision::bf16 : Precision::fp32;
        trainer_config.shape.loss_chunk_tokens = run.loss_chunk;
        trainer_config.shape.mlp_tile_tokens = run.mlp_tile;
        trainer_config.max_steps = 2;
        optim::Trainer trainer(model, trainer_config);
        int cursor = 0;
        const nn::BatchSource source = token_stream_batches(run.config.vocab_size, 2, run.config.max_seq_len, cursor);
        const std::string context = run.config.to_string() + ", " + run.policy.to_string() + ", loss chunks " +
                                    std::to_string(run.loss_chunk) + ", MLP tiles " + std::to_string(run.mlp_tile);
        for (int step = 0; step < 2; ++step)
            EXPECT_EQ(trainer.train_step(source)->memory.peak_bytes - before, predicted.unified_peak_bytes)
                << context << ", step " << step + 1 << " (" << predicted.peak_moment << ")";
    }
}

TEST(MemoryModel, OptimizerStateAndOffloadTerms) {
    const nn::GPTConfig config = config_of(64, 6, 4, 32, 0.1f, 16);
    const auto adamw = planner::predict_memory(config, 2, 16, CheckpointPolicy{true, 1, 1, true}, DType::f32,
                                                  planner::OptimizerKind::adamw);
    const auto sgd = planner::predict_memory(config, 2, 16, CheckpointPolicy{true, 1, 1, true}, DType::f32,
                                                planner::OptimizerKind::sgd);
    // Moments for the real parameters only: wte's padding rows (64 padded to 128) are stored, never updated.
    const size_t padding = size_t(config.padded_vocab_size() - config.vocab_size) * config.n_embd * sizeof(float);
    EXPECT_EQ(adamw.of(MemoryCategory::optimizer_state), 2 * (adamw.of(MemoryCategory::parameters) - padding));
    EXPECT_EQ(sgd.of(MemoryCategory::optimizer_state), sgd.of(MemoryCategory::parameters) - padding);
    EXPECT_EQ(adamw.of(MemoryCategory::pinned_host), 6u * 2 * 16 * 32 * sizeof(float)); // six segments of (B,T,C) f32
    EXPECT_EQ(adamw.checkpointed_segments, 6);
    EXPECT_EQ(adamw.recomputed_blocks, 6);
}

// The optimizer-state term against what the optimizers really allocate, not against the model's own formula.
TEST(MemoryModel, OptimizerStateMatchesWhatTheOptimizersAllocate) {
    nn::GPT model(config_of(97, 3, 4, 32, 0.0f, 16), 5, Device::cpu, DType::f32);
    using planner::OptimizerKind;
    for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
        const size_t before = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state);
        optim::TrainerConfig config;
        config.optimizer = kind == OptimizerKind::adamw ? optim::OptimizerKind::adamw : optim::OptimizerKind::sgd;
        optim::Trainer trainer(model, config);
        const size_t allocated = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state) - before;
        const planner::MemoryPrediction prediction =
            planner::predict_memory(model.config(), 2, 16, CheckpointPolicy{}, DType::f32, kind);
        EXPECT_EQ(prediction.of(MemoryCategory::optimizer_state), allocated) << (kind == OptimizerKind::adamw ? "adamw" : "sgd");
    }
}

TEST(MemoryModel, PlanReportNamesThePolicyAndRejectsBadShapes) {
    const nn::GPTConfig config = config_of(64, 6, 4, 32, 0.1f, 16);
    const std::string report = planner::plan_report(config, 2, 16, CheckpointPolicy{true, 2, 1, false});
    for (const char* fragment : {"every_n_layers 2", "[block 1 CP]", "[block 2 keep]", "activations", "pinned_host",
                                 "3 segments"})
        EXPECT_NE(report.find(fragment), std::string::npos) << "report lacks '" << fragment << "':\n" << report;
    EXPECT_THROW(planner::predict_memory(config, 2, 17, CheckpointPolicy{false, 1, 1, false}), EngineError);
    EXPECT_THROW(planner::predict_memory(config, 0, 16, CheckpointPolicy{false, 1, 1, false}), EngineError);
    EXPECT_THROW(planner::predict_memory(config, 2, 16, CheckpointPolicy{true, 0, 1, false}), EngineError);
}

} // namespace
} // namespace engine::testing
