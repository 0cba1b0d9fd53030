// The memory model for Llama (planner/memory_model_llama.cpp) against the allocator's accounting, to the byte:
// every category of a bare training step and the joint peak of optim::Trainer steps, tied and untied heads,
// grouped-query attention, every checkpoint policy with and without offload, f32 and bf16; and the planner's
// choice for a Llama config, trained.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <tuple>

#include "gradcheck.h"
#include "llama_step.h"
#include "optim/trainer.h"
#include "planner/planner.h"
#include "tests/packed_documents.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;

struct Measured {
    size_t parameters = 0, gradients = 0, activations = 0, workspace = 0, pinned_host = 0;
};

// One step as the trainer's loss runs it (forward_padded, the fused classifier, multiply by 1/items, backward),
// measured from the allocator: the persistent categories after construction, the others' rise over the step.
Measured measure(const nn::LlamaConfig& config, int batch, int seq_len, DType dtype, const CheckpointPolicy& policy,
                 std::mt19937_64& generator, int mlp_tile = 0) {
    current_tape().clear();
    const MemoryStats empty = memory_stats(Device::cpu);
    nn::Llama model(config, 7, Device::cpu, dtype);
    model.train(true);
    model.set_checkpointing(policy);
    model.set_mlp_tile_tokens(mlp_tile);
    const MemoryStats built = memory_stats(Device::cpu);
    Measured measured;
    measured.parameters = built.current(MemoryCategory::parameters) - empty.current(MemoryCategory::parameters);
    measured.gradients = built.current(MemoryCategory::gradients) - empty.current(MemoryCategory::gradients);

    std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(batch * seq_len)), targets(tokens.size());
    for (int32_t& value : tokens) value = token(generator);
    for (int32_t& value : targets) value = token(generator);
    const Tensor token_tensor = Tensor::from_vector(tokens, {batch, seq_len}, Device::cpu);
    const Tensor target_tensor = Tensor::from_vector(targets, {batch, seq_len}, Device::cpu);

    const MemoryStats before = memory_stats(Device::cpu);
    reset_peak(Device::cpu);
    {
        Tensor loss;
        {
            const double inverse_items = 1.0 / static_cast<double>(targets.size());
            const Tensor logits = model.forward_padded(token_tensor); // (B,T,V)
            loss = multiply(cross_entropy_in_place(logits, target_tensor, Reduction::sum, inverse_items,
                                                   default_ignore_index, config.vocab_size),
                            inverse_items);
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

struct Trained {
    std::vector<size_t> peaks; // each step's joint peak above what the process held before the model
    std::vector<MemoryStats> memory;
    size_t before = 0;
};

// `steps` optimizer steps of a real optim::Trainer (AdamW), as train_gpt runs them.
Trained train(const nn::LlamaConfig& config, int micro_batch, int accumulation, int length,
              const CheckpointPolicy& policy, bool bf16, int steps = 2, int loss_chunk = 0, int mlp_tile = 0) {
    current_tape().clear();
    Trained trained;
    trained.before = memory_stats(Device::cpu).current_bytes;
    nn::Llama model(config, 11, Device::cpu, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = micro_batch;
    trainer_config.shape.gradient_accumulation_steps = accumulation;
    trainer_config.shape.checkpointing = policy;
    trainer_config.learning_rate = 1e-2;
    trainer_config.max_steps = steps;
    trainer_config.shape.precision = bf16 ? Precision::bf16 : Precision::fp32;
    trainer_config.shape.loss_chunk_tokens = loss_chunk;
    trainer_config.shape.mlp_tile_tokens = mlp_tile;
    optim::Trainer trainer(model, trainer_config);
    int cursor = 0;
    const nn::BatchSource source = token_stream_batches(config.vocab_size, micro_batch, length, cursor);
    for (int step = 0; step < steps; ++step) {
        const optim::StepResult result = *trainer.train_step(source);
        EXPECT_TRUE(std::isfinite(result.loss));
        trained.peaks.push_back(result.memory.peak_bytes - trained.before);
        trained.memory.push_back(result.memory);
    }
    return trained;
}

const std::vector<CheckpointPolicy>& policies() {
    static const std::vector<CheckpointPolicy> all = {
        CheckpointPolicy{false, 1, 1, false}, // plain
        CheckpointPolicy{true, 1, 1, false},  // every layer
        CheckpointPolicy{true, 2, 1, false},  // every_n_layers 2
        CheckpointPolicy{true, 1, 2, false},  // segments of 2
        CheckpointPolicy{true, 1, 0, false},  // sqrt segments
        CheckpointPolicy{true, 3, 1, false},  // every 3rd: a kept block after a checkpointed one
        CheckpointPolicy{true, 1, 1, true},   // offload
        CheckpointPolicy{true, 2, 1, true},   // every_n 2 with offload
        CheckpointPolicy{true, 1, 2, true},   // segments of 2 with offload
    };
    return all;
}

std::string describe(const nn::LlamaConfig& config, int batch, int seq_len, DType dtype,
                     const CheckpointPolicy& policy) {
    return config.to_string() + ", B " + std::to_string(batch) + ", T " + std::to_string(seq_len) + ", " +
           dtype_name(dtype) + ", " + policy.to_string();
}

struct Case {
    nn::LlamaConfig config;
    int batch;
    int seq_len;
    DType dtype;
};

// A small vocabulary and a wide MLP: the logits no longer dominate, so the step's joint peak falls inside a
// layer's backward (the MLP's gradients beside its saved set), not at the LM head.
nn::LlamaConfig small_vocabulary_config() {
    nn::LlamaConfig config = test::small_llama_config(false);
    config.vocab_size = 16;
    config.intermediate_size = 192;
    return config;
}

std::vector<Case> cases() {
    nn::LlamaConfig narrow_intermediate = test::small_llama_config(false);
    narrow_intermediate.intermediate_size = 24; // M < A: the backward's high-water moves to the residual add
    nn::LlamaConfig multi_head = test::small_llama_config(true);
    multi_head.num_key_value_heads = multi_head.num_attention_heads; // KVH = NH: plain multi-head attention
    return {
        {test::small_llama_config(false), 2, 33, DType::f32}, // GQA 6/2, untied
        {test::small_llama_config(true), 3, 20, DType::f32},  // tied, T < max_position_embeddings
        {nn::LlamaConfig::named("llama-tiny"), 2, 64, DType::f32},
        {narrow_intermediate, 2, 16, DType::f32},
        {small_vocabulary_config(), 2, 33, DType::f32},
        {multi_head, 1, 33, DType::f32},
        {test::small_llama_config(false), 2, 33, DType::bf16},
        {test::small_llama_config(true), 2, 17, DType::bf16},
        {nn::LlamaConfig::named("llama-tiny"), 1, 64, DType::f64},
    };
}

// Every category of a bare step equals the prediction to the byte.
TEST(MemoryModelLlama, EveryCategoryIsExactToTheByte) {
    std::mt19937_64 generator = fresh_generator();
    for (const Case& shape : cases()) {
        for (const CheckpointPolicy& policy : policies()) {
            const planner::MemoryPrediction predicted = planner::predict_memory(
                shape.config, shape.batch, shape.seq_len, policy, shape.dtype, planner::OptimizerKind::none);
            const Measured measured = measure(shape.config, shape.batch, shape.seq_len, shape.dtype, policy, generator);
            const std::string context = describe(shape.config, shape.batch, shape.seq_len, shape.dtype, policy);
            std::printf("  %-150s activations %8zu / %8zu B  workspace %7zu / %7zu B  (%s)\n", context.c_str(),
                        predicted.of(MemoryCategory::activations), measured.activations,
                        predicted.of(MemoryCategory::workspace), measured.workspace,
                        predicted.activations_peak_moment.c_str());
            EXPECT_EQ(predicted.of(MemoryCategory::parameters), measured.parameters) << context;
            EXPECT_EQ(predicted.of(MemoryCategory::gradients), measured.gradients) << context;
            EXPECT_EQ(predicted.of(MemoryCategory::activations), measured.activations) << context;
            EXPECT_EQ(predicted.of(MemoryCategory::workspace), measured.workspace) << context;
            EXPECT_EQ(predicted.of(MemoryCategory::pinned_host), measured.pinned_host) << context;
        }
    }
}

// With the MLP tiled: every category of a bare step to the byte, for tiles of one row, a few, a last shorter one
// and every row, over the shapes where the MLP's backward, the residual add or the head holds the peak.
TEST(MemoryModelLlama, TiledMlpIsExactToTheByte) {
    std::mt19937_64 generator = fresh_generator();
    nn::LlamaConfig narrow_intermediate = test::small_llama_config(false);
    narrow_intermediate.intermediate_size = 24;
    const std::vector<Case> tiled_cases = {
        {test::small_llama_config(false), 2, 33, DType::f32},
        {test::small_llama_config(true), 2, 17, DType::bf16},
        {small_vocabulary_config(), 2, 33, DType::f32},
        {small_vocabulary_config(), 1, 33, DType::bf16},
        {narrow_intermediate, 2, 16, DType::f32},
    };
    for (const Case& shape : tiled_cases) {
        const int rows = shape.batch * shape.seq_len;
        for (const int tile : {1, 7, 16, rows}) {
            for (const CheckpointPolicy& policy : {policies()[0], policies()[1], policies()[3], policies()[6]}) {
                const planner::MemoryPrediction predicted =
                    planner::predict_memory(shape.config, shape.batch, shape.seq_len, policy, shape.dtype,
                                            planner::OptimizerKind::none, 1, 1, false, GradientOffload::window, false, 0,
                                            tile);
                const Measured measured =
                    measure(shape.config, shape.batch, shape.seq_len, shape.dtype, policy, generator, tile);
                const std::string context = describe(shape.config, shape.batch, shape.seq_len, shape.dtype, policy) +
                                            ", MLP tiles of " + std::to_string(tile);
                std::printf("  %-160s activations %8zu / %8zu B  workspace %7zu / %7zu B  (%s)\n", context.c_str(),
                            predicted.of(MemoryCategory::activations), measured.activations,
                            predicted.of(MemoryCategory::workspace), measured.workspace,
                            predicted.activations_peak_moment.c_str());
                EXPECT_EQ(predicted.of(MemoryCategory::activations), measured.activations) << context;
                EXPECT_EQ(predicted.of(MemoryCategory::workspace), measured.workspace) << context;
                EXPECT_EQ(predicted.of(MemoryCategory::pinned_host), measured.pinned_host) << context;
            }
        }
    }
}

// The joint peak of real optim::Trainer steps (AdamW: the optimizer state is in the figure), and its
// persistent categories, equal the prediction to the byte: plain, every_n_layers 2, checkpointing with
// offload, and bf16 mixed precision, tied and untied, with and without accumulation.
TEST(MemoryModelLlama, TrainerStepPeakIsExactToTheByte) {
    struct Run {
        nn::LlamaConfig config;
        int micro_batch, accumulation, length;
        CheckpointPolicy policy;
        bool bf16;
        int loss_chunk = 0; // the streaming head's chunk (0: the whole logits)
        int mlp_tile = 0;   // the MLP's tile (0: the whole MLP)
    };
    const nn::LlamaConfig untied = test::small_llama_config(false), tied = test::small_llama_config(true);
    const std::vector<Run> runs = {
        {untied, 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false},
        {tied, 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false},
        {untied, 2, 1, 33, CheckpointPolicy{true, 2, 1, false}, false},
        {tied, 1, 3, 33, CheckpointPolicy{true, 2, 1, false}, false},
        {untied, 2, 1, 33, CheckpointPolicy{true, 1, 1, true}, false},
        {tied, 2, 2, 20, CheckpointPolicy{true, 1, 2, true}, false},
        {untied, 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, true},
        {tied, 2, 1, 33, CheckpointPolicy{true, 2, 1, false}, true},
        {untied, 2, 2, 33, CheckpointPolicy{true, 1, 1, true}, true},
        {nn::LlamaConfig::named("llama-tiny"), 2, 1, 64, CheckpointPolicy{true, 1, 0, false}, false},
        {small_vocabulary_config(), 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false},
        {small_vocabulary_config(), 2, 1, 33, CheckpointPolicy{true, 3, 1, false}, false},
        {small_vocabulary_config(), 2, 1, 33, CheckpointPolicy{true, 1, 1, true}, true},
        // The streaming head: chunks with a shorter last one, one chunk of every token, bf16 with accumulation.
        {untied, 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false, 16},
        {tied, 2, 1, 33, CheckpointPolicy{true, 2, 1, false}, false, 66},
        {untied, 2, 2, 33, CheckpointPolicy{true, 1, 1, true}, true, 7},
        {tied, 1, 3, 33, CheckpointPolicy{false, 1, 1, false}, true, 5},
        // The tiled MLP, alone and with the streaming head, plain, checkpointed and offloaded.
        {untied, 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false, 0, 8},
        {small_vocabulary_config(), 2, 1, 33, CheckpointPolicy{false, 1, 1, false}, false, 0, 5},
        {small_vocabulary_config(), 2, 2, 33, CheckpointPolicy{true, 1, 1, true}, true, 0, 16},
        {tied, 2, 1, 33, CheckpointPolicy{true, 2, 1, false}, true, 16, 66},
        {untied, 1, 2, 33, CheckpointPolicy{true, 1, 1, false}, false, 7, 3},
    };
    for (const Run& run : runs) {
        const DType dtype = run.bf16 ? DType::bf16 : DType::f32;
        const planner::MemoryPrediction predicted =
            planner::predict_memory(run.config, run.micro_batch, run.length, run.policy, dtype,
                                    planner::OptimizerKind::adamw, 1, run.accumulation, false,
                                    GradientOffload::window, false, run.loss_chunk, run.mlp_tile);
        const Trained trained = train(run.config, run.micro_batch, run.accumulation, run.length, run.policy, run.bf16, 2,
                                      run.loss_chunk, run.mlp_tile);
        const std::string context = describe(run.config, run.micro_batch, run.length, dtype, run.policy) +
                                    ", accumulation " + std::to_string(run.accumulation) + ", loss chunks " +
                                    std::to_string(run.loss_chunk) + ", MLP tiles " + std::to_string(run.mlp_tile);
        std::printf("  %-160s peak predicted %9zu B, measured %9zu / %9zu B (%s)\n", context.c_str(),
                    predicted.unified_peak_bytes, trained.peaks[0], trained.peaks[1], predicted.peak_moment.c_str());
        for (size_t step = 0; step < trained.peaks.size(); ++step) {
            EXPECT_EQ(trained.peaks[step], predicted.unified_peak_bytes) << context << ", step " << step + 1;
            const MemoryStats& memory = trained.memory[step];
            for (MemoryCategory category :
                 {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer_state})
                EXPECT_EQ(memory.current(category), predicted.of(category))
                    << context << ": " << memory_category_name(category);
        }
    }
}

// Packed documents (nn::Batch::positions): the step's peak is exact with the positions counted beside the ids and
// labels, plain and checkpointed with offload, f32 and bf16, with accumulation.
TEST(MemoryModelLlama, PackedDocumentsStepPeakIsExactToTheByte) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    constexpr int length = 24;
    for (const auto& [policy, bf16, accumulation] : {std::tuple{CheckpointPolicy{false, 1, 1, false}, false, 1},
                                                     std::tuple{CheckpointPolicy{true, 1, 1, true}, true, 2},
                                                     std::tuple{CheckpointPolicy{true, 2, 1, false}, false, 3}}) {
        current_tape().clear();
        const size_t before = memory_stats(Device::cpu).current_bytes;
        nn::Llama model(config, 11, Device::cpu, DType::f32);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = 3;
        trainer_config.shape.gradient_accumulation_steps = accumulation;
        trainer_config.shape.checkpointing = policy;
        trainer_config.learning_rate = 1e-2;
        trainer_config.max_steps = 2;
        trainer_config.shape.precision = bf16 ? Precision::bf16 : Precision::fp32;
        optim::Trainer trainer(model, trainer_config);
        const test::Rows rows = test::packed_test_rows(config.vocab_size);
        const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
            return nn::make_packed_document_batch(rows, length);
        };
        const DType dtype = bf16 ? DType::bf16 : DType::f32;
        const planner::MemoryPrediction predicted =
            planner::predict_memory(config, 3, length, policy, dtype, planner::OptimizerKind::adamw, 1, accumulation,
                                    false, GradientOffload::window, false, 0, 0, true);
        for (int step = 0; step < 2; ++step) {
            const optim::StepResult result = *trainer.train_step(source);
            EXPECT_TRUE(std::isfinite(result.loss));
            EXPECT_EQ(result.memory.peak_bytes - before, predicted.unified_peak_bytes)
                << describe(config, 3, length, dtype, policy) << ", accumulation " << accumulation << ", step " << step;
        }
    }
}

// A token budget per micro-batch (issue 29 item 5): the plan is the worst micro-batch's (nn::largest_batch_shape),
// met to the byte when every micro-batch has that shape, and never passed when they are smaller.
TEST(MemoryModelLlama, TokenBudgetIsPlannedForTheWorstMicroBatch) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    constexpr int rows_cap = 4, length = 24, budget = 48;
    const auto [worst_rows, worst_length] = nn::largest_batch_shape(rows_cap, length, budget);
    ASSERT_EQ(worst_rows * worst_length, 48);
    const planner::MemoryPrediction predicted =
        planner::predict_memory(config, worst_rows, worst_length, CheckpointPolicy{true, 1, 1, false}, DType::f32,
                                planner::OptimizerKind::adamw, 1, 2);
    // Documents (end of text 0) of the given lengths.
    auto documents = [](const std::vector<int>& lengths) {
        std::vector<int32_t> tokens;
        for (int document_length : lengths) {
            for (int index = 0; index + 1 < document_length; ++index) tokens.push_back(1 + index % 90);
            tokens.push_back(0);
        }
        return tokens;
    };
    for (const bool all_worst : {true, false}) {
        // Every document at least T long: each micro-batch is 2 x 24, the worst. Else lengths of 3..30.
        std::vector<int> lengths;
        for (int index = 0; index < 64; ++index) lengths.push_back(all_worst ? 30 : 3 + (index * 7) % 28);
        current_tape().clear();
        const size_t before = memory_stats(Device::cpu).current_bytes;
        nn::Llama model(config, 11, Device::cpu, DType::f32);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = rows_cap;
        trainer_config.shape.gradient_accumulation_steps = 2;
        trainer_config.shape.checkpointing = CheckpointPolicy{true, 1, 1, false};
        trainer_config.learning_rate = 1e-2;
        trainer_config.max_steps = 3;
        optim::Trainer trainer(model, trainer_config);
        nn::DataLoaderOptions options;
        options.batch_size = rows_cap;
        options.sequence_length = length;
        options.layout = nn::DataLayout::padded;
        options.end_of_text = 0;
        options.max_tokens = budget;
        nn::DataLoader loader(documents(lengths), options);
        const nn::BatchSource source = loader.source();
        for (int step = 0; step < 3; ++step) {
            const optim::StepResult result = *trainer.train_step(source);
            const size_t peak = result.memory.peak_bytes - before;
            if (all_worst)
                EXPECT_EQ(peak, predicted.unified_peak_bytes) << "step " << step;
            else
                EXPECT_LE(peak, predicted.unified_peak_bytes) << "step " << step;
            std::printf("  token budget %d, %s: step %d peak %zu B, planned %zu B\n", budget,
                        all_worst ? "every micro-batch the worst" : "documents of 3..30 tokens", step, peak,
                        predicted.unified_peak_bytes);
        }
    }
}

