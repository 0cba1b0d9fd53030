// ZeRO stage 3 without a launcher (docs/DISTRIBUTED.md, "ZeRO stage 3"): released storage and what reading it does,
// a layer's weights released and gathered with their working copies, the trainer at stage 3 over a one-rank
// communicator (its shards, gathers and released layers are real, over one part) against stage 2 and the memory
// model, a training state saved from and restored into the shards, and the rules and costs the planner knows. The
// multi-rank runs are tests/cli/train_gpt_zero3.sh (label mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "expect_error.h"
#include "nn/io/token_data.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "planner/cost_model.h"
#include "planner/memory_model.h"
#include "zero_runs.h"

namespace engine::testing {
namespace {

size_t current(MemoryCategory category) {
    return memory_stats(Device::cpu).current_by_category[static_cast<int>(category)];
}

const nn::GPTConfig tiny_gpt{16, 8, 3, 2, 8, 0.0f};

optim::TrainerConfig stage_config(int stage, int accumulation, Precision precision) {
    return zero_stage_config(stage, accumulation, precision);
}

std::vector<std::vector<float>> values_of(const nn::Module& model) { return parameter_values(model); }

// Released storage holds no bytes; reading it throws naming the tensor; views over one storage stay views over one
// released storage and then over one fresh one; allocation brings back the bytes, uninitialised, and changes nothing
// for tensors that were not released.
TEST(ZeroStage3, ReleasedStorageThrowsNamingTheTensorAndComesBackFresh) {
    Tensor weight = Tensor::full({4, 3}, 1.5, DType::f32, Device::cpu, MemoryCategory::parameters);
    weight.set_name("h.1.mlp.c_fc.weight");
    const Tensor rows = weight.with_rows(2); // a view over the same storage
    const Tensor other = Tensor::full({5}, 2.0, DType::f32, Device::cpu, MemoryCategory::parameters);
    const size_t before = current(MemoryCategory::parameters);
    release_storage({weight, rows});
    EXPECT_TRUE(weight.storage_released());
    EXPECT_TRUE(rows.storage_released());
    EXPECT_TRUE(weight.shares_storage_with(rows));
    EXPECT_EQ(current(MemoryCategory::parameters), before - 12 * sizeof(float));
    expect_error([&] { (void)weight.raw_data(); }, {"h.1.mlp.c_fc.weight", "released", "ZeRO-3"});
    expect_error([&] { (void)weight.to_vector<float>(); }, {"h.1.mlp.c_fc.weight", "released"});
    release_storage({weight}); // released already: nothing
    allocate_storage({weight, rows, other});
    EXPECT_FALSE(weight.storage_released());
    EXPECT_TRUE(weight.shares_storage_with(rows));
    EXPECT_EQ(current(MemoryCategory::parameters), before);
    EXPECT_EQ(other.to_vector<float>(), std::vector<float>(5, 2.0f)) << "a tensor with storage is left as it is";
    weight.copy_from(Tensor::full({4, 3}, 0.25, DType::f32, Device::cpu));
    EXPECT_EQ(rows.to_vector<float>(), std::vector<float>(6, 0.25f));
}

// A layer's trainable parameters go with their bf16 working copies (Module::release_parameter_storage) and come back
// (allocate_parameter_storage); written and refreshed, the model computes what it did before.
TEST(ZeroStage3, ModuleReleasesAndGathersALayerWithItsWorkingCopies) {
    for (const DType compute : {DType::f32, DType::bf16}) {
        nn::GPT model(tiny_gpt, 3, Device::cpu, DType::f32);
        if (compute == DType::bf16) model.set_compute_dtype(DType::bf16);
        const Tensor tokens = Tensor::from_vector<int32_t>({1, 2, 3, 4}, {1, 4}, Device::cpu);
        const auto forward = [&] {
            NoGradGuard no_grad;
            const Tensor logits = model.forward(tokens);
            const Tensor wide = Tensor::empty(logits.shape(), DType::f32, Device::cpu);
            convert_into(wide, logits);
            return wide.to_vector<float>();
        };
        const std::vector<float> logits = forward();
        nn::Module& layer = model.block(1);
        const std::vector<std::vector<float>> saved = values_of(layer);
        const size_t before = current(MemoryCategory::parameters);
        layer.release_parameter_storage();
        const size_t layer_bytes = planner::layer_parameter_count(tiny_gpt) * (compute == DType::bf16 ? 6 : 4);
        EXPECT_EQ(current(MemoryCategory::parameters), before - layer_bytes) << dtype_name(compute);
        for (const Tensor& parameter : layer.parameters()) EXPECT_TRUE(parameter.storage_released());
        for (const Tensor& parameter : model.block(0).parameters()) EXPECT_FALSE(parameter.storage_released());
        model.refresh_working_copies(); // passes over the released masters
        {
            NoGradGuard no_grad;
            expect_error([&] { model.forward(tokens); }, {"released", "ZeRO-3"});
        }
        layer.allocate_parameter_storage();
        EXPECT_EQ(current(MemoryCategory::parameters), before);
        std::vector<Tensor> parameters = layer.parameters();
        for (size_t index = 0; index < parameters.size(); ++index)
            parameters[index].copy_from(Tensor::from_vector<float>(saved[index], parameters[index].shape(), Device::cpu));
        layer.refresh_working_copies();
        EXPECT_EQ(forward(), logits) << dtype_name(compute);
    }
}

// The trainer at stage 3 over a one-rank communicator: the segments' layers hold no weights between their uses, the
// optimizer updates their masters in the shard, and each segment is gathered for its forward and its recompute. The
// sums are stage 2's, so it trains bitwise as stage 2 (with one and with three micro-batches a step, f32 and bf16),
// with the step peak the memory model predicts, and with the gathers counted as predicted.
TEST(ZeroStage3, OneRankTrainsBitwiseAsStageTwoAndAsPredicted) {
    const std::vector<int32_t> tokens = documents(80);
    for (const Precision precision : {Precision::fp32, Precision::bf16})
        for (int accumulation : {1, 3}) {
            std::vector<std::vector<float>> weights[2];
            std::vector<double> losses[2];
            size_t peaks[2] = {0, 0};
            for (int stage3 = 0; stage3 < 2; ++stage3) {
                const auto communicator = distributed::make_communicator(distributed::Backend::none);
                nn::GPT model(tiny_gpt, 3, Device::cpu, DType::f32);
                optim::Trainer trainer(model, stage_config(stage3 ? 3 : 2, accumulation, precision), communicator.get());
                if (stage3) {
                    for (const Tensor& parameter : model.block(2).parameters()) EXPECT_TRUE(parameter.storage_released());
                    // Reading one outside a step names it, dotted.
                    expect_error([&] { (void)model.block(2).parameters().front().raw_data(); },
                                 {"h.2.", "released", "WholeParameters"});
                }
                nn::DataLoader loader(tokens, padded_options(2));
                for (int step = 0; step < 4; ++step) {
                    const optim::StepResult result = *trainer.train_step(loader.source());
                    losses[stage3].push_back(result.loss);
                    peaks[stage3] = std::max(peaks[stage3], result.memory.peak_bytes);
                    // One broadcast per tensor: a segment's 12 for each of its 2 uses a micro-batch (3 segments),
                    // and the 4 kept whole (wte, wpe, ln_f's weight and bias) after the update.
                    if (stage3) EXPECT_EQ(result.communication.broadcasts, 72 * accumulation + 4);
                }
                {
                    const optim::WholeParameters whole(trainer);
                    weights[stage3] = values_of(model);
                }
                if (stage3)
                    for (const Tensor& parameter : model.block(0).parameters()) EXPECT_TRUE(parameter.storage_released());
            }
            EXPECT_EQ(losses[0], losses[1]) << accumulation << " micro-batches";
            EXPECT_EQ(weights[0], weights[1]) << accumulation << " micro-batches";
            const checkpoint::CheckpointPolicy every_layer{true, 1};
            const DType dtype = precision_dtype(precision);
            const planner::MemoryPrediction stage2 = planner::predict_memory(
                tiny_gpt, 2, 8, every_layer, dtype, planner::OptimizerKind::adamw, ZeroSharding{1, true}, accumulation);
            const planner::MemoryPrediction stage3 = planner::predict_memory(
                tiny_gpt, 2, 8, every_layer, dtype, planner::OptimizerKind::adamw, ZeroSharding{1, true, true}, accumulation);
            EXPECT_EQ(peaks[0], stage2.peak_bytes);
            EXPECT_EQ(peaks[1], stage3.peak_bytes) << dtype_name(dtype) << ", " << accumulation << " micro-batches";
            // On one rank the part is everything: the shard holds every layer's masters, and a segment is gathered
            // besides, so in f32 stage 3 saves nothing there (its peak is stage 2's where that comes outside the
            // segments: at the loss head); under bf16 only the segment's bf16 copies come, and the other layers'
            // copies are gone, so it peaks lower even on one rank.
            EXPECT_EQ(stage3.shard_parameter_bytes, 3 * planner::layer_parameter_count(tiny_gpt) * sizeof(float));
            if (precision == Precision::fp32) EXPECT_GE(stage3.peak_bytes, stage2.peak_bytes);
            else EXPECT_LT(stage3.peak_bytes, stage2.peak_bytes);
        }
}

// A training state saved at stage 3 holds the whole model (each released parameter gathered from the shards as it
// is written), the same file stage 2 writes at the same step; restored into a stage-3 trainer it goes into the
// shards, and the resumed run ends bitwise where the straight one does.
TEST(ZeroStage3, TrainingStateIsSavedFromAndRestoredIntoTheShards) {
    const std::vector<int32_t> tokens = documents(80);
    const auto run = [&](optim::Trainer& trainer, nn::DataLoader& loader, int steps) {
        for (int step = 0; step < steps; ++step) trainer.train_step(loader.source());
    };
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    nn::GPT straight_model(tiny_gpt, 3, Device::cpu, DType::f32);
    optim::Trainer straight(straight_model, stage_config(3, 2, Precision::fp32), communicator.get());
    nn::DataLoader straight_loader(tokens, padded_options(2));
    run(straight, straight_loader, 4);

    nn::GPT first_model(tiny_gpt, 3, Device::cpu, DType::f32);
    optim::Trainer first(first_model, stage_config(3, 2, Precision::fp32), communicator.get());
    nn::DataLoader first_loader(tokens, padded_options(2));
    run(first, first_loader, 2);
    const io::TrainingState state = optim::capture_training_state(first, &first_loader);
    // Stage 2 at the same step writes the same tensors.
    nn::GPT stage2_model(tiny_gpt, 3, Device::cpu, DType::f32);
    optim::Trainer stage2(stage2_model, stage_config(2, 2, Precision::fp32), communicator.get());
    nn::DataLoader stage2_loader(tokens, padded_options(2));
    run(stage2, stage2_loader, 2);
    const io::TrainingState stage2_state = optim::capture_training_state(stage2, &stage2_loader);
    ASSERT_EQ(state.tensors.size(), stage2_state.tensors.size());
    for (size_t index = 0; index < state.tensors.size(); ++index)
        EXPECT_EQ(state.tensors[index].data, stage2_state.tensors[index].data) << state.tensors[index].name;

    nn::GPT resumed_model(tiny_gpt, 11, Device::cpu, DType::f32); // another seed: every value comes from the state
    optim::Trainer resumed(resumed_model, stage_config(3, 2, Precision::fp32), communicator.get());
    nn::DataLoader resumed_loader(tokens, padded_options(2));
    optim::restore_training_state(state, resumed, &resumed_loader);
    for (const Tensor& parameter : resumed_model.block(1).parameters()) EXPECT_TRUE(parameter.storage_released());
    run(resumed, resumed_loader, 2);
    const optim::WholeParameters whole_straight(straight);
    const optim::WholeParameters whole_resumed(resumed);
    EXPECT_EQ(values_of(resumed_model), values_of(straight_model));
}

// WholeParameters gives the released layers their values for a scope and takes them away after; `written` keeps
// what the scope wrote (into the shard), which the next forward then reads.
TEST(ZeroStage3, WholeParametersKeepsWhatWasWrittenOnlyWhenTold) {
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    nn::GPT model(tiny_gpt, 3, Device::cpu, DType::f32);
    optim::Trainer trainer(model, stage_config(3, 1, Precision::fp32), communicator.get());
    Tensor weight = model.block(1).parameters().front();
    std::vector<float> original;
    {
        const optim::WholeParameters whole(trainer);
        original = weight.to_vector<float>();
        weight.copy_from(Tensor::full(weight.shape(), 0.5, DType::f32, Device::cpu)); // not kept
    }
    EXPECT_TRUE(weight.storage_released());
    {
        const optim::WholeParameters whole(trainer, true);
        EXPECT_EQ(weight.to_vector<float>(), original);
        weight.copy_from(Tensor::full(weight.shape(), 0.5, DType::f32, Device::cpu)); // kept
    }
    const optim::WholeParameters whole(trainer);
    EXPECT_EQ(weight.to_vector<float>(), std::vector<float>(static_cast<size_t>(weight.numel()), 0.5f));
    {
        const optim::WholeParameters nested(trainer); // gathered already: nothing more, and the outer scope releases
        EXPECT_FALSE(weight.storage_released());
    }
    EXPECT_FALSE(weight.storage_released());
    // A step inside the scope is refused: its hooks would release the layers under it.
    nn::DataLoader loader(documents(20), padded_options(2));
    expect_error([&] { trainer.train_step(loader.source()); }, {"WholeParameters", "end the scope"});
    EXPECT_FALSE(weight.storage_released());
}

// A stage-3 trainer leaves its layers released when it goes (gathering is a collective): a trainer that gathers nothing
// (another stage, or no communicator) refuses such a model naming the tensor, before it changes anything; a stage-3 one
// over the same communicator takes it, and gather_released_parameters() before the first trainer goes keeps it whole.
TEST(ZeroStage3, ATrainerThatGathersNothingRefusesReleasedWeights) {
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    nn::GPT model(tiny_gpt, 3, Device::cpu, DType::f32);
    { optim::Trainer first(model, stage_config(3, 1, Precision::fp32), communicator.get()); }
    EXPECT_TRUE(model.block(0).parameters().front().storage_released());
    expect_error([&] { optim::Trainer plain(model, stage_config(2, 1, Precision::fp32), communicator.get()); },
                 {"h.0.", "released", "gathers nothing"});
    expect_error([&] { optim::Trainer alone(model, stage_config(3, 1, Precision::fp32)); }, {"released", "gathers nothing"});
    nn::GPT kept(tiny_gpt, 3, Device::cpu, DType::f32);
    {
        optim::Trainer first(kept, stage_config(3, 1, Precision::fp32), communicator.get());
        first.gather_released_parameters();
    }
    EXPECT_FALSE(kept.block(0).parameters().front().storage_released());
    optim::Trainer plain(kept, stage_config(0, 1, Precision::fp32));
    nn::DataLoader loader(documents(20), padded_options(2));
    EXPECT_TRUE(plain.train_step(loader.source()).has_value());
}

// A step that runs out of memory anywhere (at each of its new highs in turn: the gathers of the forward and of the
// recompute among them; f32 and bf16) leaves the layers released, nothing attached and the shards as they were: after
// every failure, and then without a limit, the trainer trains on as one that never failed (its data skipped alike),
// bitwise. (tests/test_zero_stage3_tables.cpp runs it for an untied Llama, whose token table and head are released too.)
TEST(ZeroStage3, AStepThatRunsOutOfMemoryPartWayChangesNothing) {
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
        const int failures = out_of_memory_sweep(
            [] { return std::make_unique<nn::GPT>(tiny_gpt, 3, Device::cpu, DType::f32); }, stage_config(3, 2, precision),
            [](nn::CausalLM& model, int failures) {
                for (int layer = 0; layer < model.block_count(); ++layer)
                    for (const Tensor& parameter : model.block(layer).parameters()) {
                        EXPECT_TRUE(parameter.storage_released()) << "layer " << layer << " after failure " << failures;
                        EXPECT_FALSE(parameter.grad().defined()) << "layer " << layer << " after failure " << failures;
                    }
            });
        EXPECT_GT(failures, 10) << "the limits should fail the step at many places";
        std::printf("  %s: %d steps failed (out of memory at each new high of the step in turn) and changed nothing\n",
                    dtype_name(precision_dtype(precision)), failures);
    }
}

// The memory model: the checkpointed layers' masters and copies leave `parameters` for this rank's part of them and
// one gathered segment; the parts of the ranks add up to those layers; the rank holding the most is named; the rules.
TEST(ZeroStage3, MemoryModelShardsTheCheckpointedLayersWeights) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const size_t layer_elements = planner::layer_parameter_count(config);
    for (const DType dtype : {DType::f32, DType::bf16}) {
        // What a layer holds at stage 2 (its f32 masters, and under bf16 their copies) and what comes back for a use
        // at stage 3 (what the forward reads: the masters in f32, the bf16 copies alone under bf16).
        const size_t layer = layer_elements * (dtype == DType::bf16 ? 6 : 4);
        const size_t gathered = layer_elements * dtype_size(dtype);
        for (int ranks : {2, 3}) {
            const planner::MemoryPrediction stage2 = planner::predict_memory(
                config, 2, 16, every_layer, dtype, planner::OptimizerKind::adamw, ZeroSharding{ranks, true}, 2);
            const planner::MemoryPrediction stage3 = planner::predict_memory(
                config, 2, 16, every_layer, dtype, planner::OptimizerKind::adamw, ZeroSharding{ranks, true, true}, 2);
            EXPECT_EQ(stage3.gathered_layer_bytes, gathered);
            EXPECT_EQ(stage3.of(MemoryCategory::parameters),
                      stage2.of(MemoryCategory::parameters) - config.n_layer * layer + stage3.shard_parameter_bytes + gathered);
            EXPECT_EQ(stage3.of(MemoryCategory::gradients), stage2.of(MemoryCategory::gradients));
            EXPECT_LT(stage3.peak_bytes, stage2.peak_bytes) << ranks << " ranks";
            const distributed::ZeroPartition partition = distributed::ZeroPartition::of(
                static_cast<int64_t>(planner::parameter_count(config, config.vocab_size)), ranks, 4);
            size_t held = 0, largest = 0;
            const std::vector<checkpoint::Segment> segments = checkpoint::plan_segments(config.n_layer, every_layer);
            for (int rank = 0; rank < ranks; ++rank) {
                const size_t mine = planner::sharded_layer_elements(config, segments, partition, rank);
                held += mine;
                largest = std::max(largest, mine);
            }
            EXPECT_EQ(held, config.n_layer * layer_elements);
            EXPECT_EQ(stage3.shard_parameter_bytes + stage3.largest_rank_extra_bytes, largest * dtype_size(compute_dtype(dtype)));
        }
    }
    EXPECT_TRUE(ZeroSharding::of(3, 4).parameters);
    EXPECT_TRUE(ZeroSharding::of(3, 4).gradients);
    EXPECT_FALSE(ZeroSharding::of(3, 1).parameters);
    expect_error([&] { planner::predict_memory(config, 2, 16, every_layer, DType::bf16, planner::OptimizerKind::adamw,
                                               ZeroSharding{2, true, true}, 1, true, GradientOffload::stream, true); },
                 {"ZeRO-3", "offload_parameters"});
    StepShape shape;
    shape.checkpointing = every_layer;
    shape.zero_stage = 3;
    EXPECT_FALSE(shape.problem().has_value());
    shape.offload_optimizer = true;
    ASSERT_TRUE(shape.problem().has_value()); // the segments' gradients are summed in the host shards as they end
    EXPECT_NE(shape.problem()->reason.find("offload_gradients stream"), std::string::npos) << shape.problem()->reason;
    shape.offload_gradients = GradientOffload::stream;
    EXPECT_FALSE(shape.problem().has_value());
    shape.offload_parameters = true;
    ASSERT_TRUE(shape.problem().has_value());
    EXPECT_EQ(shape.problem()->field, "offload_parameters");
    shape.offload_parameters = false;
    shape.offload_optimizer = false;
    shape.offload_gradients = GradientOffload::window;
    shape.checkpointing = {};
    ASSERT_TRUE(shape.problem().has_value());
    EXPECT_NE(shape.problem()->reason.find("gradient_checkpointing"), std::string::npos);
}

