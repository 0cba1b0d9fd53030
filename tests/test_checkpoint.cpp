// Gradient checkpointing: the loss and every parameter gradient are bitwise those of the plain run under
// every policy (with dropout and gradient accumulation), recompute counts and RNG position, the segment
// plan, and the memory the allocator sees: the strict ordering of policies and exact offload bytes.
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/checkpoint.h"
#include "gradcheck.h"
#include "nn/gpt.h"

namespace engine::testing {
namespace {

using checkpoint::CheckpointPolicy;
using checkpoint::Segment;

constexpr int batch = 2;
constexpr int seq_len = 16;
constexpr uint64_t model_seed = 1234;
constexpr uint64_t dropout_seed = 99;

nn::GPTConfig small_config() {
    nn::GPTConfig config;
    config.vocab_size = 64;
    config.max_seq_len = seq_len;
    config.n_layer = 6;
    config.n_head = 4;
    config.n_embd = 32;
    config.dropout = 0.1f;
    return config;
}

CheckpointPolicy every_n(int n, int segment_size = 1, bool offload = false) {
    return CheckpointPolicy{true, n, segment_size, offload};
}

struct MicroBatch {
    Tensor tokens;  // (B,T) i32
    Tensor targets; // (B,T) i32, some ignore_index
};

std::vector<MicroBatch> make_micro_batches(std::mt19937_64& generator, int count, int vocabulary) {
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1);
    std::vector<MicroBatch> batches;
    for (int index = 0; index < count; ++index) {
        std::vector<int32_t> tokens(batch * seq_len), targets(batch * seq_len);
        for (int32_t& value : tokens) value = token(generator);
        for (int32_t& value : targets) value = token(generator);
        targets[static_cast<size_t>(index)] = default_ignore_index; // padding, so items != B·T·micro-batches
        batches.push_back({Tensor::from_vector(tokens, {batch, seq_len}, Device::cpu),
                           Tensor::from_vector(targets, {batch, seq_len}, Device::cpu)});
    }
    return batches;
}

int64_t count_items(const std::vector<MicroBatch>& batches) {
    int64_t items = 0;
    for (const MicroBatch& micro : batches)
        for (int32_t target : micro.targets.to_vector<int32_t>()) items += target != default_ignore_index;
    return items;
}

// Summed cross-entropy over the micro-batch divided by the items of the whole accumulated batch.
Tensor micro_batch_loss(const nn::GPT& model, const MicroBatch& micro, int64_t items) {
    Tensor logits = model.forward(micro.tokens);
    return multiply(cross_entropy(logits, micro.targets, Reduction::sum), 1.0 / static_cast<double>(items));
}

std::vector<uint8_t> bytes_of(const Tensor& tensor) {
    std::vector<uint8_t> bytes(tensor.nbytes());
    std::memcpy(bytes.data(), tensor.raw_data(), bytes.size());
    return bytes;
}

struct StepResult {
    std::vector<float> losses;
    std::vector<std::vector<uint8_t>> gradients;
    std::vector<size_t> recomputed; // per backward
    RngState rng_after;
};

// One accumulated step by hand: forward -> loss -> backward per micro-batch, no zero_grad in between.
// Also checks that recompute left no other state behind.
StepResult accumulated_step(const CheckpointPolicy& policy, const std::vector<MicroBatch>& batches) {
    nn::GPT model(small_config(), model_seed);
    model.train(true);
    model.set_checkpointing(policy);
    const int64_t items = count_items(batches);
    std::vector<std::vector<uint8_t>> parameters_before;
    for (const Tensor& parameter : model.parameters()) parameters_before.push_back(bytes_of(parameter));
    const MemoryStats before = memory_stats(Device::cpu);

    StepResult result;
    manual_seed(dropout_seed);
    for (const MicroBatch& micro : batches) {
        Tensor loss = micro_batch_loss(model, micro, items);
        result.losses.push_back(static_cast<float>(loss.item()));
        checkpoint::reset_recomputed_segment_count();
        backward(loss);
        result.recomputed.push_back(checkpoint::recomputed_segment_count());
        EXPECT_TRUE(current_tape().empty()) << policy.to_string() << ": nodes left on the tape";
    }
    result.rng_after = rng_state();
    for (const Tensor& parameter : model.parameters()) result.gradients.push_back(bytes_of(parameter.grad()));

    const MemoryStats after = memory_stats(Device::cpu);
    for (MemoryCategory category : {MemoryCategory::activations, MemoryCategory::workspace,
                                    MemoryCategory::pinned_host, MemoryCategory::gradients})
        EXPECT_EQ(after.current(category), before.current(category))
            << policy.to_string() << ": " << memory_category_name(category) << " not back to its baseline";
    const std::vector<Tensor> parameters = model.parameters();
    for (size_t index = 0; index < parameters.size(); ++index)
        EXPECT_TRUE(bytes_of(parameters[index]) == parameters_before[index])
            << policy.to_string() << ": parameter " << parameters[index].name() << " changed";
    return result;
}

class Checkpoint : public TapeTest {};

TEST_F(Checkpoint, EveryPolicyIsBitwiseIdenticalWithAccumulationAndDropout) {
    const std::vector<MicroBatch> batches = make_micro_batches(generator, 3, small_config().vocab_size);
    const StepResult plain = accumulated_step(CheckpointPolicy{}, batches);
    for (size_t count : plain.recomputed) EXPECT_EQ(count, 0u);

    struct Case {
        CheckpointPolicy policy;
        size_t segments; // checkpointed segments over 6 blocks
    };
    std::vector<Case> cases;
    for (bool offload : {false, true}) {
        cases.push_back({every_n(1, 1, offload), 6});
        cases.push_back({every_n(2, 1, offload), 3}); // blocks 1, 3, 5
        cases.push_back({every_n(3, 1, offload), 2}); // blocks 1, 4
        cases.push_back({every_n(6, 1, offload), 1}); // n = L: block 1 only
        cases.push_back({every_n(1, 2, offload), 3}); // [1-2] [3-4] [5-6]
        cases.push_back({every_n(1, 0, offload), 2}); // sqrt: ceil(sqrt 6) = 3: [1-3] [4-6]
        cases.push_back({every_n(2, 2, offload), 2}); // [1-2] CP, [3-4] keep, [5-6] CP
    }
    for (const Case& test_case : cases) {
        SCOPED_TRACE(test_case.policy.to_string());
        const StepResult checkpointed = accumulated_step(test_case.policy, batches);
        ASSERT_EQ(checkpointed.losses.size(), plain.losses.size());
        for (size_t index = 0; index < plain.losses.size(); ++index)
            EXPECT_EQ(std::memcmp(&checkpointed.losses[index], &plain.losses[index], sizeof(float)), 0)
                << "micro-batch " << index << " loss " << checkpointed.losses[index] << " vs " << plain.losses[index];
        ASSERT_EQ(checkpointed.gradients.size(), plain.gradients.size());
        size_t differing = 0;
        for (size_t index = 0; index < plain.gradients.size(); ++index)
            differing += checkpointed.gradients[index] != plain.gradients[index];
        EXPECT_EQ(differing, 0u) << "parameter gradients not bitwise equal";
        for (size_t count : checkpointed.recomputed) EXPECT_EQ(count, test_case.segments);
        EXPECT_EQ(checkpointed.rng_after.offset, plain.rng_after.offset);
        EXPECT_EQ(checkpointed.rng_after.seed, plain.rng_after.seed);
    }
}

// The bitwise test above could pass vacuously if dropout drew nothing; it does draw, and it matters.
TEST_F(Checkpoint, DropoutIsActiveSoReplayIsExercised) {
    const std::vector<MicroBatch> batches = make_micro_batches(generator, 1, small_config().vocab_size);
    nn::GPT model(small_config(), model_seed);
    model.train(true);
    model.set_checkpointing(every_n(1));
    manual_seed(dropout_seed);
    const double first = micro_batch_loss(model, batches[0], 1).item();
    const uint64_t offset = rng_state().offset;
    // embedding dropout + 2 per block, each over B·T·C values
    EXPECT_EQ(offset, static_cast<uint64_t>((1 + 2 * 6) * batch * seq_len * 32));
    manual_seed(dropout_seed + 1);
    const double other = micro_batch_loss(model, batches[0], 1).item();
    EXPECT_NE(first, other);
    current_tape().clear();
}

TEST_F(Checkpoint, LeavesOneNodeSavingOnlyItsInputs) {
    Tensor input = random_leaf(generator, {3, 4});
    Tensor weight = random_leaf(generator, {4, 4});
    auto segment = [&](const std::vector<Tensor>& inputs) {
        return std::vector<Tensor>{gelu(linear(gelu(linear(inputs[0], weight)), weight))};
    };
    const size_t activations_before = memory_stats(Device::cpu).current(MemoryCategory::activations);
    std::vector<Tensor> outputs = checkpoint::checkpoint(segment, {input});
    ASSERT_EQ(current_tape().size(), 1u);
    EXPECT_EQ(current_tape().nodes()[0].op, "checkpoint");
    EXPECT_TRUE(outputs[0].requires_grad());
    // Only the output is new: the intermediates died in forward, the saved input is the caller's storage.
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::activations) - activations_before,
              outputs[0].nbytes());
    backward(sum(outputs[0]));
    const std::vector<double> checkpointed = weight.grad().to_vector<double>();
    const std::vector<double> input_gradient = input.grad().to_vector<double>();
    zero_grad({input, weight});
    backward(sum(segment({input})[0]));
    // The weight accumulates inside the recompute exactly as in the plain run. The leaf input's gradient
    // takes one extra step, local buffer then += into its zeroed persistent buffer, and 0 + v is exact.
    EXPECT_EQ(checkpointed, weight.grad().to_vector<double>());
    EXPECT_EQ(input_gradient, input.grad().to_vector<double>());
}

