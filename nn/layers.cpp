// Layers: parameter creation (PyTorch's default initialisation and GPT-2's) and forward passes built from
// engine ops.
#include "nn/layers.h"

#include <cmath>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "nn/init.h"

namespace engine::nn {
namespace {

// Checked before any draw, so that a bad layer leaves the generator where it was.
void check_layer(const char* layer, int64_t first, int64_t second, const ParameterOptions& options) {
    ENGINE_CHECK(first > 0 && second > 0, layer << ": sizes must be positive, got " << first << " and " << second);
    ENGINE_CHECK(options.dtype == DType::f32 || options.dtype == DType::f64,
                 layer << ": parameters are f32 or f64, got " << dtype_name(options.dtype)
                       << " (for bf16 compute keep f32 parameters and call set_compute_dtype(bf16))");
}

Generator& generator_of(const ParameterOptions& options) {
    return options.generator ? *options.generator : *default_generator();
}

Tensor initial_normal(const Shape& shape, double standard_deviation, const ParameterOptions& options) {
    Generator& generator = generator_of(options);
    const uint64_t stream = generator.take_stream();
    return normal_tensor(shape, standard_deviation, generator.seed(), stream, options.dtype)
        .to(options.device, MemoryCategory::parameters);
}

Tensor initial_uniform(const Shape& shape, double bound, const ParameterOptions& options) {
    Generator& generator = generator_of(options);
    const uint64_t stream = generator.take_stream();
    return uniform_tensor(shape, bound, generator.seed(), stream, options.dtype)
        .to(options.device, MemoryCategory::parameters);
}

Tensor initial_constant(const Shape& shape, double value, const ParameterOptions& options) {
    generator_of(options).take_stream(); // keep stream numbering independent of which parameters are constant
    return Tensor::full(shape, value, options.dtype, options.device, MemoryCategory::parameters);
}

} // namespace

Linear::Linear(int in_features, int out_features, bool bias, const ParameterOptions& options) {
    check_layer("Linear", in_features, out_features, options);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight = register_parameter("weight", initial_uniform({in_features, out_features}, bound, options));
    if (bias) this->bias = register_parameter("bias", initial_uniform({out_features}, bound, options));
}

Linear::Linear(int in_features, int out_features, const InitOptions& init, double weight_std) {
    check_layer("Linear", in_features, out_features, init.parameters);
    weight = register_parameter("weight", initial_normal({in_features, out_features}, weight_std, init.parameters));
    bias = register_parameter("bias", initial_constant({out_features}, 0.0, init.parameters));
}

LayerNorm::LayerNorm(int channels, const ParameterOptions& options) {
    check_layer("LayerNorm", channels, 1, options);
    weight = register_parameter("weight", initial_constant({channels}, 1.0, options));
    bias = register_parameter("bias", initial_constant({channels}, 0.0, options));
}

TorchLinear::TorchLinear(int in_features, int out_features, const InitOptions& init) {
    check_layer("TorchLinear", in_features, out_features, init.parameters);
    weight = register_parameter("weight",
                                initial_normal({out_features, in_features}, init.standard_deviation, init.parameters));
}

TorchLinear::TorchLinear(int in_features, int out_features, const ParameterOptions& options) {
    check_layer("TorchLinear", in_features, out_features, options);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight = register_parameter("weight", initial_uniform({out_features, in_features}, bound, options));
}

RMSNorm::RMSNorm(int channels, double eps, const ParameterOptions& options) : eps(eps) {
    check_layer("RMSNorm", channels, 1, options);
    ENGINE_CHECK(std::isfinite(eps) && eps >= 0.0, "RMSNorm: eps " << eps << " must be finite and >= 0");
    weight = register_parameter("weight", initial_constant({channels}, 1.0, options));
}

Embedding::Embedding(int rows, int channels, const ParameterOptions& options)
    : Embedding(rows, channels, InitOptions{options, 1.0}) {}

Embedding::Embedding(int rows, int channels, const InitOptions& init, int padded_rows) {
    const ParameterOptions& options = init.parameters;
    check_layer("Embedding", rows, channels, options);
    const Tensor initial = initial_normal({rows, channels}, init.standard_deviation, options); // the unpadded draw
    if (padded_rows <= rows) {
        weight = padded_weight = register_parameter("weight", initial);
        return;
    }
    Tensor padded = Tensor::zeros({padded_rows, channels}, options.dtype, options.device, MemoryCategory::parameters);
    padded.with_rows(rows).copy_from(initial);
    padded.set_requires_grad(true); // allocates the (padded_rows, C) gradient buffer, zero
    weight = register_parameter("weight", padded.with_rows(rows));
    padded_weight = register_alias(padded); // to() moves it with weight
}

Dropout::Dropout(float probability) : probability(probability) {
    ENGINE_CHECK(probability >= 0.0f && probability < 1.0f, "Dropout: probability " << probability << " is outside [0,1)");
}

Lambda::Lambda(Function function) : function_(std::move(function)) {
    ENGINE_CHECK(static_cast<bool>(function_), "Lambda: the function is empty");
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

Tensor CausalSelfAttention::forward(const Tensor& input, const Tensor& positions) const {
    return residual_dropout.forward(c_proj.forward(attention(c_attn.forward(input), heads, heads, positions)));
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
    if (tile_rows == 0) return residual_dropout.forward(c_proj.forward(gelu(c_fc.forward(input))));
    const auto rows = [this](const Tensor& tile) { return c_proj.forward(gelu(c_fc.forward(tile))); };
    return residual_dropout.forward(checkpoint::tiled_rows(rows, input, tile_rows));
}

Block::Block(int channels, int heads, int layers, float dropout_probability, const InitOptions& init)
    : ln_1(channels, init.parameters), attn(channels, heads, layers, dropout_probability, init),
      ln_2(channels, init.parameters),
      mlp(channels, layers, dropout_probability, init) {
    register_module("ln_1", ln_1);
    register_module("attn", attn);
    register_module("ln_2", ln_2);
    register_module("mlp", mlp);
}

Tensor Block::forward(const Tensor& input, const Tensor& positions) const {
    Tensor after_attention = add(input, attn.forward(ln_1.forward(input), positions));
    return add(after_attention, mlp.forward(ln_2.forward(after_attention)));
}

} // namespace engine::nn