TEST(MemoryModelLlama, ParametersAndRopeTables) {
    // SmolLM-135M's published size, tied head.
    const nn::LlamaConfig smollm = nn::LlamaConfig::named("smollm-135m");
    EXPECT_EQ(planner::parameter_count(smollm, smollm.vocab_size), 134515008u);
    nn::LlamaConfig untied = smollm;
    untied.tie_word_embeddings = false;
    EXPECT_EQ(planner::parameter_count(untied, untied.vocab_size),
              134515008u + size_t(smollm.vocab_size) * smollm.hidden_size);
    EXPECT_THROW(planner::parameter_count(smollm, smollm.vocab_size + 1), EngineError); // Llama pads nothing
    // The RoPE tables: cos and sin (2048, 32) f32 = 512 KiB, under parameters, no gradient, no optimizer state.
    const auto f32 = planner::predict_memory(smollm, 1, 2048, CheckpointPolicy{}, DType::f32);
    const auto bf16 = planner::predict_memory(smollm, 1, 2048, CheckpointPolicy{}, DType::bf16);
    EXPECT_EQ(f32.constant_buffers, size_t(2) * 2048 * 32 * 4);
    EXPECT_EQ(bf16.constant_buffers, f32.constant_buffers); // f32 tables for bf16 activations
    EXPECT_EQ(f32.of(MemoryCategory::parameters), 134515008u * 4 + f32.constant_buffers);
    EXPECT_EQ(f32.of(MemoryCategory::gradients), 134515008u * 4);
    EXPECT_EQ(f32.of(MemoryCategory::optimizer_state), 2 * 134515008u * 4);
    EXPECT_EQ(bf16.of(MemoryCategory::parameters), 134515008u * 6 + f32.constant_buffers);
    // seq_len beyond the tables is refused, as the model refuses it.
    EXPECT_THROW(planner::predict_memory(smollm, 1, 2049, CheckpointPolicy{}), EngineError);
}