TEST_F(Checkpoint, NoGradIsAPlainCallAndIdentityLeavesTheInputALeaf) {
    Tensor input = random_leaf(generator, {2, 3});
    {
        NoGradGuard no_grad;
        checkpoint::checkpoint([](const std::vector<Tensor>& inputs) { return std::vector<Tensor>{gelu(inputs[0])}; },
                               {input});
        EXPECT_TRUE(current_tape().empty());
    }
    std::vector<Tensor> same =
        checkpoint::checkpoint([](const std::vector<Tensor>& inputs) { return inputs; }, {input});
    EXPECT_TRUE(input.is_leaf()) << "the caller's tensor must not become an op output";
    EXPECT_NE(same[0].id(), input.id());
    backward(sum(same[0]));
    for (double value : input.grad().to_vector<double>()) EXPECT_EQ(value, 1.0);
}

TEST_F(Checkpoint, RecomputeFailureRestoresTheRngStream) {
    Tensor input = random_leaf(generator, {2, 3});
    bool fail = false;
    auto segment = [&](const std::vector<Tensor>& inputs) {
        Tensor out = dropout(inputs[0], 0.5f);
        ENGINE_CHECK(!fail, "segment refused to recompute");
        return std::vector<Tensor>{out};
    };
    manual_seed(5);
    Tensor loss = sum(checkpoint::checkpoint(segment, {input})[0]);
    const RngState after_forward = rng_state();
    fail = true;
    EXPECT_THROW(backward(loss), EngineError);
    EXPECT_EQ(rng_state().offset, after_forward.offset);
    current_tape().clear();
}

