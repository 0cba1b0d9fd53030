// One accumulated GPT step, done the way optim::Trainer does it, returning the loss and every parameter
// gradient: shared by the CUDA-vs-CPU GPT tests and the offload-prefetch tests. No CUDA headers, so the CPU
// suite includes it too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "nn/gpt.h"
#include "tests/cuda/compare.h"

namespace engine::test {

// Small, but with every feature that could diverge between devices: a vocabulary and length that are not
// block multiples, several heads and layers, and dropout so that replayed masks matter.
inline nn::GPTConfig small_gpt_config() {
    nn::GPTConfig config;
    config.vocab_size = 97;
    config.max_seq_len = 33;
    config.n_layer = 3;
    config.n_head = 4;
    config.n_embd = 48;
    config.dropout = 0.1f;
    return config;
}

struct MicroBatch {
    std::vector<int32_t> tokens;  // (B,T)
    std::vector<int32_t> targets; // (B,T), already shifted; -100 where ignored
};

// Fixed data (its own generator, not the engine RNG): `count` micro-batches of (batch, length) ids below
// `vocabulary` with a few ignored targets, the last position of every row ignored as in causal shifting.
inline std::vector<MicroBatch> make_token_micro_batches(int vocabulary, int length, int count, int batch,
                                                        uint32_t seed) {
    std::mt19937 generator(seed);
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1);
    std::bernoulli_distribution ignored(0.1);
    std::vector<MicroBatch> batches(static_cast<size_t>(count));
    for (MicroBatch& micro : batches) {
        std::vector<int32_t> row(static_cast<size_t>(length) + 1);
        for (int b = 0; b < batch; ++b) {
            for (int32_t& value : row) value = token(generator);
            for (int t = 0; t < length; ++t) {
                micro.tokens.push_back(row[static_cast<size_t>(t)]);
                const bool last = t == length - 1;
                micro.targets.push_back(last || ignored(generator) ? default_ignore_index
                                                                   : row[static_cast<size_t>(t) + 1]);
            }
        }
    }
    return batches;
}

// The GPT tests' data: sequences of the model's full length.
inline std::vector<MicroBatch> make_micro_batches(const nn::GPTConfig& config, int count, int batch,
                                                  uint32_t seed = 20240605) {
    return make_token_micro_batches(config.vocab_size, config.max_seq_len, count, batch, seed);
}

struct GptGradients {
    double loss = 0.0; // sum over micro-batches of token-loss sum / num_items_in_batch
    std::vector<std::pair<std::string, std::vector<float>>> gradients; // named_parameters order
};

// Builds the model on `device` from `model_seed` (initialisation is device-independent), seeds the engine
// RNG, and runs forward -> cross_entropy(sum) / num_items_in_batch -> backward per micro-batch without
// zeroing in between: the trainer's token-count normalisation.
inline GptGradients accumulate_gpt_gradients(Device device, const checkpoint::CheckpointPolicy& policy,
                                             const std::vector<MicroBatch>& batches, int batch,
                                             uint64_t model_seed = 7, uint64_t rng_seed = 1234) {
    const nn::GPTConfig config = small_gpt_config();
    nn::GPT model(config, model_seed, device);
    model.set_checkpointing(policy);
    manual_seed(rng_seed);
    int64_t num_items_in_batch = 0;
    for (const MicroBatch& micro : batches)
        for (int32_t target : micro.targets) num_items_in_batch += target != default_ignore_index ? 1 : 0;

    GptGradients result;
    const Shape shape{batch, config.max_seq_len};
    for (const MicroBatch& micro : batches) {
        const Tensor tokens = Tensor::from_vector<int32_t>(micro.tokens, shape, device);
        const Tensor targets = Tensor::from_vector<int32_t>(micro.targets, shape, device);
        Tensor loss;
        {
            const Tensor logits = model.forward(tokens); // (B,T,V)
            loss = multiply(cross_entropy(logits, targets, Reduction::sum),
                            1.0 / static_cast<double>(num_items_in_batch));
        }
        result.loss += loss.item();
        backward(loss);
    }
    for (const auto& [name, parameter] : model.named_parameters())
        result.gradients.emplace_back(name, parameter.grad().to_vector<float>());
    return result;
}