// The cost model's FLOPs against the shapes counted independently: every projection is 2 N in out, the head
// 2 N C V, causal attention 2 B T (T+1) C per layer; backward twice the GEMMs and 2.5 times attention.
TEST(MemoryModelLlama, CostModelCountsGroupedQueryAndSwiGluFlops) {
    const nn::LlamaConfig config = nn::LlamaConfig::named("smollm-135m");
    const int batch = 2, length = 512;
    const double rows = double(batch) * length, C = config.hidden_size, L = config.num_hidden_layers;
    const double projections = C * C + C * 192 + C * 192 + C * C + 3 * C * 1536; // q, k, v, o (KVH 3 x D 64), MLP
    const double gemm = L * 2 * rows * projections + 2 * rows * C * config.vocab_size;
    const double attention = L * 2.0 * batch * length * (length + 1.0) * C;
    const planner::StepCost cost =
        planner::predict_cost(config, batch, 1, length, CheckpointPolicy{}, DType::f32, planner::OptimizerKind::adamw,
                              1, planner::cuda_ceilings(DType::f32));
    EXPECT_DOUBLE_EQ(cost.forward_flops, gemm + attention);
    EXPECT_DOUBLE_EQ(cost.backward_flops, 2 * gemm + 2.5 * attention);
    EXPECT_DOUBLE_EQ(cost.recompute_flops, 0.0);
    const planner::StepCost checkpointed =
        planner::predict_cost(config, batch, 1, length, CheckpointPolicy{true, 1, 1, false}, DType::f32,
                              planner::OptimizerKind::adamw, 1, planner::cuda_ceilings(DType::f32));
    EXPECT_DOUBLE_EQ(checkpointed.recompute_flops, gemm + attention - 2 * rows * C * config.vocab_size);
    EXPECT_GT(checkpointed.seconds, cost.seconds);
}