TEST(CheckpointPlan, SpecExampleEveryTwoOverSixLayers) {
    const std::vector<Segment> segments = checkpoint::plan_segments(6, every_n(2));
    ASSERT_EQ(segments.size(), 6u);
    const bool expected[] = {true, false, true, false, true, false}; // L1 CP, L2 keep, L3 CP, ...
    for (int layer = 0; layer < 6; ++layer) {
        EXPECT_EQ(segments[layer].first_layer, layer);
        EXPECT_EQ(segments[layer].layer_count, 1);
        EXPECT_EQ(segments[layer].checkpointed, expected[layer]) << "layer " << layer + 1;
    }
}

TEST(CheckpointPlan, AllNoneSegmentsAndSqrt) {
    for (const Segment& segment : checkpoint::plan_segments(5, every_n(1))) EXPECT_TRUE(segment.checkpointed);
    for (const Segment& segment : checkpoint::plan_segments(5, CheckpointPolicy{})) EXPECT_FALSE(segment.checkpointed);
    EXPECT_EQ(checkpoint::plan_segments(5, every_n(1)).size(), 5u);
    // n = L: only the first layer.
    const std::vector<Segment> first_only = checkpoint::plan_segments(6, every_n(6));
    EXPECT_TRUE(first_only[0].checkpointed);
    for (size_t index = 1; index < first_only.size(); ++index) EXPECT_FALSE(first_only[index].checkpointed);
    // sqrt over 10 layers: ceil(3.16) = 4 -> [1-4] [5-8] [9-10].
    const std::vector<Segment> root = checkpoint::plan_segments(10, every_n(1, 0));
    ASSERT_EQ(root.size(), 3u);
    EXPECT_EQ(root[0].first_layer, 0);
    EXPECT_EQ(root[0].layer_count, 4);
    EXPECT_EQ(root[1].first_layer, 4);
    EXPECT_EQ(root[2].first_layer, 8);
    EXPECT_EQ(root[2].layer_count, 2);
    for (const Segment& segment : root) EXPECT_TRUE(segment.checkpointed);
    // Groups of 2, every 2nd group: [1-2] CP, 3 keep, 4 keep, [5-6] CP.
    const std::vector<Segment> mixed = checkpoint::plan_segments(6, every_n(2, 2));
    ASSERT_EQ(mixed.size(), 4u);
    EXPECT_TRUE(mixed[0].checkpointed && mixed[0].layer_count == 2);
    EXPECT_FALSE(mixed[1].checkpointed || mixed[2].checkpointed);
    EXPECT_TRUE(mixed[3].checkpointed && mixed[3].first_layer == 4);
}

