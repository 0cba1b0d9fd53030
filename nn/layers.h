// The GPT-2 building blocks as modules. Parameter names follow Hugging Face GPT-2 (c_attn, c_proj, c_fc,
// ln_1, ln_2), and Linear weights are stored (in, out) like its Conv1D, so checkpoints map one to one.
#pragma once

#include <cstdint>

#include "nn/module.h"

namespace engine::nn {

// Everything a layer needs to create its parameters deterministically.
struct InitOptions {
    uint64_t seed = 0;
    uint64_t* next_stream = nullptr; // each parameter takes the next Philox stream; null: own_stream below
    // The counter used when next_stream is null, so that a defaulted InitOptions works (each parameter of the
    // layers built from it still takes its own stream) instead of dereferencing null.
    mutable uint64_t own_stream = 0;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    double standard_deviation = 0.02;
};

class Linear : public Module {
public:
    // weight (in,out) ~ N(0, std²); bias (out) = 0
    Linear(int in_features, int out_features, const InitOptions& init, double weight_std);
    Tensor forward(const Tensor& input) const { return linear(input, working(weight), working(bias)); }
    Tensor weight, bias;
};

class LayerNorm : public Module {
public:
    LayerNorm(int channels, const InitOptions& init); // weight 1, bias 0
    Tensor forward(const Tensor& input) const { return layernorm(input, working(weight), working(bias)); }
    Tensor weight, bias;
};

class Embedding : public Module {
public:
    // padded_rows >= rows (0: none): the storage holds padded_rows rows, those beyond `rows` zero, with a
    // gradient buffer of the same size. Only weight (rows, C) is a parameter: the optimizer, the files and
    // the parameter count see the real rows, so the padding is never updated and stays exactly zero.
    Embedding(int rows, int channels, const InitOptions& init, int padded_rows = 0);
    Tensor weight;        // (rows, C)
    Tensor padded_weight; // (padded_rows, C): the same storage and gradient buffer; weight itself if unpadded
};

class Dropout : public Module {
public:
    explicit Dropout(float probability) : probability(probability) {}
    Tensor forward(const Tensor& input) const { return dropout(input, probability, training()); }
    float probability;
};

class CausalSelfAttention : public Module {
public:
    CausalSelfAttention(int channels, int heads, int layers, float dropout_probability, const InitOptions& init);
    Tensor forward(const Tensor& input) const; // (B,T,C) -> (B,T,C)
    int heads;
    Linear c_attn, c_proj;
    Dropout residual_dropout;
};

class MLP : public Module {
public:
    MLP(int channels, int layers, float dropout_probability, const InitOptions& init);
    Tensor forward(const Tensor& input) const; // c_fc (C,4C) -> gelu -> c_proj (4C,C) -> dropout
    Linear c_fc, c_proj;
    Dropout residual_dropout;
};

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)). The checkpointable unit.
class Block : public Module {
public:
    Block(int channels, int heads, int layers, float dropout_probability, const InitOptions& init);
    Tensor forward(const Tensor& input) const;
    LayerNorm ln_1;
    CausalSelfAttention attn;
    LayerNorm ln_2;
    MLP mlp;
};

} // namespace engine::nn
