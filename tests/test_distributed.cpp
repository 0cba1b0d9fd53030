// Data parallelism without a launcher: the padded layout, each rank's disjoint part of every global batch,
// cursors that refuse another world size, the single-process communicator and the trainer's one reduction of
// each kind per step, and ZeRO's parts that need no second rank (the sharded optimizers, stage 2's gradient buffers
// and memory model). The multi-rank runs are tests/cli/train_gpt_mpi.sh and train_gpt_zero2.sh (label mpi).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/memory_model.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/zero_partition.h"
#include "engine/elementwise.h"
#include "expect_error.h"
#include "nn/io/token_data.h"
#include "optim/trainer.h"
#include "zero_runs.h"

namespace engine::testing {
namespace {

std::vector<std::vector<int32_t>> rows_of(const Tensor& tensor) {
    const std::vector<int32_t> values = tensor.to_vector<int32_t>();
    const auto width = static_cast<size_t>(tensor.size(1));
    std::vector<std::vector<int32_t>> rows;
    for (size_t first = 0; first < values.size(); first += width)
        rows.emplace_back(values.begin() + static_cast<std::ptrdiff_t>(first),
                          values.begin() + static_cast<std::ptrdiff_t>(first + width));
    return rows;
}

TEST(PaddedLayout, OneDocumentPerSequenceTruncatedOrPaddedWithIgnoredLabels) {
    nn::DataLoaderOptions options = padded_options(4);
    options.shuffle = false;
    nn::DataLoader loader(documents(12), options);
    EXPECT_EQ(loader.window_count(), 12);
    const nn::Batch batch = *loader.next();
    const auto inputs = rows_of(batch.inputs);
    const auto labels = rows_of(batch.labels);
    for (size_t row = 0; row < inputs.size(); ++row) {
        const int length = std::min(8, 1 + static_cast<int>(row * 7) % 12);
        for (int t = 0; t < 8; ++t) {
            if (t < length) {
                EXPECT_EQ(labels[row][static_cast<size_t>(t)], inputs[row][static_cast<size_t>(t)]);
            } else {
                EXPECT_EQ(labels[row][static_cast<size_t>(t)], -100) << "row " << row << " position " << t;
            }
        }
        // A document that fits ends with its end-of-text token; a longer one is cut at the sequence length.
        if (1 + static_cast<int>(row * 7) % 12 <= 8) EXPECT_EQ(inputs[row][static_cast<size_t>(length - 1)], end_of_text);
    }
}

TEST(RankParts, DisjointAndTogetherTheOneProcessBatch) {
    const std::vector<int32_t> tokens = documents(40);
    nn::DataLoader whole(tokens, padded_options(4));
    nn::DataLoader first(tokens, padded_options(2, 0, 2));
    nn::DataLoader second(tokens, padded_options(2, 1, 2));
    EXPECT_EQ(whole.batches_per_epoch(), first.batches_per_epoch());
    for (int step = 0; step < 25; ++step) { // past an epoch boundary (10 global batches per epoch)
        const auto all = rows_of(whole.next()->inputs);
        const auto part0 = rows_of(first.next()->inputs);
        const auto part1 = rows_of(second.next()->inputs);
        ASSERT_EQ(part0.size() + part1.size(), all.size());
        EXPECT_EQ(std::vector(all.begin(), all.begin() + 2), part0) << "step " << step;
        EXPECT_EQ(std::vector(all.begin() + 2, all.end()), part1) << "step " << step;
    }
    EXPECT_EQ(first.cursor().position, whole.cursor().position);
}

TEST(RankParts, CursorOfAnotherWorldSizeOrRankIsRefused) {
    const std::vector<int32_t> tokens = documents(40);
    nn::DataLoader two(tokens, padded_options(2, 1, 2));
    two.next();
    const nn::LoaderCursor saved = two.cursor();
    EXPECT_EQ(nn::LoaderCursor::from_json(saved.to_json()), saved);
    nn::DataLoader one(tokens, padded_options(4));
    const nn::LoaderCursor before = one.cursor();
    expect_error([&] { one.restore(saved); }, {"2 ranks", "this run has 1", "same number of ranks"});
    EXPECT_EQ(one.cursor(), before); // unchanged
    nn::DataLoader other_rank(tokens, padded_options(2, 0, 2));
    expect_error([&] { other_rank.restore(saved); }, {"rank 1", "rank 0"});
    // A cursor saved before data parallelism is rank 0 of 1.
    const nn::LoaderCursor old = nn::LoaderCursor::from_json(R"({"seed":5,"epoch":0,"position":4})");
    EXPECT_EQ(old.world_size, 1);
    EXPECT_EQ(old.rank, 0);
}

TEST(RankParts, BadOptionsAreNamed) {
    expect_error([] { nn::DataLoader(documents(40), padded_options(2, 2, 2)); }, {"rank 2", "world of 2"});
    nn::DataLoaderOptions options = padded_options(2, 0, 2);
    options.drop_last = false;
    expect_error([&] { nn::DataLoader(documents(40), options); }, {"drop_last"});
    expect_error([] { nn::DataLoader(documents(3), padded_options(2, 0, 2)); }, {"3 documents", "2 ranks"});
    expect_error([] { nn::parse_data_layout("ragged"); }, {"ragged", "packed, padded"});
}

TEST(Communicator, SingleProcessSumsAreTheirInputsAndEveryCallIsCounted) {
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    EXPECT_EQ(communicator->world_size(), 1);
    const Tensor buffer = Tensor::from_vector<float>({1.5f, -2.0f}, {2}, Device::cpu);
    communicator->all_reduce_gradients({buffer});
    EXPECT_EQ(buffer.to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
    EXPECT_EQ(communicator->all_reduce_count(17), 17);
    EXPECT_EQ(communicator->all_reduce_value(0.25), 0.25);
    communicator->broadcast(buffer, 0);
    communicator->barrier();
    const distributed::CommunicatorCounters counters = communicator->counters();
    EXPECT_EQ(counters.gradient_all_reduces, 1);
    EXPECT_EQ(counters.count_all_reduces, 1);
    EXPECT_EQ(counters.value_all_reduces, 1);
    EXPECT_EQ(counters.broadcasts, 1);
    EXPECT_EQ(counters.barriers, 1);
    expect_error([&] { communicator->broadcast(buffer, 1); }, {"rank 0 of 1", "broadcast", "root 1"});
    const Tensor ids = Tensor::from_vector<int32_t>({1}, {1}, Device::cpu);
    expect_error([&] { communicator->all_reduce_gradients({buffer, ids}); }, {"all_reduce_gradients", "differs"});
    expect_error([] { distributed::parse_backend("gloo"); }, {"gloo", "none, mpi, nccl"});
    if (!distributed::backend_built(distributed::Backend::mpi))
        expect_error([] { distributed::make_communicator(distributed::Backend::mpi); }, {"built without MPI"});
}

// With a communicator, a step makes one count, one gradient and one loss reduction whatever the number of
// micro-batches, and at world size 1 it changes nothing: the weights equal a run without one, bitwise.
TEST(Communicator, TrainerReducesOncePerStepAndWorldSizeOneChangesNothing) {
    const std::vector<int32_t> tokens = documents(60);
    for (int accumulation : {1, 3}) {
        std::vector<std::vector<float>> weights[2];
        for (int with_communicator = 0; with_communicator < 2; ++with_communicator) {
            const auto communicator = distributed::make_communicator(distributed::Backend::none);
            nn::GPT model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
            optim::TrainerConfig config;
            config.shape.per_device_train_batch_size = 2;
            config.shape.gradient_accumulation_steps = accumulation;
            optim::Trainer trainer(model, config);
            if (with_communicator) trainer.set_communicator(communicator.get());
            nn::DataLoader loader(tokens, padded_options(2));
            for (int step = 0; step < 3; ++step) {
                const optim::StepResult result = *trainer.train_step(loader.source());
                const int64_t expected = with_communicator ? 1 : 0;
                EXPECT_EQ(result.communication.count_all_reduces, expected);
                EXPECT_EQ(result.communication.gradient_all_reduces, expected);
                EXPECT_EQ(result.communication.value_all_reduces, expected);
            }
            for (const Tensor& parameter : model.parameters()) weights[with_communicator].push_back(parameter.to_vector<float>());
        }
        EXPECT_EQ(weights[0], weights[1]) << accumulation << " micro-batches";
    }
}

// ZeRO's optimizer tests: an AdamW or SGD over `range` of a model's parameters laid end to end.
std::unique_ptr<optim::Optimizer> sharded_optimizer(bool adamw, const nn::GPT& model, optim::ShardRange range) {
    if (adamw)
        return std::make_unique<optim::AdamW>(model.named_parameters(), optim::AdamWOptions{}, optim::decay_matrices_only, range);
    return std::make_unique<optim::SGD>(model.named_parameters(), optim::SGDOptions{}, optim::decay_matrices_only, range);
}

int64_t element_count(const nn::GPT& model) {
    int64_t total = 0;
    for (const Tensor& parameter : model.parameters()) total += parameter.numel();
    return total;
}

// A made-up gradient for parameter `index` at `step`, the same for every model that asks.
std::vector<float> made_gradient(const Tensor& parameter, int index, int step) {
    std::vector<float> gradient(static_cast<size_t>(parameter.numel()));
    for (size_t i = 0; i < gradient.size(); ++i)
        gradient[i] = 0.01f * static_cast<float>((i * 7 + static_cast<size_t>(index + step)) % 13) - 0.05f;
    return gradient;
}

// ZeRO's optimizers: two over complementary element ranges, stepping on the same gradients, update every element
// exactly as one unsharded optimizer does, each with about half the state. With shard_gradients (stage 2) each reads
// its range's gradients from a buffer of its own (what the owner's reduces fill), padded as a rank's part is, while the
// parameters' buffers hold garbage.
void expect_sharded_optimizers_equal_the_whole_one(bool adamw, bool shard_gradients) {
    const char* what = adamw ? "adamw" : "sgd";
    nn::GPT whole_model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
    nn::GPT sharded_model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
    const int64_t total = element_count(whole_model);
    const int64_t middle = total / 2 + 5; // inside a parameter, not at a boundary
    const auto whole = sharded_optimizer(adamw, whole_model, {});
    const auto first = sharded_optimizer(adamw, sharded_model, {0, middle});
    const auto second = sharded_optimizer(adamw, sharded_model, {middle, total});
    EXPECT_FALSE(whole->sharded());
    EXPECT_TRUE(first->sharded());
    int64_t state_elements[2] = {0, 0};
    for (int part = 0; part < 2; ++part)
        for (const auto& [name, state] : (part ? second : first)->named_state()) state_elements[part] += state.numel();
    const int64_t per_parameter = adamw ? 2 : 1;
    EXPECT_EQ(state_elements[0], per_parameter * middle);
    EXPECT_EQ(state_elements[1], per_parameter * (total - middle));
    constexpr int64_t padding = 3;
    Tensor first_gradients = Tensor::zeros({middle + padding}, DType::f32, Device::cpu);
    Tensor second_gradients = Tensor::zeros({total - middle + padding}, DType::f32, Device::cpu);
    if (shard_gradients) {
        first->read_gradients_from(first_gradients);
        second->read_gradients_from(second_gradients);
    }
    for (int step = 0; step < 3; ++step) {
        std::vector<float> flat;
        int index = 0;
        for (const Tensor& parameter : whole_model.parameters()) {
            const std::vector<float> gradient = made_gradient(parameter, index++, step);
            parameter.grad().copy_from(Tensor::from_vector<float>(gradient, parameter.shape(), Device::cpu));
            flat.insert(flat.end(), gradient.begin(), gradient.end());
        }
        const std::vector<Tensor> sharded_parameters = sharded_model.parameters();
        for (size_t slot = 0; slot < sharded_parameters.size(); ++slot)
            sharded_parameters[slot].grad().copy_from(
                shard_gradients ? Tensor::full(sharded_parameters[slot].shape(), 1e6, DType::f32, Device::cpu)
                                : whole_model.parameters()[slot].grad());
        std::vector<float> head(flat.begin(), flat.begin() + middle), tail(flat.begin() + middle, flat.end());
        head.resize(head.size() + padding, 0.0f);
        tail.resize(tail.size() + padding, 0.0f);
        first_gradients.copy_from(Tensor::from_vector<float>(head, {middle + padding}, Device::cpu));
        second_gradients.copy_from(Tensor::from_vector<float>(tail, {total - middle + padding}, Device::cpu));
        whole->step(0.5);
        first->step(0.5);
        second->step(0.5);
    }
    const auto whole_parameters = whole_model.parameters();
    const auto sharded_parameters = sharded_model.parameters();
    for (size_t index = 0; index < whole_parameters.size(); ++index)
        EXPECT_EQ(whole_parameters[index].to_vector<float>(), sharded_parameters[index].to_vector<float>())
            << what << (shard_gradients ? ", shard gradients" : "") << ", parameter " << index;
    if (!shard_gradients) return;
    // A buffer shorter than the range, or of another dtype, is refused naming it.
    expect_error([&] { first->read_gradients_from(Tensor::zeros({middle - 1}, DType::f32, Device::cpu)); },
                 {"optimizer", std::to_string(middle) + " elements"});
    expect_error([&] { first->read_gradients_from(Tensor::zeros({middle}, DType::f64, Device::cpu)); },
                 {"optimizer", "f64"});
}

TEST(ZeroStage1, ShardedOptimizersTogetherEqualTheWholeOne) {
    for (const bool adamw : {true, false}) expect_sharded_optimizers_equal_the_whole_one(adamw, false);
    expect_error([] { nn::GPT model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
                      optim::AdamW(model.named_parameters(), optim::AdamWOptions{}, optim::decay_matrices_only, {5, 2}); },
                 {"shard [5, 2)"});
}

TEST(ZeroStage2, OptimizersReadingTheirShardGradientsEqualTheWholeOne) {
    for (const bool adamw : {true, false}) expect_sharded_optimizers_equal_the_whole_one(adamw, true);
}

// ZeRO-1's partition (engine/distributed/zero_partition.h): every element kept by exactly one rank, each part a whole
// number of equal pieces padded by fewer elements than there are pieces, the ranks' pieces within the bucket.
TEST(ZeroStage1, PartitionKeepsEveryElementOnceInPiecesWithinTheBucket) {
    for (const char* bucket : {"8", "24", "4096", "33554432"}) {
        ::setenv("ENGINE_ZERO_BUCKET_BYTES", bucket, 1);
        const size_t bucket_bytes = std::stoull(bucket);
        for (int64_t ranks = 1; ranks <= 9; ++ranks)
            for (int64_t total : {1, 2, 7, 64, 601, 4194305, 8388610}) {
                const auto partition = distributed::ZeroPartition::of(total, ranks, 4);
                const std::string what = "bucket " + std::string(bucket) + ", " + std::to_string(ranks) + " ranks, " +
                                         std::to_string(total) + " elements";
                int64_t kept = 0;
                for (int64_t rank = 0; rank < ranks; ++rank) {
                    EXPECT_EQ(partition.begin(rank), std::min(total, rank * partition.part)) << what;
                    EXPECT_LE(partition.begin(rank), partition.end(rank)) << what;
                    if (rank > 0) EXPECT_EQ(partition.begin(rank), partition.end(rank - 1)) << what;
                    kept += partition.end(rank) - partition.begin(rank);
                }
                EXPECT_EQ(kept, total) << what;
                EXPECT_EQ(partition.part, partition.pieces * partition.piece) << what;
                const int64_t even = (total + ranks - 1) / ranks;
                EXPECT_GE(partition.part, even) << what;
                EXPECT_LT(partition.part - even, partition.pieces) << what;
                // The N pieces within the bucket, unless the bucket holds less than one element a rank.
                const int64_t fitting = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes) / (ranks * 4));
                EXPECT_LE(partition.piece, fitting) << what;
                EXPECT_EQ(partition.buffer_elements(), (ranks + 1) * partition.piece) << what;
            }
    }
    ::setenv("ENGINE_ZERO_BUCKET_BYTES", "-1", 1);
    expect_error([] { distributed::ZeroPartition::of(10, 2, 4); }, {"ENGINE_ZERO_BUCKET_BYTES='-1'", "positive"});
    ::unsetenv("ENGINE_ZERO_BUCKET_BYTES");
}

TEST(ZeroStage1, MemoryModelHalvesTheOptimizerStatePerRank) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const auto whole = planner::predict_memory(config, 2, 16, checkpoint::CheckpointPolicy{});
    const auto sharded = planner::predict_memory(config, 2, 16, checkpoint::CheckpointPolicy{}, DType::f32,
                                                    planner::OptimizerKind::adamw, 2);
    EXPECT_NEAR(static_cast<double>(sharded.of(MemoryCategory::optimizer_state)), whole.of(MemoryCategory::optimizer_state) / 2.0, 8.0);
    EXPECT_GT(sharded.of(MemoryCategory::workspace), whole.of(MemoryCategory::workspace)); // the collectives' buffers
    EXPECT_NE(planner::plan_report(config, 2, 16, checkpoint::CheckpointPolicy{}, DType::f32,
                                      planner::OptimizerKind::adamw, 2)
                  .find("ZeRO stage 1 over 2 ranks"),
              std::string::npos);
}