TEST(CheckpointPlan, BadValuesThrowClearlyAndChangeNothing) {
    for (int n : {0, -1}) {
        try {
            checkpoint::plan_segments(6, every_n(n));
            FAIL() << "every_n_layers " << n << " accepted";
        } catch (const EngineError& error) {
            EXPECT_NE(std::string(error.what()).find("every_n_layers"), std::string::npos) << error.what();
        }
    }
    EXPECT_THROW(checkpoint::plan_segments(6, every_n(1, -2)), EngineError);
    nn::GPT model(small_config(), model_seed);
    model.set_checkpointing(every_n(2));
    EXPECT_THROW(model.set_checkpointing(every_n(0)), EngineError);
    EXPECT_EQ(model.checkpointing().every_n_layers, 2);
    EXPECT_EQ(model.segments().size(), 6u);
}

// ---- memory, as the allocator counts it ----

struct StepMemory {
    size_t activation_peak = 0;         // over forward + backward, above what was live before
    size_t activations_after_forward = 0;
    size_t pinned_after_forward = 0;
};

StepMemory measure_step(const nn::GPT& model, const MicroBatch& micro) {
    current_tape().clear();
    const size_t baseline = memory_stats(Device::cpu).current(MemoryCategory::activations);
    reset_peak(Device::cpu);
    StepMemory memory;
    Tensor loss = micro_batch_loss(model, micro, 1);
    const MemoryStats after_forward = memory_stats(Device::cpu);
    memory.activations_after_forward = after_forward.current(MemoryCategory::activations) - baseline;
    memory.pinned_after_forward = after_forward.current(MemoryCategory::pinned_host);
    backward(loss);
    memory.activation_peak = memory_stats(Device::cpu).peak(MemoryCategory::activations) - baseline;
    return memory;
}