// The collectives' cost: stage 3 reduces the gradients as stage 2 does, and broadcasts the checkpointed layers'
// masters twice per micro-batch (their forward and their recompute) and the rest once, instead of the all-gather,
// one call per tensor (and one more where a tensor is split between two owners).
TEST(ZeroStage3, CostModelCountsTwoGathersOfEveryMicroBatch) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const auto communication = [&](int stage, int ranks, int accumulation) {
        return communication_cost(config, every_layer, stage, ranks, accumulation);
    };
    const double parameters = static_cast<double>(planner::parameter_count(config, config.vocab_size));
    const double layers = config.n_layer * static_cast<double>(planner::layer_parameter_count(config));
    for (int ranks : {2, 8})
        for (int accumulation : {1, 4}) {
            const double gradients = (accumulation * layers + parameters - layers) * 4;
            EXPECT_DOUBLE_EQ(communication(3, ranks, accumulation).communicated_bytes,
                             gradients + (2 * accumulation * layers + parameters - layers) * 4);
            EXPECT_GT(communication(3, ranks, accumulation).communication_seconds,
                      communication(2, ranks, accumulation).communication_seconds);
            // Under bf16 the owners broadcast the rounded copies: the segments' gathers move half the bytes.
            planner::StepCost rounded;
            planner::add_communication(rounded, config, accumulation, every_layer, 3, ranks, planner::cpu_ceilings(), 2);
            EXPECT_DOUBLE_EQ(rounded.communicated_bytes,
                             gradients + 2 * accumulation * layers * 2 + (parameters - layers) * 4);
            EXPECT_EQ(rounded.collectives, communication(3, ranks, accumulation).collectives);
            // The calls: stage 2's without its all-gather's pieces, plus 12 tensors a layer for each of the 2A passes
            // (ranks − 1 splits each) and the 4 tensors kept whole (ranks − 1 splits).
            const distributed::ZeroPartition partition =
                distributed::ZeroPartition::of(static_cast<int64_t>(parameters), ranks, 4);
            EXPECT_DOUBLE_EQ(communication(3, ranks, accumulation).collectives,
                             communication(2, ranks, accumulation).collectives - partition.pieces +
                                 2 * accumulation * (config.n_layer * 12 + ranks - 1) + 4 + ranks - 1);
        }
    EXPECT_EQ(communication(3, 1, 4).communicated_bytes, 0.0);
}

