// Tape semantics: accumulation, zero_grad, no-grad, memory release during backward, and bad input that
// throws with a clear message and changes nothing.
#include <gtest/gtest.h>

#include <set>

#include "engine/elementwise.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

class Autograd : public TapeTest {};

Tensor small_model_loss(const Tensor& input, const Tensor& weight, const Tensor& bias) {
    return sum(gelu(linear(input, weight, bias)));
}

TEST_F(Autograd, TwoBackwardsAddAndZeroGradResetsInPlace) {
    Tensor input = random_tensor(generator, {4, 6});
    Tensor weight = random_leaf(generator, {6, 3});
    Tensor bias = random_leaf(generator, {3});
    backward(small_model_loss(input, weight, bias));
    const std::vector<double> once = weight.grad().to_vector<double>();
    const void* buffer_before = weight.grad().raw_data();
    const size_t gradient_bytes = memory_stats(Device::cpu).current(MemoryCategory::gradients);

    backward(small_model_loss(input, weight, bias));
    const std::vector<double> twice = weight.grad().to_vector<double>();
    for (size_t index = 0; index < once.size(); ++index) EXPECT_DOUBLE_EQ(twice[index], 2.0 * once[index]);

    zero_grad({weight, bias});
    for (double value : weight.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
    EXPECT_EQ(weight.grad().raw_data(), buffer_before) << "zero_grad must not reallocate";
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::gradients), gradient_bytes);
}

TEST_F(Autograd, SeedScaleScalesGradients) {
    Tensor input = random_tensor(generator, {4, 6});
    Tensor weight = random_leaf(generator, {6, 3});
    Tensor bias = random_leaf(generator, {3});
    backward(small_model_loss(input, weight, bias));
    const std::vector<double> unit = weight.grad().to_vector<double>();
    zero_grad({weight, bias});
    backward(small_model_loss(input, weight, bias), BackwardOptions{0.25});
    const std::vector<double> scaled = weight.grad().to_vector<double>();
    for (size_t index = 0; index < unit.size(); ++index) EXPECT_NEAR(scaled[index], 0.25 * unit[index], 1e-15);
}

TEST_F(Autograd, NoGradGuardRecordsNothing) {
    Tensor weight = random_leaf(generator, {6, 3});
    Tensor input = random_tensor(generator, {2, 6});
    {
        NoGradGuard no_grad;
        Tensor out = gelu(linear(input, weight));
        EXPECT_FALSE(out.requires_grad());
        EXPECT_TRUE(current_tape().empty());
    }
    Tensor out = gelu(linear(input, weight));
    EXPECT_TRUE(out.requires_grad());
    EXPECT_EQ(current_tape().size(), 2u);
}

TEST_F(Autograd, TapeIsEmptyAfterBackward) {
    Tensor weight = random_leaf(generator, {6, 3});
    Tensor input = random_tensor(generator, {2, 6});
    backward(sum(gelu(linear(input, weight))));
    EXPECT_TRUE(current_tape().empty());
}

// An identity node whose backward records the activation bytes. backward() runs it right after the node
// recorded just after it, so it reads the memory as that node's backward left it, while the real walk goes on.
using MemoryLog = std::vector<std::pair<std::string, size_t>>;
Tensor probe(const Tensor& input, const std::string& next_op, MemoryLog& log) {
    Tensor out = input.detach();
    const GradTarget target(input);
    record_node("probe", {&input}, {&out}, [target, next_op, &log, output_id = out.id()](BackwardContext& context) {
        log.emplace_back(next_op, memory_stats(Device::cpu).current(MemoryCategory::activations));
        const Tensor dout = context.output_grad(output_id);
        if (!context.adopt_input_grad(target, dout)) accumulate_into(context.input_grad(target), dout);
    });
    return out;
}

TEST_F(Autograd, SavedTensorsAreFreedNodeByNodeAndActivationsReturnToBaseline) {
    Tensor token_table = random_leaf(generator, {13, 12}, 0.1);
    Tensor position_table = random_leaf(generator, {8, 12}, 0.1);
    Tensor ln_weight = random_leaf(generator, {12});
    Tensor ln_bias = random_leaf(generator, {12});
    Tensor qkv_weight = random_leaf(generator, {12, 36}, 0.1);
    Tensor tokens = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1}, {2, 7}, Device::cpu);
    Tensor targets = Tensor::from_vector<int32_t>({2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, -100}, {2, 7}, Device::cpu);
    const size_t baseline = memory_stats(Device::cpu).current(MemoryCategory::activations);

    MemoryLog log; // (op whose backward just finished, activation bytes then), in backward order
    Tensor loss;
    {
        Tensor x = embedding(tokens, token_table, position_table);
        Tensor h = layernorm(probe(x, "layernorm", log), ln_weight, ln_bias);
        Tensor qkv = linear(probe(h, "linear", log), qkv_weight);
        Tensor y = attention(probe(qkv, "attention", log), 3);
        Tensor g = gelu(probe(y, "gelu", log));
        Tensor residual = add(x, probe(g, "add", log));
        Tensor logits = matmul(probe(residual, "matmul", log), token_table, true);
        loss = cross_entropy(probe(logits, "cross_entropy", log), targets);
    }
    const size_t after_forward = memory_stats(Device::cpu).current(MemoryCategory::activations);
    EXPECT_GT(after_forward, baseline);

    backward(loss);
    ASSERT_EQ(log.size(), 7u);
    // Each node whose saved data nothing else holds frees it when its backward finishes, so activations fall
    // there, in the middle of the walk. (gelu's input is also attention's saved output; add saves nothing.)
    const std::set<std::string> frees = {"cross_entropy", "matmul", "attention", "linear", "layernorm"};
    size_t previous = after_forward;
    for (const auto& [op, bytes] : log) {
        EXPECT_LE(bytes, previous) << "activation bytes grew after " << op;
        if (frees.count(op)) EXPECT_LT(bytes, previous) << op << " kept its saved tensors";
        previous = bytes;
    }
    loss = Tensor();
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::activations), baseline);
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::workspace), 0u);
}

