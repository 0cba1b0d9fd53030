// One accumulated Llama step done the way optim::Trainer does it (forward -> summed cross-entropy / the window's
// item count -> backward per micro-batch, no zero_grad between), returning the loss and every gradient: shared by
// the CPU checkpointing tests and the CUDA-vs-CPU Llama test. No CUDA headers, so the CPU suite includes it too.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "nn/llama.h"
#include "tests/cuda/gpt_gradients.h" // MicroBatch, make_token_micro_batches

namespace engine::test {

// Small, with what could diverge: grouped-query attention (6 query heads over 2 key/value heads), a vocabulary
// and a length that are not block multiples, an untied head, and a head size (8) that is not a tile multiple.
inline nn::LlamaConfig small_llama_config(bool tied = false) {
    nn::LlamaConfig config;
    config.vocab_size = 97;
    config.hidden_size = 48;
    config.intermediate_size = 80;
    config.num_hidden_layers = 4;
    config.num_attention_heads = 6;
    config.num_key_value_heads = 2;
    config.max_position_embeddings = 33;
    config.rms_norm_eps = 1e-5;
    config.rope_theta = 10000.0;
    config.tie_word_embeddings = tied;
    config.initializer_range = 0.1; // larger than 0.02, so attention is far from uniform
    return config;
}

using LlamaMicroBatch = MicroBatch; // tests/cuda/gpt_gradients.h: tokens and shifted targets, (B,T) each

inline std::vector<LlamaMicroBatch> make_llama_micro_batches(const nn::LlamaConfig& config, int count, int batch,
                                                             int length, uint32_t seed = 20261202) {
    return make_token_micro_batches(config.vocab_size, length, count, batch, seed);
}

struct LlamaGradients {
    std::vector<double> losses; // per micro-batch: its token-loss sum / num_items_in_batch
    double loss = 0.0;          // their sum
    std::vector<std::pair<std::string, Tensor>> gradients; // named_parameters order, on the host
};

inline LlamaGradients accumulate_llama_gradients(const nn::LlamaConfig& config, Device device, DType dtype,
                                                 const checkpoint::CheckpointPolicy& policy,
                                                 const std::vector<LlamaMicroBatch>& batches, int batch, int length,
                                                 uint64_t model_seed = 7) {
    nn::Llama model(config, model_seed, device, dtype);
    model.set_checkpointing(policy);
    int64_t num_items_in_batch = 0;
    for (const LlamaMicroBatch& micro : batches)
        for (int32_t target : micro.targets) num_items_in_batch += target != default_ignore_index ? 1 : 0;
    LlamaGradients result;
    const Shape shape{batch, length};
    for (const LlamaMicroBatch& micro : batches) {
        const Tensor tokens = Tensor::from_vector<int32_t>(micro.tokens, shape, device);
        const Tensor targets = Tensor::from_vector<int32_t>(micro.targets, shape, device);
        Tensor loss;
        {
            const Tensor logits = model.forward(tokens); // (B,T,V), dies before backward
            loss = multiply(cross_entropy(logits, targets, Reduction::sum),
                            1.0 / static_cast<double>(num_items_in_batch));
        }
        result.losses.push_back(loss.item());
        result.loss += result.losses.back();
        backward(loss);
    }
    for (const auto& [name, parameter] : model.named_parameters())
        result.gradients.emplace_back(name, parameter.grad().to(Device::cpu));
    return result;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

} // namespace engine::test
