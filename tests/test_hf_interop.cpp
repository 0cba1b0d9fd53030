// Hugging Face interop with transformers itself as the oracle: a tiny GPT-2 written by
// GPT2LMHeadModel.save_pretrained (its own safetensors: `transformer.` prefix, tied lm_head dropped) loads
// into libengine's GPT, whose logits and causal-LM loss must match transformers' (float32 both sides).
// Files from tests/golden/make_hf_gpt2_files.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/engine.h"
#include "hf_reference.h"
#include "nn/gpt.h"
#include "nn/io/safetensors.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

using Reference = HuggingFaceReference;
const auto read_reference = read_hf_reference;

TEST(HuggingFaceInterop, CheckpointWrittenByTransformersGivesItsLogitsAndLoss) {
    const std::string directory = std::string(ENGINE_TEST_DATA_DIR);
    const Reference reference = read_reference(directory + "/hf_gpt2_tiny.logits");
    // config.json of the checkpoint: vocab 64, n_positions 16, 2 layers, 4 heads, width 32, no dropout.
    nn::GPT model(nn::GPTConfig{64, 16, 2, 4, 32, 0.0f}, 1, Device::cpu, DType::f32);
    nn::load_safetensors_into(model, directory + "/hf_gpt2_tiny/model.safetensors");

    NoGradGuard no_grad;
    const Tensor tokens = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
    const std::vector<float> logits = model.forward(tokens).to_vector<float>();
    ASSERT_EQ(logits.size(), reference.logits.size());
    // Both sides are float32 with different summation orders; logits are O(1) and the observed difference
    // is ~1.2e-7 (a few ulps), so 1e-6 + 1e-5·|ref| leaves ~10x headroom yet catches a layout error (a
    // transposed Conv1D or a swapped q/k/v block moves logits by O(0.1)) or a changed GELU constant.
    double max_error = 0.0;
    for (size_t index = 0; index < logits.size(); ++index) {
        const double error = std::fabs(logits[index] - reference.logits[index]);
        max_error = std::max(max_error, error);
        ASSERT_LE(error, 1e-6 + 1e-5 * std::fabs(reference.logits[index]))
            << "logit " << index << ": engine " << logits[index] << ", transformers " << reference.logits[index];
    }
    std::printf("[ max |logit error| %.3g ]\n", max_error);

    // transformers' causal-LM loss: logits[:, :-1] against labels[:, 1:], mean over non -100 targets.
    std::vector<int32_t> shifted(reference.labels.size(), default_ignore_index);
    for (int row = 0; row < reference.batch; ++row)
        for (int t = 0; t + 1 < reference.time; ++t)
            shifted[static_cast<size_t>(row * reference.time + t)] = reference.labels[static_cast<size_t>(row * reference.time + t + 1)];
    const Tensor targets = Tensor::from_vector<int32_t>(shifted, {reference.batch, reference.time}, Device::cpu);
    const double loss = cross_entropy(model.forward(tokens), targets, Reduction::mean).item();
    EXPECT_NEAR(loss, reference.loss, 1e-5 * reference.loss);
}

// The same model as transformers stores it in bf16 (model.to(torch.bfloat16).save_pretrained; files from
// tests/golden/make_hf_gpt2_bf16.py): its BF16 tensors widen exactly into f32 masters, so an f32 forward gives
// transformers' f32 logits of those weights (same bound as above); and a mixed-precision run of it trains.
TEST(HuggingFaceInterop, Bf16CheckpointLoadsIntoF32MastersAndTrains) {
    const std::string directory = std::string(ENGINE_TEST_DATA_DIR);
    const Reference reference = read_reference(directory + "/hf_gpt2_tiny_bf16.logits");
    const std::string weights = directory + "/hf_gpt2_tiny_bf16/model.safetensors";
    const nn::GPTConfig config{64, 16, 2, 4, 32, 0.0f};
    {
        nn::GPT model(config, 1, Device::cpu, DType::f32);
        nn::load_safetensors_into(model, weights);
        for (const auto& [name, parameter] : model.named_parameters())
            for (float value : parameter.to_vector<float>())
                ASSERT_EQ(to_float(to_bfloat16(value)), value) << name << ": every master is a bf16 value";
        NoGradGuard no_grad;
        const Tensor tokens = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
        const std::vector<float> logits = model.forward(tokens).to_vector<float>();
        ASSERT_EQ(logits.size(), reference.logits.size());
        for (size_t index = 0; index < logits.size(); ++index)
            ASSERT_LE(std::fabs(logits[index] - reference.logits[index]), 1e-6 + 1e-5 * std::fabs(reference.logits[index]))
                << "logit " << index;
    }
    nn::GPT model(config, 1, Device::cpu, DType::f32);
    nn::load_safetensors_into(model, weights);
    optim::TrainerConfig training;
    training.shape.precision = Precision::bf16;
    training.shape.per_device_train_batch_size = reference.batch;
    training.learning_rate = 3e-3;
    training.max_steps = 30;
    optim::Trainer trainer(model, training);
    ASSERT_EQ(model.dtype(), DType::bf16);
    const nn::Batch batch{Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu),
                          Tensor::from_vector<int32_t>(reference.labels, {reference.batch, reference.time}, Device::cpu),
                          Tensor()};
    double first = 0.0, last = 0.0;
    for (int step = 0; step < 30; ++step) {
        const optim::StepResult result = trainer.apply_update(trainer.accumulate_gradients({batch}));
        if (step == 0) first = result.loss;
        last = result.loss;
    }
    // The first step's loss is transformers' own loss of these weights, up to bf16 activations (about 2^-8
    // relative on the logits, far below 5%); thirty steps on one batch must bring it well down.
    EXPECT_NEAR(first, reference.loss, 0.05 * reference.loss);
    EXPECT_LT(last, 0.5 * first) << "bf16 training did not reduce the loss: " << first << " -> " << last;
}

} // namespace
} // namespace engine::testing