TEST_F(Autograd, CrossEntropyWithEveryTargetIgnoredIsZeroNotNaN) {
    Tensor logits = random_leaf(generator, {3, 5});
    Tensor targets = Tensor::from_vector<int32_t>({-100, -100, -100}, {3}, Device::cpu);
    Tensor loss = cross_entropy(logits, targets, Reduction::mean);
    EXPECT_EQ(loss.item(), 0.0);
    backward(loss);
    for (double value : logits.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
}

TEST_F(Autograd, DropoutIdentityAtZeroAndReplayableMask) {
    Tensor input = random_tensor(generator, {1000}, DType::f32);
    Tensor same = dropout(input, 0.0f);
    EXPECT_EQ(same.to_vector<float>(), input.to_vector<float>());
    manual_seed(7);
    const std::vector<float> first = dropout(input, 0.5f).to_vector<float>();
    manual_seed(7);
    const std::vector<float> again = dropout(input, 0.5f).to_vector<float>();
    EXPECT_EQ(first, again);
    const std::vector<float> next = dropout(input, 0.5f).to_vector<float>();
    EXPECT_NE(first, next) << "the stream offset must advance between calls";
    int dropped = 0;
    for (float value : first) dropped += value == 0.0f;
    EXPECT_GT(dropped, 400);
    EXPECT_LT(dropped, 600);
}

// Bad input: the op throws naming itself and the shapes, records nothing and allocates nothing.
class BadInput : public Autograd {
protected:
    template <typename Function>
    void expect_rejected(Function&& function, const std::vector<std::string>& fragments) {
        const size_t tape_before = current_tape().size();
        const size_t activations_before = memory_stats(Device::cpu).current(MemoryCategory::activations);
        try {
            function();
            FAIL() << "expected an EngineError";
        } catch (const EngineError& error) {
            const std::string message = error.what();
            for (const std::string& fragment : fragments)
                EXPECT_NE(message.find(fragment), std::string::npos) << "message: " << message << "\nlacks: " << fragment;
        }
        EXPECT_EQ(current_tape().size(), tape_before);
        EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::activations), activations_before);
    }
};

TEST_F(BadInput, MismatchedShapes) {
    Tensor input = random_leaf(generator, {4, 6});
    Tensor weight = random_leaf(generator, {5, 3});
    expect_rejected([&] { linear(input, weight); }, {"linear", "(4,6)", "(5,3)"});
    Tensor other = random_leaf(generator, {4, 7});
    expect_rejected([&] { add(input, other); }, {"add", "(4,6)", "(4,7)"});
    Tensor ln_weight = random_leaf(generator, {5});
    expect_rejected([&] { layernorm(input, ln_weight, ln_weight); }, {"layernorm", "(5)", "(6)"});
    Tensor qkv = random_leaf(generator, {1, 3, 12});
    expect_rejected([&] { attention(qkv, 3); }, {"attention", "heads", "(1,3,12)"});
    Tensor f32 = random_tensor(generator, {4, 6}, DType::f32);
    expect_rejected([&] { add(input, f32); }, {"add", "dtype"});
}

TEST_F(BadInput, TokenIdOutsideVocabulary) {
    Tensor token_table = random_leaf(generator, {10, 4});
    Tensor position_table = random_leaf(generator, {8, 4});
    Tensor tokens = Tensor::from_vector<int32_t>({1, 2, 10, 3}, {1, 4}, Device::cpu);
    expect_rejected([&] { embedding(tokens, token_table, position_table); }, {"embedding", "token id 10", "[0,10)"});
    Tensor negative = Tensor::from_vector<int32_t>({1, -1}, {1, 2}, Device::cpu);
    expect_rejected([&] { embedding(negative, token_table, position_table); }, {"embedding", "token id -1"});
    Tensor too_long = Tensor::from_vector<int32_t>(std::vector<int32_t>(9, 0), {1, 9}, Device::cpu);
    expect_rejected([&] { embedding(too_long, token_table, position_table); }, {"embedding", "sequence length 9"});
}