// Tolerances for accumulate_gpt_gradients() on CUDA against the CPU. Both devices compute in float32 but
// sum in different orders (cuBLAS vs OpenBLAS blocking, warp-shuffle vs sequential reductions in layernorm,
// softmax and the weight column sums, online vs two-pass softmax in attention), each rounding at about
// 6e-8 relative. The loss is one scalar summed over ~290 tokens: rtol 1e-5 is over 100 ulps.
// A gradient element is a sum of up to B*T*micro-batches = 297 products, carried back through 3 layernorms
// and attention; reordering a sum of n terms moves it by about eps*sqrt(n) ~ 1e-6 of the terms' size.
// Measured on the CPU for this very step, float32 against float64: the largest error in each tensor is
// 1e-6..3e-6 of that tensor's rms. So each tensor is compared on its own scale: atol = 1e-3 * rms(cpu
// tensor), rtol 1e-3, a margin of ~100x over two float32 results that each err by that much, while an
// element wrong by 1% of itself fails once it is over a tenth of the rms. A single atol cannot do this:
// the tensors' scales span 1e-5 (query/key parts of c_attn, max ~5e-5) to 4e-2 (c_proj biases), so an
// atol loose enough for the large ones would pass an 18% error in q/k. Hence also c_attn's q, k and v
// parts are compared separately. The key bias gradient is zero in exact arithmetic (softmax ignores a
// shift shared by all keys); float32 leaves residue near 3e-12 (measured), so its atol is floored at 1e-9,
// far under the ~1e-5 scale of any real q/k gradient.
inline constexpr Tolerance gpt_loss_tolerance{1e-6, 1e-5};
inline constexpr double gpt_gradient_atol_per_rms = 1e-3, gpt_gradient_atol_floor = 1e-9, gpt_gradient_rtol = 1e-3;

inline Tolerance gpt_gradient_tolerance(const std::vector<float>& cpu_gradient) {
    double sum_of_squares = 0.0;
    for (float value : cpu_gradient) sum_of_squares += static_cast<double>(value) * value;
    const double count = static_cast<double>(std::max<size_t>(cpu_gradient.size(), 1));
    const double rms = std::sqrt(sum_of_squares / count);
    return Tolerance{std::max(gpt_gradient_atol_per_rms * rms, gpt_gradient_atol_floor), gpt_gradient_rtol};
}

struct GradientPart {
    std::string name;
    std::vector<float> values;
};

// c_attn's weight (C,3C) and bias (3C) hold the query, key and value projections side by side, at scales
// orders of magnitude apart: each third of the columns is compared as its own tensor. Others pass whole.
inline std::vector<GradientPart> gradient_parts(const std::string& name, const std::vector<float>& values,
                                                int64_t channels) {
    const bool packed = name.ends_with("c_attn.weight") || name.ends_with("c_attn.bias");
    if (!packed) return {GradientPart{name, values}};
    const int64_t columns = 3 * channels, rows = static_cast<int64_t>(values.size()) / columns;
    std::vector<GradientPart> parts;
    for (const char* part : {"query", "key", "value"}) {
        const int64_t first_column = static_cast<int64_t>(parts.size()) * channels;
        GradientPart slice{name + " [" + part + " columns]", {}};
        for (int64_t row = 0; row < rows; ++row) {
            const auto begin = values.begin() + row * columns + first_column;
            slice.values.insert(slice.values.end(), begin, begin + channels);
        }
        parts.push_back(std::move(slice));
    }
    return parts;
}

// The loss and every gradient (c_attn by parts) against the CPU, each part on its own scale; prints every
// part's max error, so the margin under the tolerance is visible in passing runs too.
inline void expect_gradients_close_to_cpu(const GptGradients& actual, const GptGradients& cpu,
                                          const std::string& what) {
    EXPECT_TRUE(all_close(std::vector<double>{actual.loss}, std::vector<double>{cpu.loss}, gpt_loss_tolerance,
                          what + ", loss"));
    ASSERT_EQ(actual.gradients.size(), cpu.gradients.size()) << what;
    const int64_t channels = small_gpt_config().n_embd;
    for (size_t index = 0; index < cpu.gradients.size(); ++index) {
        const std::string& name = cpu.gradients[index].first;
        ASSERT_EQ(actual.gradients[index].first, name) << what;
        ASSERT_EQ(actual.gradients[index].second.size(), cpu.gradients[index].second.size()) << what << ": " << name;
        const std::vector<GradientPart> actual_parts = gradient_parts(name, actual.gradients[index].second, channels);
        const std::vector<GradientPart> cpu_parts = gradient_parts(name, cpu.gradients[index].second, channels);
        for (size_t part = 0; part < cpu_parts.size(); ++part) {
            const GradientPart& expected = cpu_parts[part];
            const ::testing::AssertionResult result =
                all_close(actual_parts[part].values, expected.values, gpt_gradient_tolerance(expected.values),
                          what + ", gradient of " + expected.name);
            std::cout << "  " << result.message() << "\n";
            EXPECT_TRUE(result);
        }
    }
}

inline checkpoint::CheckpointPolicy checkpoint_policy(int every_n_layers, bool offload, bool prefetch) {
    checkpoint::CheckpointPolicy policy;
    policy.enabled = true;
    policy.every_n_layers = every_n_layers;
    policy.offload = offload;
    policy.prefetch = prefetch;
    return policy;
}

} // namespace engine::test