TEST(MemoryModelLlama, PlanReportNamesTheRopeTablesAndThePolicy) {
    const nn::LlamaConfig config = nn::LlamaConfig::named("smollm-135m");
    const std::string report = planner::plan_report(config, 1, 2048, CheckpointPolicy{true, 1, 1, true}, DType::bf16);
    for (const char* fragment : {"llama", "RoPE", "[block 30 CP]", "30 segments", "pinned_host", "not padded",
                                 "bf16 working copies", "step peak"})
        EXPECT_NE(report.find(fragment), std::string::npos) << "report lacks '" << fragment << "':\n" << report;
}

// The planner on a Llama config: every budget's chosen plan fits its prediction; for a small budget (the
// smallest feasible, and one between it and the fastest plan's peak) a trained step's measured peak equals
// the plan's prediction and stays within the budget.
TEST(PlannerLlama, ChoosesAPlanThatFitsAndIsExactWhenTrained) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    constexpr int global_batch = 4;
    planner::PlannerOptions options;
    options.ceilings = planner::cpu_ceilings();
    options.precisions = {Precision::fp32, Precision::bf16};
    const planner::PlanSearch everything = planner::search_plans(config, SIZE_MAX, global_batch, options);
    ASSERT_TRUE(everything.chosen.has_value());
    const size_t smallest = everything.plans[everything.smallest].peak_bytes;
    const size_t fastest = everything.plans.front().peak_bytes;
    ASSERT_LT(smallest, fastest);
    for (size_t budget : {smallest, (smallest + fastest) / 2, fastest}) {
        const planner::Plan plan = planner::plan_for_budget(config, budget, global_batch, options);
        EXPECT_LE(plan.peak_bytes, budget);
        EXPECT_EQ(plan.shape.per_device_train_batch_size * plan.shape.gradient_accumulation_steps, global_batch);
        const Trained trained = train(config, plan.shape.per_device_train_batch_size, plan.shape.gradient_accumulation_steps, config.max_position_embeddings,
                                      plan.shape.checkpointing, plan.shape.precision == Precision::bf16, 2,
                                      plan.shape.loss_chunk_tokens, plan.shape.mlp_tile_tokens);
        std::printf("  budget %9zu B -> %-50s predicted %8zu B, measured %8zu / %8zu B\n", budget,
                    plan.summary().c_str(), plan.peak_bytes, trained.peaks[0], trained.peaks[1]);
        for (size_t peak : trained.peaks) {
            EXPECT_EQ(peak, plan.peak_bytes) << plan.flags();
            EXPECT_LE(peak, budget) << plan.flags();
        }
    }
    EXPECT_THROW(planner::plan_for_budget(config, smallest - 1, global_batch, options), planner::NoPlanFits);
    const std::string table = planner::plan_table(everything, config);
    EXPECT_NE(table.find("llama"), std::string::npos) << table;
}

} // namespace
} // namespace engine::testing