TEST_F(Checkpoint, ActivationPeakIsStrictlyOrderedByPolicy) {
    const nn::GPTConfig config = small_config();
    const std::vector<MicroBatch> batches = make_micro_batches(generator, 1, config.vocab_size);
    nn::GPT model(config, model_seed);
    model.train(true);
    std::vector<std::pair<CheckpointPolicy, size_t>> peaks;
    for (const CheckpointPolicy& policy : {CheckpointPolicy{}, every_n(2), every_n(1), every_n(1, 1, true)}) {
        model.set_checkpointing(policy);
        peaks.emplace_back(policy, measure_step(model, batches[0]).activation_peak);
        std::printf("  %-40s activation peak %zu B\n", policy.to_string().c_str(), peaks.back().second);
    }
    for (size_t index = 1; index < peaks.size(); ++index)
        EXPECT_GT(peaks[index - 1].second, peaks[index].second)
            << peaks[index - 1].first.to_string() << " vs " << peaks[index].first.to_string();
}

TEST_F(Checkpoint, OffloadKeepsNoSavedInputOnTheDeviceAndExactBytesPinned) {
    const nn::GPTConfig config = small_config();
    const std::vector<MicroBatch> batches = make_micro_batches(generator, 1, config.vocab_size);
    nn::GPT model(config, model_seed);
    model.train(true);
    const size_t element = sizeof(float);
    const size_t stream = static_cast<size_t>(batch) * seq_len * config.n_embd * element; // one (B,T,C)
    for (const CheckpointPolicy& policy : {every_n(1), every_n(2), every_n(1, 0)}) {
        SCOPED_TRACE(policy.to_string());
        size_t checkpointed = 0;
        for (const Segment& segment : checkpoint::plan_segments(config.n_layer, policy))
            checkpointed += segment.checkpointed;
        model.set_checkpointing(policy);
        const StepMemory kept = measure_step(model, batches[0]);
        CheckpointPolicy offloaded = policy;
        offloaded.offload = true;
        model.set_checkpointing(offloaded);
        const StepMemory moved = measure_step(model, batches[0]);
        EXPECT_EQ(kept.pinned_after_forward, 0u);
        EXPECT_EQ(moved.pinned_after_forward, checkpointed * stream);
        // Exactly the saved segment inputs left the device: 0 bytes of them remain.
        EXPECT_EQ(kept.activations_after_forward - moved.activations_after_forward, checkpointed * stream);
        EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::pinned_host), 0u) << "pinned bytes not returned";
    }
    // With every block checkpointed and offloaded, what the device keeps after forward is the head alone:
    // ln_f's input, mean, rstd and output, the logits, and the (1) loss.
    model.set_checkpointing(every_n(1, 1, true));
    const size_t rows = static_cast<size_t>(batch) * seq_len;
    const size_t head = 2 * stream + 2 * rows * element + rows * config.vocab_size * element + element;
    EXPECT_EQ(measure_step(model, batches[0]).activations_after_forward, head);
}

TEST_F(Checkpoint, PinnedPoolIsReusedAcrossMicroBatchesAndSteps) {
    const nn::GPTConfig config = small_config();
    const std::vector<MicroBatch> batches = make_micro_batches(generator, 2, config.vocab_size);
    nn::GPT model(config, model_seed);
    model.train(true);
    model.set_checkpointing(every_n(1, 1, true));
    auto pinned_system_allocations = [] {
        return memory_stats(Device::cpu).system_allocations_for(MemoryCategory::pinned_host);
    };
    const size_t before = pinned_system_allocations();
    auto step = [&] {
        for (const MicroBatch& micro : batches) backward(micro_batch_loss(model, micro, 1));
        model.zero_grad();
    };
    step();
    const size_t after_first = pinned_system_allocations();
    EXPECT_LE(after_first - before, static_cast<size_t>(config.n_layer)) << "more pinned buffers than segments";
    EXPECT_GT(memory_stats(Device::cpu).cached_bytes, 0u) << "the pool kept nothing for reuse";
    for (int repeat = 0; repeat < 3; ++repeat) step();
    EXPECT_EQ(pinned_system_allocations(), after_first) << "a later step allocated new pinned memory";
}

} // namespace
} // namespace engine::testing
