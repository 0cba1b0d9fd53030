// ZeRO's token table and LM head (docs/DISTRIBUTED.md, "The token table and the head at stage 3"): at stages 2 and 3 an
// untied Llama's embed_tokens and lm_head have their gradients given storage for their backward only and reduced onto
// the owners as it ends, and at stage 3 their weights are released between their uses like the checkpointed layers',
// gathered for the lookup and for the loss. Over a one-rank communicator (real shards, gathers, reduces and released
// storage over one part) stage 3 against stage 2 and both against the memory model; the multi-rank runs are
// tests/cli/train_gpt_zero3.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/elementwise.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "llama_step.h"
#include "nn/io/token_data.h"
#include "nn/llama.h"
#include "optim/trainer.h"
#include "planner/cost_model.h"
#include "planner/memory_model.h"
#include "zero_runs.h"

namespace engine::testing {
namespace {

optim::TrainerConfig stage_config(int stage, int accumulation, Precision precision, int loss_chunk_tokens) {
    optim::TrainerConfig config = zero_stage_config(stage, accumulation, precision);
    config.shape.loss_chunk_tokens = loss_chunk_tokens;
    return config;
}

std::vector<Tensor> tables_of(nn::Llama& model) { // the token table, and an untied head
    if (!model.lm_head) return {model.model.embed_tokens.weight};
    return {model.model.embed_tokens.weight, model.lm_head->weight};
}

// Stage 3 trains bitwise as stage 2 (f32 and bf16, one and three micro-batches a step, the fused classifier and the
// streaming head), evaluates to the same loss, and peaks where the memory model says, in the step and in the
// evaluation; between uses the two tables hold no weights and no gradient storage.
TEST(ZeroStage3Tables, ALlamaShardsItsTableAndHeadBitwiseAsStageTwoAndAsPredicted) {
    const std::vector<int32_t> tokens = documents(80);
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    for (const bool tied : {false, true})
    for (const Precision precision : {Precision::fp32, Precision::bf16})
        for (const int accumulation : {1, 3})
            for (const int chunk : {0, 5}) {
                const nn::LlamaConfig config = test::small_llama_config(tied);
                const std::string what = std::string(tied ? "tied, " : "untied, ") + dtype_name(precision_dtype(precision)) + ", " +
                                         std::to_string(accumulation) + " micro-batches, loss chunk " + std::to_string(chunk);
                std::vector<std::vector<float>> weights[2];
                std::vector<std::string> names;
                for (const auto& [name, parameter] : nn::Llama(config, 3, Device::cpu, DType::f32).named_parameters())
                    names.push_back(name);
                std::vector<double> losses[2], evaluations[2];
                size_t peaks[2] = {0, 0}, evaluation_peaks[2] = {0, 0};
                for (int stage3 = 0; stage3 < 2; ++stage3) {
                    const auto communicator = distributed::make_communicator(distributed::Backend::none);
                    nn::Llama model(config, 3, Device::cpu, DType::f32);
                    optim::Trainer trainer(model, stage_config(stage3 ? 3 : 2, accumulation, precision, chunk),
                                           communicator.get());
                    nn::DataLoader loader(tokens, padded_options(2));
                    nn::DataLoader evaluation_loader(tokens, padded_options(2));
                    for (int step = 0; step < 3; ++step) {
                        const optim::StepResult result = *trainer.train_step(loader.source());
                        losses[stage3].push_back(result.loss);
                        peaks[stage3] = std::max(peaks[stage3], result.memory.peak_bytes);
                        // One broadcast per tensor: the 4 layers' 9 for each of their 2 uses a micro-batch, the two
                        // tables once a micro-batch (a tied one twice), and the final norm kept whole after the update.
                        if (stage3) EXPECT_EQ(result.communication.broadcasts, (72 + 2) * accumulation + 1) << what;
                        for (const Tensor& table : tables_of(model)) {
                            EXPECT_EQ(table.storage_released(), stage3 == 1) << what;
                            ASSERT_TRUE(table.grad().defined()) << what;
                            EXPECT_TRUE(table.grad().storage_released()) << what; // at stage 2 too
                        }
                    }
                    const nn::BatchSource evaluation_source = evaluation_loader.source();
                    std::vector<nn::Batch> evaluation_batches = {*evaluation_source(), *evaluation_source()};
                    reset_peak(Device::cpu);
                    evaluations[stage3].push_back(trainer.evaluate(evaluation_batches).loss);
                    evaluation_peaks[stage3] = memory_stats(Device::cpu).peak_bytes;
                    if (stage3)
                        for (const Tensor& table : tables_of(model)) EXPECT_TRUE(table.storage_released()) << what;
                    {
                        const optim::WholeParameters whole(trainer);
                        weights[stage3] = parameter_values(model);
                    }
                }
                // Both stages give the tables a fresh gradient buffer each micro-batch and add it into the shard, so
                // even the streaming head (which adds each chunk's head gradient into the buffer) agrees bit for bit.
                EXPECT_EQ(losses[0], losses[1]) << what;
                EXPECT_EQ(evaluations[0], evaluations[1]) << what;
                for (size_t index = 0; index < weights[0].size(); ++index)
                    EXPECT_TRUE(weights[0][index] == weights[1][index]) << what << ": " << names[index] << " differs";
                const DType dtype = precision_dtype(precision);
                const auto predict = [&](bool stage3) {
                    return planner::predict_memory(config, 2, 8, every_layer, dtype, planner::OptimizerKind::adamw,
                                                   ZeroSharding{1, true, stage3}, accumulation, false,
                                                   GradientOffload::window, false, chunk);
                };
                const planner::MemoryPrediction stage2 = predict(false), stage3 = predict(true);
                EXPECT_EQ(peaks[0], stage2.peak_bytes) << what;
                EXPECT_EQ(peaks[1], stage3.peak_bytes) << what << ": predicted at " << stage3.peak_moment;
                const size_t table = static_cast<size_t>(config.vocab_size) * config.hidden_size;
                EXPECT_EQ(stage3.gathered_table_bytes, table * dtype_size(dtype));
                EXPECT_EQ(stage3.table_gradient_bytes, table * sizeof(float));
                // On one rank the part is everything: the shard holds the tables' masters.
                EXPECT_EQ(stage3.shard_parameter_bytes,
                          (4 * planner::layer_parameter_count(config) + (tied ? 1 : 2) * table) * sizeof(float));
                // The evaluation: the state between steps, its batches and the current one's copies, and the walk
                // (each table gathered for its use).
                const auto evaluation = [&](bool sharded) {
                    return planner::predict_evaluation_memory(config, 2, 8, every_layer, dtype,
                                                              planner::OptimizerKind::adamw, ZeroSharding{1, true, sharded},
                                                              false, GradientOffload::window, false, 2, chunk, 0, false, {});
                };
                EXPECT_EQ(evaluation_peaks[0], evaluation(false).peak_bytes) << what;
                EXPECT_EQ(evaluation_peaks[1], evaluation(true).peak_bytes) << what << ": predicted at "
                                                                              << evaluation(true).moment;
            }
}

// A step that runs out of memory anywhere (a table's gather, its gradient storage at the head or at the lookup's
// backward, the segments') leaves the tables and the layers released, the tables' gradient storage too, and the
// shards as they were: the trainer then trains on bitwise as one that never failed.
TEST(ZeroStage3Tables, AStepThatRunsOutOfMemoryPartWayChangesNothing) {
    for (const bool tied : {false, true})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
        const int failures = out_of_memory_sweep(
            [tied] { return std::make_unique<nn::Llama>(test::small_llama_config(tied), 3, Device::cpu, DType::f32); },
            stage_config(3, 2, precision, 0), [](nn::CausalLM& model, int failures) {
                for (const Tensor& table : tables_of(dynamic_cast<nn::Llama&>(model))) {
                    EXPECT_TRUE(table.storage_released()) << "after failure " << failures;
                    EXPECT_TRUE(table.grad().storage_released()) << "after failure " << failures;
                }
                for (int layer = 0; layer < model.block_count(); ++layer)
                    for (const Tensor& parameter : model.block(layer).parameters())
                        EXPECT_TRUE(parameter.storage_released()) << "layer " << layer << " after failure " << failures;
            });
        EXPECT_GT(failures, 10) << "the limits should fail the step at many places";
        std::printf("  %s, %s: %d steps failed and changed nothing\n", tied ? "tied" : "untied",
                    dtype_name(precision_dtype(precision)), failures);
    }
}

// What makes the token table's per-micro-batch reduction bitwise the accumulated buffer: the lookup's backward sums each
// table row's terms from zero and adds the sum once, so a buffer holding g receives g + (this micro-batch's sum), the
// value a fresh buffer reduced into a running g gives. Tokens repeat (a row gets several terms), in both dtypes.
TEST(ZeroStage3Tables, TheLookupsBackwardAddsEachRowsSumOnce) {
    const int B = 2, T = 6, C = 5, V = 4;
    const std::vector<int32_t> tokens = {1, 3, 1, 1, 0, 3, 2, 1, 1, 0, 3, 1};
    std::vector<float> dout(B * T * C), held(V * C);
    for (size_t index = 0; index < dout.size(); ++index) dout[index] = std::sin(0.7f * index) * 1e-3f + 0.1f * (index % 3);
    for (size_t index = 0; index < held.size(); ++index) held[index] = std::cos(1.3f * index) * 3.0f;
    std::vector<float> accumulated = held, fresh(V * C, 0.0f);
    kernels::cpu::embedding_backward<float>(accumulated.data(), nullptr, dout.data(), tokens.data(), nullptr, B, T, C);
    kernels::cpu::embedding_backward<float>(fresh.data(), nullptr, dout.data(), tokens.data(), nullptr, B, T, C);
    for (size_t index = 0; index < held.size(); ++index) EXPECT_EQ(accumulated[index], held[index] + fresh[index]) << index;
    std::vector<bfloat16> narrow_dout(dout.size());
    for (size_t index = 0; index < dout.size(); ++index) narrow_dout[index] = to_bfloat16(dout[index]);
    accumulated = held;
    std::fill(fresh.begin(), fresh.end(), 0.0f);
    kernels::cpu::embedding_backward<bfloat16>(accumulated.data(), nullptr, narrow_dout.data(), tokens.data(), nullptr, B, T, C);
    kernels::cpu::embedding_backward<bfloat16>(fresh.data(), nullptr, narrow_dout.data(), tokens.data(), nullptr, B, T, C);
    for (size_t index = 0; index < held.size(); ++index) EXPECT_EQ(accumulated[index], held[index] + fresh[index]) << index;
}

// The collectives' cost: the tables' gradients reduced once per micro-batch instead of once a step (stages 2 and 3), and
// at stage 3 each table broadcast once per micro-batch instead of once after the update.
TEST(ZeroStage3Tables, CostModelMovesTheTablesCollectivesIntoTheMicroBatches) {
    const nn::LlamaConfig config = test::small_llama_config(false);
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const double table = static_cast<double>(config.vocab_size) * config.hidden_size;
    for (int accumulation : {1, 4})
        for (int element : {2, 4}) {
            const auto cost = [&](int stage, size_t table_elements) {
                planner::StepCost out;
                planner::add_communication(out, config, accumulation, every_layer, stage, 8, planner::cpu_ceilings(),
                                           element, table_elements);
                return out;
            };
            const size_t elements = static_cast<size_t>(table);
            EXPECT_DOUBLE_EQ(cost(2, elements).communicated_bytes - cost(2, 0).communicated_bytes,
                             (accumulation - 1) * 2 * table * 4);
            EXPECT_DOUBLE_EQ(cost(3, elements).communicated_bytes - cost(3, 0).communicated_bytes,
                             (accumulation - 1) * 2 * table * 4 + accumulation * 2 * table * element - 2 * table * 4);
            EXPECT_GE(cost(3, elements).collectives, cost(3, 0).collectives);
        }
}

// The rule the planner shares with the trainer, and what the trainer leaves: a tied table is sharded too (read by the
// lookup and by the head, its gradient held from the head's backward to the end); with the model state on the host and
// at stage 1 the tables stay whole. An untied one's gradient buffers get their storage back when the trainer goes (its
// weights stay released, as the layers' do: their values went with the shards). The hooks run inside the model's own
// forward: a ModuleTrainer with a loss of its own and a sampled forward between steps need nothing else.
TEST(ZeroStage3Tables, TheRuleAndWhatTheTrainerLeaves) {
    const std::vector<int32_t> tokens = documents(40);
    const nn::LlamaConfig config = test::small_llama_config(false);
    const size_t table = static_cast<size_t>(config.vocab_size) * config.hidden_size;
    EXPECT_EQ(planner::sharded_table_elements(config, ZeroSharding{2, true, true}, false), table);
    EXPECT_EQ(planner::sharded_table_elements(config, ZeroSharding{2, true, true}, true), 0u); // state on the host
    EXPECT_EQ(planner::sharded_table_elements(config, ZeroSharding{2, true, false}, false), table); // the gradients
    EXPECT_EQ(planner::sharded_table_elements(config, ZeroSharding{2}, false), 0u);                 // stage 1
    EXPECT_EQ(planner::sharded_table_elements(test::small_llama_config(true), ZeroSharding{2, true, true}, false), table);
    EXPECT_EQ(planner::sharded_table_elements(nn::GPTConfig::named("tiny"), ZeroSharding{2, true, true}, false), 0u);
    nn::Llama untied(config, 3, Device::cpu, DType::f32);
    {
        const auto communicator = distributed::make_communicator(distributed::Backend::none);
        optim::Trainer trainer(untied, stage_config(3, 1, Precision::fp32, 0), communicator.get());
        nn::DataLoader loader(tokens, padded_options(2));
        ASSERT_TRUE(trainer.train_step(loader.source()).has_value());
        // Outside a step a read of the table names it.
        expect_error([&] { (void)untied.model.embed_tokens.weight.raw_data(); }, {"embed_tokens", "released"});
    }
    for (const Tensor& table_weight : tables_of(untied)) {
        EXPECT_TRUE(table_weight.storage_released());
        EXPECT_FALSE(table_weight.grad().storage_released());
        EXPECT_TRUE(all_finite(table_weight.grad()));
    }
    // A ModuleTrainer with a loss of its own: the head hooks run inside the model's forward, so its head is gathered
    // and its gradient given and reduced as Trainer's; it trains as Trainer does with the same loss through logits.
    const Tensor inputs = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1}, {2, 8}, Device::cpu);
    const Tensor targets = Tensor::from_vector<int32_t>({2, 3, 4, 5, 6, 7, 8, 9, 7, 6, 5, 4, 3, 2, 1, 9}, {2, 8}, Device::cpu);
    std::vector<std::vector<float>> weights[2];
    std::vector<float> sampled[2];
    for (int generic = 0; generic < 2; ++generic) {
        nn::Llama model(config, 3, Device::cpu, DType::f32);
        const auto communicator = distributed::make_communicator(distributed::Backend::none);
        const optim::TrainerConfig trainer_config = stage_config(3, 1, Precision::fp32, 0);
        std::unique_ptr<optim::ModuleTrainer> trainer;
        if (generic) {
            trainer = std::make_unique<optim::ModuleTrainer>(model, trainer_config, communicator.get());
        } else {
            auto causal = std::make_unique<optim::Trainer>(model, trainer_config, communicator.get());
            causal->set_loss_function([&](const Tensor& logits, const nn::Batch&) {
                return optim::LossSum{cross_entropy(logits, targets, Reduction::sum), 16};
            }, optim::TargetCounting::all_labels);
            trainer = std::move(causal);
        }
        for (int step = 0; step < 2; ++step) {
            if (generic) {
                optim::MicroBatch micro;
                micro.items = 16;
                micro.loss = [&](const optim::LossScale&) {
                    return optim::LossSum{cross_entropy(model.forward(inputs), targets, Reduction::sum), 16};
                };
                trainer->apply_update(trainer->accumulate({micro}));
            } else {
                nn::Batch batch;
                batch.inputs = inputs;
                batch.labels = targets;
                ASSERT_TRUE(dynamic_cast<optim::Trainer&>(*trainer).train_step([&, done = false]() mutable -> std::optional<nn::Batch> {
                    if (done) return std::nullopt;
                    done = true;
                    return batch;
                }).has_value());
            }
            for (const Tensor& table_weight : tables_of(model)) EXPECT_TRUE(table_weight.storage_released());
        }
        // Sampling between steps: a no-grad forward gathers what it reads and lets it go again, and gives the logits a
        // forward inside WholeParameters gives (there the hooks leave the gathered weights as they are).
        {
            const NoGradGuard no_grad;
            sampled[generic] = model.forward(inputs).to_vector<float>();
        }
        for (const Tensor& table_weight : tables_of(model)) EXPECT_TRUE(table_weight.storage_released());
        const optim::WholeParameters whole(*trainer);
        {
            const NoGradGuard no_grad;
            EXPECT_EQ(model.forward(inputs).to_vector<float>(), sampled[generic]);
        }
        for (const Tensor& table_weight : tables_of(model)) EXPECT_FALSE(table_weight.storage_released());
        weights[generic] = parameter_values(model);
    }
    EXPECT_EQ(weights[0], weights[1]);
    EXPECT_EQ(sampled[0], sampled[1]);
}

} // namespace
} // namespace engine::testing
