// One accumulated GPT step, done the way optim::Trainer does it, returning the loss and every parameter
// gradient: shared by the CUDA-vs-CPU GPT tests and the offload-prefetch tests. No CUDA headers, so the CPU
// suite includes it too.
#pragma once

#include <cstdint>
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

// Fixed data (its own generator, not the engine RNG): `count` micro-batches of (batch, T) with a few ignored
// targets, the last position of every row ignored as in causal shifting.
inline std::vector<MicroBatch> make_micro_batches(const nn::GPTConfig& config, int count, int batch,
                                                  uint32_t seed = 20240605) {
    std::mt19937 generator(seed);
    std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
    std::bernoulli_distribution ignored(0.1);
    const int length = config.max_seq_len;
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

// Tolerances for accumulate_gpt_gradients() on CUDA against the CPU. // float32 on both devices, but different summation orders (cuBLAS vs OpenBLAS blocking, warp-shuffle vs
// sequential reductions in layernorm, softmax and the bias/weight column sums, online vs two-pass softmax
// in attention), each rounding at about 6e-8 relative. The loss is one scalar summed over ~290 tokens:
// rtol 1e-5 is over 100 ulps. A gradient element is a sum of up to B*T*micro-batches = 297 products,
// carried back through 3 layernorms and attention; its relative error stays within ~1e-4 where it is not
// the small difference of large terms, hence rtol 1e-3. Where it is (elements near zero), the error is
// absolute: the terms are O(1e-3) (the loss is divided by the ~290 target count), so 297 * eps * 1e-3 is
// ~2e-8, and atol 1e-5 leaves room for the amplification through the layers while still catching any
// wrong index, mask or missing term (those change gradients by far more than 0.1%).
inline constexpr Tolerance gpt_loss_tolerance{1e-6, 1e-5};
inline constexpr Tolerance gpt_gradient_tolerance{1e-5, 1e-3};

inline checkpoint::CheckpointPolicy checkpoint_policy(int every_n_layers, bool offload, bool prefetch) {
    checkpoint::CheckpointPolicy policy;
    policy.enabled = true;
    policy.every_n_layers = every_n_layers;
    policy.offload = offload;
    policy.prefetch = prefetch;
    return policy;
}

} // namespace engine::test
