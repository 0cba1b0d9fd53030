// Module::to(Device::cuda): a Sequential moved to the device computes what the CPU computes (forward and
// every gradient), GPT moved there equals GPT built there bitwise (padded table and bf16 working copies
// included), and an optimizer built before the move refuses to step.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/sequential.h"
#include "optim/optimizer.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

using ModulesCudaTest = CudaKernelTest;

void build(nn::Sequential& model, uint64_t seed) {
    const nn::ParameterOptions options{std::make_shared<nn::Generator>(seed)};
    model.emplace<nn::Linear>(16, 32, true, options);
    model.emplace<nn::GELU>();
    model.emplace<nn::LayerNorm>(32, options);
    model.emplace<nn::Dropout>(0.25f);
    model.emplace<nn::Linear>(32, 8, true, options);
    model.emplace<nn::Lambda>([](const Tensor& x) { return gelu(x); });
}

struct ModelRun {
    std::vector<float> output, input_gradient;
    std::vector<std::pair<std::string, std::vector<float>>> gradients;
};

// loss = Σ output·weights, so every output element's gradient path is used; the same dropout masks on both
// devices (the counter-based stream, reseeded).
ModelRun forward_backward(nn::Sequential& model, const std::vector<float>& input_values,
                     const std::vector<float>& loss_weights, Device device) {
    constexpr int64_t batch = 4, time = 6, rows = batch * time;
    Tensor input = Tensor::from_vector<float>(input_values, {batch, time, 16}, Device::cpu).to(device);
    input.set_requires_grad(true);
    const Tensor weights = Tensor::from_vector<float>(loss_weights, {rows * 8, 1}, Device::cpu).to(device);
    engine::manual_seed(91);
    const Tensor output = model(input);
    backward(matmul(output.reshape({1, rows * 8}), weights));
    ModelRun run{output.to_vector<float>(), input.grad().to_vector<float>(), {}};
    for (const auto& [name, parameter] : model.named_parameters())
        run.gradients.emplace_back(name, parameter.grad().to_vector<float>());
    current_tape().clear();
    return run;
}

// Both devices compute in float32 (TF32 off) and differ only in summation order. Unit roundoff u = 2^-24; the
// longest reductions are 32 terms (the second GEMM's K, LayerNorm's width) and the weight gradients' 24-row
// sums, whose worst-case error is n·u ≈ 2e-6 of their Σ|terms| on each device; five stages chain, and
// LayerNorm's 1/σ (σ of the 32 GELU outputs, about 0.3 here) can triple an error: about 2·32·u·5·3 ≈ 6e-5 of
// the values' scale. atol 1e-4 of each tensor's rms and rtol 1e-4 hold that with margin; the printed maxima
// show how much.
Tolerance moved_tolerance(const std::vector<float>& expected) {
    double sum_of_squares = 0.0;
    for (float value : expected) sum_of_squares += static_cast<double>(value) * value;
    const double rms = std::sqrt(sum_of_squares / static_cast<double>(std::max<size_t>(expected.size(), 1)));
    return Tolerance{1e-4 * std::max(rms, 1e-6), 1e-4};
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
    const ::testing::AssertionResult result = all_close(actual, expected, moved_tolerance(expected), what);
    EXPECT_TRUE(result);
    std::cout << "[ compare  ] " << result.message() << "\n";
}