// A layer's gradient buffers go and come back (Module::release_gradients, attach_gradients), its views and bf16
// working copy with them; between, a forward in grad mode through it fails naming the parameter, and after, the
// buffers are zero and backward fills them again.
TEST(ZeroStage2, ModuleReleasesAndAttachesTheGradientBuffersOfALayer) {
    for (const DType compute : {DType::f32, DType::bf16}) {
        nn::GPT model({16, 8, 2, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
        if (compute == DType::bf16) model.set_compute_dtype(DType::bf16);
        const Tensor tokens = Tensor::from_vector<int32_t>({1, 2, 3, 4}, {1, 4}, Device::cpu);
        const Tensor targets = Tensor::from_vector<int32_t>({2, 3, 4, 5}, {1, 4}, Device::cpu);
        backward(cross_entropy(model.forward(tokens), targets));
        nn::Module& layer = model.block(1);
        const size_t before = memory_stats(Device::cpu).current_by_category[static_cast<int>(MemoryCategory::gradients)];
        layer.release_gradients();
        for (const Tensor& parameter : layer.parameters()) {
            EXPECT_FALSE(parameter.grad().defined());
            EXPECT_TRUE(parameter.requires_grad());
        }
        for (const Tensor& working : layer.working_parameters()) EXPECT_FALSE(working.grad().defined());
        EXPECT_LT(memory_stats(Device::cpu).current_by_category[static_cast<int>(MemoryCategory::gradients)], before)
            << "the released buffers are freed";
        for (const Tensor& parameter : model.block(0).parameters()) EXPECT_TRUE(parameter.grad().defined());
        expect_error([&] { backward(cross_entropy(model.forward(tokens), targets)); },
                     {"weight", "no gradient buffer now", "ZeRO-2"});
        current_tape().clear();
        layer.attach_gradients();
        const std::vector<Tensor> masters = layer.parameters(), working = layer.working_parameters();
        for (size_t index = 0; index < masters.size(); ++index) {
            ASSERT_TRUE(masters[index].grad().defined());
            EXPECT_EQ(masters[index].grad().dtype(), DType::f32);
            EXPECT_EQ(sum_of_squares(masters[index].grad()), 0.0);
            EXPECT_TRUE(working[index].grad().raw_data() == masters[index].grad().raw_data()) << "one shared buffer";
        }
        backward(cross_entropy(model.forward(tokens), targets));
        double filled = 0.0;
        for (const Tensor& parameter : masters) filled += sum_of_squares(parameter.grad());
        EXPECT_GT(filled, 0.0) << dtype_name(compute);
    }
}

// The trainer at stage 2 over a one-rank communicator runs every part of it (the released layers, the hooks, the
// reduces, the shard gradients the optimizer reads, the norm from them) with sums that are copies: one micro-batch a
// step trains bitwise as stage 0 without a communicator; three differ only by where the micro-batches' sums are
// added (the shard, not the buffers), within 2e-8 (observed 1.9e-9).
TEST(ZeroStage2, OneRankTrainsAsWithoutShardsAndAsPredicted) {
    const std::vector<int32_t> tokens = documents(80);
    for (int accumulation : {1, 3}) {
        std::vector<std::vector<float>> weights[2];
        std::vector<double> norms[2];
        size_t peaks[2] = {0, 0};
        for (int stage2 = 0; stage2 < 2; ++stage2) {
            const auto communicator = distributed::make_communicator(distributed::Backend::none);
            nn::GPT model({16, 8, 3, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
            optim::TrainerConfig config;
            config.shape.per_device_train_batch_size = 2;
            config.shape.gradient_accumulation_steps = accumulation;
            config.shape.checkpointing.enabled = true;
            config.shape.zero_stage = stage2 ? 2 : 0;
            config.max_grad_norm = 0.5; // the clip on: the norm from the shard must be right
            optim::Trainer trainer(model, config, stage2 ? communicator.get() : nullptr);
            nn::DataLoader loader(tokens, padded_options(2));
            for (int step = 0; step < 4; ++step) {
                const optim::StepResult result = *trainer.train_step(loader.source());
                norms[stage2].push_back(result.grad_norm);
                peaks[stage2] = std::max(peaks[stage2], result.memory.peak_bytes);
                if (stage2) EXPECT_EQ(result.communication.reduces, 3 * accumulation + 2) << "3 segments a micro-batch";
            }
            for (const Tensor& parameter : model.parameters()) weights[stage2].push_back(parameter.to_vector<float>());
            if (stage2) // between steps the layers hold no gradient buffer
                for (const Tensor& parameter : model.block(1).parameters()) EXPECT_FALSE(parameter.grad().defined());
        }
        // The norm's double sum goes over the shard's pieces, not tensor by tensor: equal to the last digits with the
        // same gradients; with three micro-batches the gradients themselves differ by f32 rounding.
        const double tolerance = accumulation == 1 ? 1e-12 : 1e-8;
        for (size_t step = 0; step < norms[0].size(); ++step)
            EXPECT_NEAR(norms[0][step], norms[1][step], tolerance * norms[0][step]) << accumulation << " micro-batches";
        if (accumulation == 1) {
            EXPECT_EQ(weights[0], weights[1]);
        } else {
            double largest = 0.0;
            for (size_t index = 0; index < weights[0].size(); ++index)
                for (size_t element = 0; element < weights[0][index].size(); ++element)
                    largest = std::max(largest, std::fabs(static_cast<double>(weights[0][index][element]) -
                                                          weights[1][index][element]));
            std::printf("  one rank, %d micro-batches: largest weight difference from stage 0 %.3g\n", accumulation, largest);
            EXPECT_LE(largest, 2e-8); // about ten float steps at these weights' size (0.02): the sums' last bits
        }
        // The step peak as predicted for each (the trainer's micro-batches are 2 x 8 of i32 ids and labels).
        const checkpoint::CheckpointPolicy every_layer{true, 1};
        const nn::GPTConfig gpt{16, 8, 3, 2, 8, 0.0f};
        EXPECT_EQ(peaks[0], planner::predict_memory(gpt, 2, 8, every_layer, DType::f32, planner::OptimizerKind::adamw,
                                                    1, accumulation).peak_bytes);
        EXPECT_EQ(peaks[1], planner::predict_memory(gpt, 2, 8, every_layer, DType::f32, planner::OptimizerKind::adamw,
                                                    ZeroSharding{1, true}, accumulation).peak_bytes);
    }
}

// The collectives' cost (planner::add_communication): stages 0 and 1 move the same bytes (an all-reduce is a
// reduce-scatter and an all-gather); stage 2's reduces move their whole payload (a reduce-scatter (N − 1)/N of it), the
// checkpointed layers' once per micro-batch; nothing on one rank. So the planner prefers stage 1 where both fit.
TEST(ZeroStage2, CostModelCountsTheReducesOfEveryMicroBatch) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const auto communication = [&](int stage, int ranks, int accumulation) {
        const planner::StepCost cost = communication_cost(config, every_layer, stage, ranks, accumulation);
        EXPECT_NEAR(cost.seconds, cost.communication_seconds, 1e-15);
        return cost;
    };
    EXPECT_EQ(communication(2, 1, 4).communicated_bytes, 0.0);
    const double parameters = static_cast<double>(planner::parameter_count(config, config.vocab_size));
    const double layers = config.n_layer * static_cast<double>(planner::layer_parameter_count(config));
    for (int ranks : {2, 8}) {
        const double share = (ranks - 1.0) / ranks;
        EXPECT_DOUBLE_EQ(communication(0, ranks, 4).communicated_bytes, 2 * share * parameters * 4);
        EXPECT_DOUBLE_EQ(communication(1, ranks, 4).communicated_bytes, 2 * share * parameters * 4);
        EXPECT_DOUBLE_EQ(communication(2, ranks, 1).communicated_bytes, parameters * 4 + share * parameters * 4);
        EXPECT_DOUBLE_EQ(communication(2, ranks, 4).communicated_bytes,
                         (4 * layers + parameters - layers) * 4 + share * parameters * 4);
        EXPECT_GT(communication(2, ranks, 1).communication_seconds, communication(1, ranks, 1).communication_seconds);
        EXPECT_GT(communication(2, ranks, 4).communication_seconds, communication(2, ranks, 1).communication_seconds);
    }
}

TEST(ZeroStage2, SingleProcessReduceCopiesAndIsCounted) {
    const auto communicator = distributed::make_communicator(distributed::Backend::none);
    const Tensor send = Tensor::from_vector<float>({1.5f, -2.0f, 4.0f}, {3}, Device::cpu);
    const Tensor receive = Tensor::full({4}, 7.0, DType::f32, Device::cpu);
    communicator->reduce(send, receive, 2, 0);
    EXPECT_EQ(receive.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 7.0f, 7.0f}));
    EXPECT_EQ(communicator->counters().reduces, 1);
    expect_error([&] { communicator->reduce(send, receive, 4, 0); }, {"reduce", "4 elements"});
    expect_error([&] { communicator->reduce(send, receive, 1, 1); }, {"rank 0 of 1", "root 1"});
}

// Stage 2's memory model: this rank's part of the gradients for the whole run, the checkpointed layers' whole
// buffers only during their segment's backward; refused without checkpointing; and the rules a step shape obeys.
TEST(ZeroStage2, MemoryModelShardsTheGradientsOfTheCheckpointedLayers) {
    const nn::GPTConfig config = nn::GPTConfig::named("tiny");
    const checkpoint::CheckpointPolicy every_layer{true, 1};
    const auto stage1 = planner::predict_memory(config, 2, 16, every_layer, DType::f32, planner::OptimizerKind::adamw, 2);
    const auto stage2 = planner::predict_memory(config, 2, 16, every_layer, DType::f32, planner::OptimizerKind::adamw,
                                                ZeroSharding{2, true});
    const size_t layer = planner::layer_parameter_count(config) * sizeof(float);
    const size_t layers = static_cast<size_t>(config.n_layer);
    const distributed::ZeroPartition partition =
        distributed::ZeroPartition::of(static_cast<int64_t>(planner::parameter_count(config, config.vocab_size)), 2, 4);
    EXPECT_EQ(stage2.shard_gradient_bytes, static_cast<size_t>(partition.part) * sizeof(float));
    EXPECT_EQ(stage2.of(MemoryCategory::gradients),
              stage1.of(MemoryCategory::gradients) - layers * layer + stage2.shard_gradient_bytes + layer);
    EXPECT_EQ(stage2.of(MemoryCategory::optimizer_state), stage1.of(MemoryCategory::optimizer_state));
    EXPECT_EQ(stage2.between_steps_bytes,
              stage1.between_steps_bytes - layers * layer + stage2.shard_gradient_bytes);
    // A step shape asks no shards of one rank (train_gpt gives one process no communicator).
    EXPECT_EQ(ZeroSharding::of(2, 1).ranks, 1);
    EXPECT_FALSE(ZeroSharding::of(2, 1).gradients);
    EXPECT_TRUE(ZeroSharding::of(2, 4).gradients);
    EXPECT_FALSE(ZeroSharding::of(1, 4).gradients);
    expect_error([&] { planner::predict_memory(config, 2, 16, checkpoint::CheckpointPolicy{}, DType::f32,
                                               planner::OptimizerKind::adamw, ZeroSharding{2, true}); },
                 {"ZeRO-2", "checkpointing"});
    StepShape shape;
    shape.zero_stage = 2;
    ASSERT_TRUE(shape.problem().has_value());
    EXPECT_EQ(shape.problem()->field, "zero_stage");
    EXPECT_NE(shape.problem()->reason.find("gradient_checkpointing"), std::string::npos);
    shape.checkpointing = every_layer;
    EXPECT_FALSE(shape.problem().has_value());
    shape.zero_stage = 3; // with checkpointing; stage 3's own rules are in test_zero_stage3.cpp
    EXPECT_FALSE(shape.problem().has_value());
    shape.zero_stage = 4;
    ASSERT_TRUE(shape.problem().has_value());
    EXPECT_NE(shape.problem()->reason.find("0, 1, 2 or 3"), std::string::npos);
}

} // namespace
} // namespace engine::testing