// With the model state on the host a gathered segment's copies cross up for each of its 2A uses (the update refreshes
// none of them) and, under bf16, are rounded on the host each time (read f32, write bf16): what the search prices.
TEST(ZeroStage3, CostModelPricesTheGathersOnTheHost) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const double elements = config.n_layer * static_cast<double>(planner::layer_parameter_count(config));
    for (const DType dtype : {DType::f32, DType::bf16})
        for (int accumulation : {1, 3}) {
            const auto cost = [&](bool gathered_on_host) {
                return planner::predict_cost(config, 2, accumulation, 16, every_layer, dtype, planner::OptimizerKind::adamw,
                                             2, planner::cpu_ceilings(), true, GradientOffload::stream, false, 0, 0,
                                             gathered_on_host);
            };
            const planner::StepCost plain = cost(false), gathered = cost(true);
            const double element = static_cast<double>(dtype_size(dtype)), uses = 2.0 * accumulation - 1.0;
            EXPECT_DOUBLE_EQ(gathered.host_device_bytes - plain.host_device_bytes, uses * elements * element);
            EXPECT_DOUBLE_EQ(gathered.host_bytes - plain.host_bytes, dtype == DType::bf16 ? uses * elements * 6.0 : 0.0);
            EXPECT_GT(gathered.seconds, plain.seconds);
        }
}

} // namespace
} // namespace engine::testing
