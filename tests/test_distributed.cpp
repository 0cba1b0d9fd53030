// Data parallelism without a launcher: the padded layout, each rank's disjoint part of every global batch,
// cursors that refuse another world size, the single-process communicator and the trainer's one reduction of
// each kind per step. The multi-rank runs are tests/cli/train_gpt_mpi.sh (ctest train_gpt_mpi, label mpi).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "planner/memory_model.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/zero_partition.h"
#include "expect_error.h"
#include "nn/io/token_data.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

constexpr int32_t end_of_text = 9;

// Documents of lengths 1..12 (the end-of-text token included), tokens 1..8.
std::vector<int32_t> documents(int count) {
    std::vector<int32_t> tokens;
    for (int document = 0; document < count; ++document) {
        const int length = 1 + (document * 7) % 12;
        for (int index = 0; index + 1 < length; ++index) tokens.push_back(1 + (document + index) % 8);
        tokens.push_back(end_of_text);
    }
    return tokens;
}

nn::DataLoaderOptions padded_options(int batch_size, int rank = 0, int world_size = 1) {
    nn::DataLoaderOptions options;
    options.batch_size = batch_size;
    options.sequence_length = 8;
    options.seed = 5;
    options.layout = nn::DataLayout::padded;
    options.end_of_text = end_of_text;
    options.rank = rank;
    options.world_size = world_size;
    return options;
}

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

// ZeRO-1's optimizer: two optimizers over complementary element ranges, stepping on the same gradients,
// update every element exactly as one unsharded optimizer does, each with about half the state.
TEST(ZeroStage1, ShardedOptimizersTogetherEqualTheWholeOne) {
    for (const bool adamw : {true, false}) {
        nn::GPT whole_model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
        nn::GPT sharded_model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
        int64_t total = 0;
        for (const Tensor& parameter : whole_model.parameters()) total += parameter.numel();
        const int64_t middle = total / 2 + 5; // inside a parameter, not at a boundary
        auto make = [&](nn::GPT& model, optim::ShardRange range) -> std::unique_ptr<optim::Optimizer> {
            if (adamw) return std::make_unique<optim::AdamW>(model.named_parameters(), optim::AdamWOptions{},
                                                              optim::decay_matrices_only, range);
            return std::make_unique<optim::SGD>(model.named_parameters(), optim::SGDOptions{}, optim::decay_matrices_only, range);
        };
        const auto whole = make(whole_model, {});
        const auto first = make(sharded_model, {0, middle});
        const auto second = make(sharded_model, {middle, total});
        EXPECT_FALSE(whole->sharded());
        EXPECT_TRUE(first->sharded());
        int64_t state_elements[2] = {0, 0};
        for (int part = 0; part < 2; ++part)
            for (const auto& [name, state] : (part ? second : first)->named_state()) state_elements[part] += state.numel();
        const int64_t per_parameter = adamw ? 2 : 1;
        EXPECT_EQ(state_elements[0], per_parameter * middle);
        EXPECT_EQ(state_elements[1], per_parameter * (total - middle));
        for (int step = 0; step < 3; ++step) {
            for (nn::GPT* model : {&whole_model, &sharded_model}) {
                int index = 0;
                for (const Tensor& parameter : model->parameters()) {
                    std::vector<float> gradient(static_cast<size_t>(parameter.numel()));
                    for (size_t i = 0; i < gradient.size(); ++i)
                        gradient[i] = 0.01f * static_cast<float>((i * 7 + static_cast<size_t>(index + step)) % 13) - 0.05f;
                    parameter.grad().copy_from(Tensor::from_vector<float>(gradient, parameter.shape(), Device::cpu));
                    ++index;
                }
            }
            whole->step(0.5);
            first->step(0.5);
            second->step(0.5);
        }
        const auto whole_parameters = whole_model.parameters();
        const auto sharded_parameters = sharded_model.parameters();
        for (size_t index = 0; index < whole_parameters.size(); ++index)
            EXPECT_EQ(whole_parameters[index].to_vector<float>(), sharded_parameters[index].to_vector<float>())
                << (adamw ? "adamw" : "sgd") << " parameter " << index;
    }
    expect_error([] { nn::GPT model({16, 8, 1, 2, 8, 0.0f}, 3, Device::cpu, DType::f32);
                      optim::AdamW(model.named_parameters(), optim::AdamWOptions{}, optim::decay_matrices_only, {5, 2}); },
                 {"shard [5, 2)"});
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

} // namespace
} // namespace engine::testing