TEST_F(BadInput, LabelOutOfRangeThatIsNotIgnoreIndex) {
    Tensor logits = random_leaf(generator, {3, 5});
    Tensor targets = Tensor::from_vector<int32_t>({0, 5, -100}, {3}, Device::cpu);
    expect_rejected([&] { cross_entropy(logits, targets); }, {"cross_entropy", "label 5", "ignore_index"});
    Tensor negative = Tensor::from_vector<int32_t>({0, -7, 1}, {3}, Device::cpu);
    expect_rejected([&] { cross_entropy(logits, negative); }, {"cross_entropy", "label -7"});
}

TEST_F(BadInput, BackwardOfNonScalarOrUntrackedLoss) {
    Tensor input = random_tensor(generator, {3});
    EXPECT_THROW(backward(input), EngineError);
    Tensor leaf = random_leaf(generator, {3});
    EXPECT_THROW(backward(gelu(leaf)), EngineError);
    current_tape().clear();
}

TEST_F(BadInput, CudaTensorWhereNoneCanExist) {
    if (ENGINE_HAS_CUDA) GTEST_SKIP() << "this build has CUDA; tests/cuda covers the no-device error";
    try {
        Tensor::zeros({4}, DType::f32, Device::cuda);
        FAIL() << "expected an EngineError";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("built without CUDA"), std::string::npos) << error.what();
    }
}

TEST(Memory, StatsTrackCategoriesAndPeaks) {
    reset_peak(Device::cpu);
    const MemoryStats before = memory_stats(Device::cpu);
    {
        Tensor parameters = Tensor::zeros({256}, DType::f32, Device::cpu, MemoryCategory::parameters);
        Tensor scratch = Tensor::zeros({1024}, DType::f64, Device::cpu, MemoryCategory::workspace);
        const MemoryStats during = memory_stats(Device::cpu);
        EXPECT_EQ(during.current(MemoryCategory::parameters), before.current(MemoryCategory::parameters) + 1024);
        EXPECT_EQ(during.current(MemoryCategory::workspace), before.current(MemoryCategory::workspace) + 8192);
    }
    const MemoryStats after = memory_stats(Device::cpu);
    EXPECT_EQ(after.current_bytes, before.current_bytes);
    EXPECT_EQ(after.peak_bytes, before.current_bytes + 1024 + 8192);
    EXPECT_EQ(after.peak(MemoryCategory::workspace), before.current(MemoryCategory::workspace) + 8192);
    reset_peak(Device::cpu);
    EXPECT_EQ(memory_stats(Device::cpu).peak_bytes, after.current_bytes);
}

} // namespace
} // namespace engine::testing

namespace engine::testing {
namespace {

TEST_F(Autograd, SecondBackwardOfAConsumedGraphIsRefusedNotSilentlyEmpty) {
    Tensor x = random_leaf(generator, {3});
    Tensor g = gelu(x);
    Tensor first = sum(g);
    Tensor second = sum(multiply(g, 3.0));
    backward(first); // consumes the whole tape, the second loss's branch included
    try {
        backward(second);
        FAIL() << "backward of a loss whose nodes are gone must throw";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("not on the current tape"), std::string::npos) << error.what();
    }
}

TEST_F(Autograd, FailingNodeLeavesAnEmptyTape) {
    Tensor x = random_leaf(generator, {4});
    Tensor y = gelu(x);
    Tensor z = gelu(y);
    // A node whose backward fails, e.g. an allocation that cannot be met, between two healthy ones.
    Tensor out = Tensor::zeros({1}, DType::f64, Device::cpu);
    record_node("failing", {&z}, {&out}, [](BackwardContext&) { ENGINE_FAIL("failing node: on purpose"); });
    EXPECT_EQ(current_tape().size(), 3u);
    EXPECT_THROW(backward(out), EngineError);
    EXPECT_TRUE(current_tape().empty()) << "the rest of the graph must not linger for the next walk";
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::workspace), 0u);
}

TEST_F(BadInput, ZeroWidthAndBadReshapeAreErrorsNotCrashes) {
    Tensor empty_rows = Tensor::zeros({4, 0}, DType::f64, Device::cpu);
    Tensor no_channels = Tensor::zeros({0}, DType::f64, Device::cpu);
    expect_rejected([&] { layernorm(empty_rows, no_channels, no_channels); }, {"layernorm", "no channels"});
    Tensor input = random_leaf(generator, {2, 2});
    expect_rejected([&] { input.reshape({-2, -2}); }, {"reshape", "(-2,-2)"});
    expect_rejected([&] { input.reshape({int64_t{1} << 62, 4}); }, {"reshape", "invalid extent"});
}

TEST_F(BadInput, RejectedDropoutLeavesTheRandomStreamWhereItWas) {
    manual_seed(11);
    Tensor integers = Tensor::zeros({100}, DType::i32, Device::cpu);
    expect_rejected([&] { dropout(integers, 0.5f); }, {"dropout", "not floating-point"});
    EXPECT_EQ(rng_state().offset, 0u);
}

} // namespace
} // namespace engine::testing