TEST_F(ModulesCudaTest, SequentialMovedToCudaMatchesTheCpu) {
    nn::Sequential cpu_model, cuda_model;
    build(cpu_model, 17);
    build(cuda_model, 17);
    const Tensor held = cuda_model.named_parameters()[0].second; // taken before the move
    const uint64_t held_id = held.id();
    cuda_model.to(Device::cuda);
    EXPECT_EQ(held.device(), Device::cuda) << "a handle taken before the move sees the moved parameter";
    EXPECT_EQ(held.id(), held_id);
    const auto named = cuda_model.named_parameters();
    ASSERT_EQ(named.size(), cpu_model.named_parameters().size());
    for (const auto& [name, parameter] : named) {
        EXPECT_EQ(parameter.device(), Device::cuda) << name;
        EXPECT_EQ(parameter.grad().device(), Device::cuda) << name;
        EXPECT_EQ(parameter.name(), name.substr(name.find('.') + 1)) << "names kept";
    }

    const std::vector<float> input = random_floats(4 * 6 * 16), loss_weights = random_floats(4 * 6 * 8);
    const ModelRun on_cpu = forward_backward(cpu_model, input, loss_weights, Device::cpu);
    const ModelRun on_cuda = forward_backward(cuda_model, input, loss_weights, Device::cuda);
    expect_close(on_cuda.output, on_cpu.output, "output");
    expect_close(on_cuda.input_gradient, on_cpu.input_gradient, "input gradient");
    ASSERT_EQ(on_cuda.gradients.size(), on_cpu.gradients.size());
    for (size_t index = 0; index < on_cpu.gradients.size(); ++index)
        expect_close(on_cuda.gradients[index].second, on_cpu.gradients[index].second,
                     "gradient of " + on_cpu.gradients[index].first);

    // And back: the values survive the round trip bitwise.
    nn::Sequential reference;
    build(reference, 17);
    cuda_model.zero_grad();
    cuda_model.to(Device::cpu);
    const auto back = cuda_model.named_parameters(), original = reference.named_parameters();
    for (size_t index = 0; index < back.size(); ++index) {
        EXPECT_EQ(back[index].second.device(), Device::cpu);
        EXPECT_EQ(back[index].second.to_vector<float>(), original[index].second.to_vector<float>())
            << back[index].first;
    }
}

// GPT built on the CPU and moved equals GPT built on the device: the same parameters, and so bitwise the same
// logits from the same kernels. The tiny model's vocabulary (256) is padded to itself; a 200-token one puts
// the padded table (a registered alias of wte.weight) through the move, and bf16 its working copies.
TEST_F(ModulesCudaTest, GptMovedToCudaEqualsGptBuiltThere) {
    nn::GPTConfig config = nn::GPTConfig::named("tiny");
    config.vocab_size = 200; // padded to 256
    const std::vector<int32_t> ids = random_ints(2 * 16, 0, config.vocab_size - 1);
    const Tensor tokens = Tensor::from_vector<int32_t>(ids, {2, 16}, Device::cpu).to(Device::cuda);
    for (const DType dtype : {DType::f32, DType::bf16}) {
        nn::GPT moved(config, 5, Device::cpu, dtype);
        moved.to(Device::cuda);
        nn::GPT built(config, 5, Device::cuda, dtype);
        EXPECT_EQ(moved.device(), Device::cuda);
        EXPECT_EQ(moved.wte.padded_weight.device(), Device::cuda);
        EXPECT_EQ(moved.wte.padded_weight.raw_data(), moved.wte.weight.raw_data()) << "still one allocation";
        const auto a = moved.named_parameters(), b = built.named_parameters();
        ASSERT_EQ(a.size(), b.size());
        for (size_t index = 0; index < a.size(); ++index)
            EXPECT_EQ(a[index].second.to_vector<float>(), b[index].second.to_vector<float>()) << a[index].first;
        EXPECT_EQ(moved.working(moved.wte.padded_weight).device(), Device::cuda);
        const Tensor moved_logits = moved.forward_padded(tokens), built_logits = built.forward_padded(tokens);
        EXPECT_EQ(moved_logits.dtype(), dtype);
        // bf16 widens to f32 exactly, so comparing the widened values is comparing the bits.
        EXPECT_EQ(cast(moved_logits, DType::f32).to_vector<float>(), cast(built_logits, DType::f32).to_vector<float>())
            << dtype_name(dtype);
        current_tape().clear();
    }
}

TEST_F(ModulesCudaTest, AnOptimizerBuiltBeforeTheMoveRefusesToStep) {
    nn::Sequential model;
    build(model, 23);
    optim::AdamW before(model.named_parameters(), optim::AdamWOptions{});
    model.to(Device::cuda);
    try {
        before.step();
        FAIL() << "expected an EngineError";
    } catch (const EngineError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("'0.weight' is on cuda but its state on cpu"), std::string::npos) << message;
        EXPECT_NE(message.find("after to()"), std::string::npos) << message;
    }
    optim::AdamW after(model.named_parameters(), optim::AdamWOptions{});
    const std::vector<float> start = model.parameters()[0].to_vector<float>();
    model.parameters()[0].grad().copy_from(Tensor::full(model.parameters()[0].shape(), 1.0, DType::f32, Device::cpu));
    after.step();
    EXPECT_NE(model.parameters()[0].to_vector<float>(), start) << "the optimizer built after to() trains the moved parameter";
}

} // namespace
} // namespace engine::test
