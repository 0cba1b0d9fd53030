// Non-finite values: a NaN or Inf in the loss or the gradient norm is caught before the optimizer step.
// By default the step throws naming the step and the first parameter with a non-finite gradient; with
// skip_nonfinite it is skipped and counted. Either way no weight and no optimizer moment changes.
#include <gtest/gtest.h>

#include <limits>

#include "gradcheck.h"
#include "nn/gpt.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

constexpr int vocabulary = 32;

std::vector<nn::Batch> random_batches(std::mt19937_64& generator, int count) {
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1);
    std::vector<nn::Batch> batches;
    for (int index = 0; index < count; ++index) {
        std::vector<int32_t> ids(2 * 8);
        for (int32_t& id : ids) id = token(generator);
        Tensor tokens = Tensor::from_vector<int32_t>(ids, {2, 8}, Device::cpu);
        batches.push_back({tokens, tokens.clone(), Tensor()});
    }
    return batches;
}

// Every parameter and optimizer moment, copied out.
std::vector<std::vector<float>> state_of(nn::GPT& model, optim::Trainer& trainer) {
    std::vector<std::vector<float>> values;
    for (const Tensor& parameter : model.parameters()) values.push_back(parameter.to_vector<float>());
    for (const auto& [name, tensor] : trainer.optimizer().named_state()) values.push_back(tensor.to_vector<float>());
    return values;
}

void poison_gradient(nn::GPT& model, const std::string& name, float value) {
    for (const auto& [parameter_name, parameter] : model.named_parameters()) {
        if (parameter_name != name) continue;
        std::vector<float> gradient = parameter.grad().to_vector<float>();
        gradient[3] = value;
        parameter.grad().copy_from(Tensor::from_vector<float>(gradient, parameter.shape(), Device::cpu));
        return;
    }
    FAIL() << "no parameter " << name;
}

class NonFinite : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
    nn::GPT model{nn::GPTConfig{vocabulary, 8, 2, 2, 16, 0.0f}, 7, Device::cpu, DType::f32};
    optim::TrainerConfig config() const {
        optim::TrainerConfig result;
        result.shape.gradient_accumulation_steps = 2;
        result.max_steps = 10;
        return result;
    }
};

TEST_F(NonFinite, InfiniteGradientStopsTheStepNamingStepAndParameter) {
    optim::Trainer trainer(model, config());
    const std::vector<std::vector<float>> before = state_of(model, trainer);
    const optim::Accumulation window = trainer.accumulate_gradients(random_batches(generator, 2));
    poison_gradient(model, "h.0.attn.c_proj.weight", std::numeric_limits<float>::infinity());
    try {
        trainer.apply_update(window);
        FAIL() << "a non-finite gradient must stop the step";
    } catch (const EngineError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("step 1"), std::string::npos) << message;
        EXPECT_NE(message.find("h.0.attn.c_proj.weight"), std::string::npos) << message;
    }
    EXPECT_EQ(state_of(model, trainer), before) << "nothing may be written into weights or moments";
    EXPECT_EQ(trainer.step(), 0);
    for (const Tensor& parameter : model.parameters())
        for (float value : parameter.grad().to_vector<float>()) ASSERT_EQ(value, 0.0f);
}

TEST_F(NonFinite, NaNWeightMakesANaNLossThatIsCaught) {
    optim::Trainer trainer(model, config());
    Tensor weight = model.h[1]->mlp.c_fc.weight;
    std::vector<float> values = weight.to_vector<float>();
    values[0] = std::numeric_limits<float>::quiet_NaN();
    weight.copy_from(Tensor::from_vector<float>(values, weight.shape(), Device::cpu));
    const std::vector<std::vector<float>> before = state_of(model, trainer);
    const std::vector<nn::Batch> batches = random_batches(generator, 2);
    size_t next = 0;
    nn::BatchSource source = [&]() -> std::optional<nn::Batch> { return batches[next++ % batches.size()]; };
    try {
        trainer.train_step(source);
        FAIL() << "a NaN loss must stop the step";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("non-finite"), std::string::npos) << error.what();
    }
    const std::vector<std::vector<float>> after = state_of(model, trainer);
    ASSERT_EQ(after.size(), before.size());
    for (size_t tensor = 0; tensor < after.size(); ++tensor)
        for (size_t index = 0; index < after[tensor].size(); ++index) {
            const float a = after[tensor][index], b = before[tensor][index];
            ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "tensor " << tensor << " element " << index;
        }
}

TEST_F(NonFinite, SkipNonfiniteSkipsCountsAndThenTrainsOn) {
    optim::TrainerConfig skipping = config();
    skipping.skip_nonfinite = true;
    optim::Trainer trainer(model, skipping);
    const std::vector<std::vector<float>> before = state_of(model, trainer);
    const optim::Accumulation window = trainer.accumulate_gradients(random_batches(generator, 2));
    poison_gradient(model, "ln_f.bias", std::numeric_limits<float>::quiet_NaN());
    const optim::StepResult skipped = trainer.apply_update(window);
    EXPECT_TRUE(skipped.skipped);
    EXPECT_EQ(trainer.skipped_steps(), 1);
    EXPECT_EQ(trainer.step(), 0);
    EXPECT_EQ(state_of(model, trainer), before);

    const optim::StepResult trained = trainer.apply_update(trainer.accumulate_gradients(random_batches(generator, 2)));
    EXPECT_FALSE(trained.skipped);
    EXPECT_EQ(trainer.step(), 1);
    EXPECT_NE(state_of(model, trainer), before) << "a finite step after a skip updates the weights";
}

} // namespace
} // namespace engine::testing
