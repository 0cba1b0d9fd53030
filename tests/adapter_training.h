// What the adapter tests share (test_lora, test_frozen_parameters, test_qlora, cuda_trainer/test_qlora_device): a
// small trainer config (two micro-batches of two, checkpointed every layer), a model's logits, adapters given a
// non-zero path, and an NF4 model's codes as bytes.
#pragma once

#include <random>
#include <vector>

#include "gradcheck.h"
#include "nn/lora.h"
#include "nn/qlora.h"
#include "optim/trainer.h"
#include "token_stream.h"

namespace engine::testing {

inline optim::TrainerConfig adapter_trainer_config(Precision precision, bool checkpointed, double learning_rate,
                                                   int max_steps) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.shape.gradient_accumulation_steps = 2;
    config.shape.precision = precision;
    config.shape.checkpointing = checkpoint::CheckpointPolicy{checkpointed, 1, 1, false};
    config.learning_rate = learning_rate;
    config.max_steps = max_steps;
    return config;
}

// The logits in eval mode (no dropout), as f32.
inline std::vector<float> logits_of(nn::CausalLM& model, const Tensor& tokens) {
    NoGradGuard no_grad;
    model.eval();
    const std::vector<float> values = cast(model.forward(tokens), DType::f32).to_vector<float>();
    model.train();
    return values;
}

// Two sequences of `length` tokens of the test stream.
inline Tensor tokens_for(int vocabulary, int length) {
    int cursor = 0;
    return (*token_stream_batches(vocabulary, 2, length, cursor)()).inputs;
}

// Gives every lora_B a non-zero value, so that the adapters' path reaches the output.
inline void perturb_adapters(nn::Module& model, double scale) {
    std::mt19937_64 generator(7);
    for (auto& [name, layer] : nn::adapted_layers(model)) {
        Tensor b = layer->lora()->lora_B.weight;
        b.copy_from(cast(random_tensor(generator, b.shape(), DType::f64, scale), b.dtype()));
    }
}

// A tensor's bytes, read back to the host.
inline std::vector<unsigned char> bytes_of(const Tensor& tensor) {
    const Tensor host = tensor.to(Device::cpu).clone(); // its own storage, from the first element
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    return {bytes, bytes + host.nbytes()};
}

// Every NF4 layer's codes, scale codes and scale absmax, as bytes, in nn::nf4_layers' order.
inline std::vector<std::vector<unsigned char>> nf4_codes_of(nn::Module& model) {
    std::vector<std::vector<unsigned char>> all;
    for (const auto& [name, layer] : nn::nf4_layers(model)) {
        all.push_back(bytes_of(layer->nf4_weight()->codes));
        all.push_back(bytes_of(layer->nf4_weight()->scale_codes));
        all.push_back(bytes_of(layer->nf4_weight()->scale_absmax));
    }
    return all;
}

} // namespace engine::testing
