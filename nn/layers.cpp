// GPT-2 layers: parameter creation (GPT-2 initialisation) and forward passes built from engine ops.
#include "nn/layers.h"

#include <cmath>

#include "nn/init.h"

namespace engine::nn {
namespace {

uint64_t& stream_counter(const InitOptions& init) { return init.next_stream ? *init.next_stream : init.own_stream; }

Tensor initial_normal(const Shape& shape, double standard_deviation, const InitOptions& init) {
    const uint64_t stream = stream_counter(init)++;
    return normal_tensor(shape, standard_deviation, init.seed, stream, init.dtype)
        .to(init.device, MemoryCategory::parameters);
}

Tensor initial_constant(const Shape& shape, double value, const InitOptions& init) {
    ++stream_counter(init); // keep stream numbering independent of which parameters are constant
    return Tensor::full(shape, value, init.dtype, init.device, MemoryCategory::parameters);
}

} // namespace

Linear::Linear(int in_features, int out_features, const InitOptions& init, double weight_std) {
    weight = register_parameter("weight", initial_normal({in_features, out_features}, weight_std, init));
    bias = register_parameter("bias", initial_constant({out_features}, 0.0, init));
}

LayerNorm::LayerNorm(int channels, const InitOptions& init) {
    weight = register_parameter("weight", initial_constant({channels}, 1.0, init));
    bias = register_parameter("bias", initial_constant({channels}, 0.0, init));
}

Embedding::Embedding(int rows, int channels, const InitOptions& init, int padded_rows) {
    const Tensor initial = initial_normal({rows, channels}, init.standard_deviation, init); // the unpadded draw
    if (padded_rows <= rows) {
        weight = padded_weight = register_parameter("weight", initial);
        return;
    }
    Tensor padded = Tensor::zeros({padded_rows, channels}, init.dtype, init.device, MemoryCategory::parameters);
    padded.with_rows(rows).copy_from(initial);
    padded.set_requires_grad(true); // allocates the (padded_rows, C) gradient buffer, zero
    weight = register_parameter("weight", padded.with_rows(rows));
    padded_weight = padded;
}

// GPT-2 scales the residual projections by 1/sqrt(2·layers): each block adds two of them to the stream.
static double residual_projection_std(const InitOptions& init, int layers) {
    return init.standard_deviation / std::sqrt(2.0 * layers);
}

CausalSelfAttention::CausalSelfAttention(int channels, int heads, int layers, float dropout_probability,
                                         const InitOptions& init)
    : heads(heads), c_attn(channels, 3 * channels, init, init.standard_deviation),
      c_proj(channels, channels, init, residual_projection_std(init, layers)), residual_dropout(dropout_probability) {
    ENGINE_CHECK(heads > 0 && channels % heads == 0,
                 "CausalSelfAttention: " << heads << " heads do not divide the width " << channels);
    register_module("c_attn", c_attn);
    register_module("c_proj", c_proj);
    register_module("resid_dropout", residual_dropout);
}

Tensor CausalSelfAttention::forward(const Tensor& input) const {
    return residual_dropout.forward(c_proj.forward(attention(c_attn.forward(input), heads)));
}

MLP::MLP(int channels, int layers, float dropout_probability, const InitOptions& init)
    : c_fc(channels, 4 * channels, init, init.standard_deviation),
      c_proj(4 * channels, channels, init, residual_projection_std(init, layers)),
      residual_dropout(dropout_probability) {
    register_module("c_fc", c_fc);
    register_module("c_proj", c_proj);
    register_module("dropout", residual_dropout);
}

Tensor MLP::forward(const Tensor& input) const {
    return residual_dropout.forward(c_proj.forward(gelu(c_fc.forward(input))));
}

Block::Block(int channels, int heads, int layers, float dropout_probability, const InitOptions& init)
    : ln_1(channels, init), attn(channels, heads, layers, dropout_probability, init), ln_2(channels, init),
      mlp(channels, layers, dropout_probability, init) {
    register_module("ln_1", ln_1);
    register_module("attn", attn);
    register_module("ln_2", ln_2);
    register_module("mlp", mlp);
}

Tensor Block::forward(const Tensor& input) const {
    Tensor after_attention = add(input, attn.forward(ln_1.forward(input)));
    return add(after_attention, mlp.forward(ln_2.forward(after_attention)));
}

} // namespace engine::nn
