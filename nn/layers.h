// Layers with PyTorch's default initialisation (Linear, LayerNorm, Embedding, Dropout, GELU, Lambda) and the
// GPT-2 building blocks made of them. Parameter names follow Hugging Face GPT-2 (c_attn, c_proj, c_fc, ln_1,
// ln_2), and Linear weights are stored (in, out) like its Conv1D, so checkpoints map one to one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "nn/init.h"
#include "nn/module.h"

namespace engine::nn {

struct LoraConfig; // nn/lora.h
class LoraAdapter;

// Where a layer's parameters live and which generator draws their initial values. Every field may stay
// defaulted: f32 parameters on the CPU, drawn from this thread's default generator (nn::manual_seed).
struct ParameterOptions {
    std::shared_ptr<Generator> generator; // null: default_generator(); each parameter takes its next stream
    DType dtype = DType::f32;             // f32 or f64 (for bf16 compute: Module::set_compute_dtype)
    Device device = Device::cpu;
};

// GPT-2's initialisation (nn/gpt.h): normal weights, zero biases, unit LayerNorm gains.
struct InitOptions {
    // Not an aggregate, and explicit: a braced argument ({} or {generator}) to a layer's constructor then
    // always means ParameterOptions, so Embedding(rows, channels, {generator}) is not ambiguous.
    explicit InitOptions() = default;
    InitOptions(ParameterOptions parameters, double standard_deviation)
        : parameters(std::move(parameters)), standard_deviation(standard_deviation) {}
    ParameterOptions parameters;
    double standard_deviation = 0.02;
};

// y = x · weight + bias over the last dimension: (..., in) -> (..., out).
//
// Weight layout: `weight` is (in_features, out_features), the layout of Hugging Face GPT-2's Conv1D, so
// its checkpoints load without a transpose. PyTorch's torch.nn.Linear stores the TRANSPOSE, (out, in):
// copying a PyTorch state dict's "weight" into this one needs a transpose, and y = x · weight here is
// y = x · weightᵀ there.
// A linear layer LoRA can adapt (nn/lora.h): Linear and TorchLinear. Without an adapter its forward is the
// layer's own; with one, base(x) + scaling·B·A·dropout(x), the adapter's matrices registered as this layer's
// children lora_A and lora_B (PEFT's names and torch.nn.Linear shapes: (r,in) and (out,r)).
class AdaptableLinear : public Layer {
public:
    virtual int in_features() const = 0;
    virtual int out_features() const = 0;
    // Gives this layer an adapter of its shape (nn::apply_lora makes them). Refused, changing nothing, when the
    // layer has one already, when the shapes differ, and once the layer has working copies apart from its
    // parameters (set_compute_dtype, set_master_device: attach first).
    void attach_lora(std::shared_ptr<LoraAdapter> adapter);
    std::shared_ptr<LoraAdapter> detach_lora(); // takes the adapter away (nn::merge_lora)
    const LoraAdapter* lora() const { return lora_.get(); }
    // QLoRA's 4-bit base (nn/qlora.h, docs/TRAINING.md "QLoRA"): quantises the frozen weight to NF4 on its device
    // and drops the parameter, so the layer holds 0.5 bytes a weight plus its scales (register_buffer) and its
    // forward dequantises the weight for each use (engine::nf4_linear). The bias, if any, stays a frozen
    // parameter. Refused, changing nothing, when the weight requires grad, is quantised already, or once the layer
    // has working copies or its masters apart (quantise before set_compute_dtype and set_master_device).
    void quantize_nf4();
    // The layer's NF4 weight, or null while it holds a dense one.
    const Nf4Weight* nf4_weight() const { return nf4_.defined() ? &nf4_ : nullptr; }

protected:
    Tensor with_lora(Tensor base_output, const Tensor& input) const; // base_output, plus the adapter's path if any
    // The dense weight parameter (Linear's (in,out), TorchLinear's (out,in)) and whether it is torch's layout.
    virtual Tensor& dense_weight() = 0;
    virtual bool torch_layout() const = 0;
    // The NF4 weight's in and out features (its stored shape, in the layer's layout).
    int nf4_in_features() const { return static_cast<int>(nf4_.shape[torch_layout() ? 1 : 0]); }
    int nf4_out_features() const { return static_cast<int>(nf4_.shape[torch_layout() ? 0 : 1]); }
    Nf4Weight nf4_;

private:
    std::shared_ptr<LoraAdapter> lora_;
};

class Linear : public AdaptableLinear {
public:
    // PyTorch's default initialisation: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with
    // a = sqrt(5) gives exactly this bound for the weight). bias = false leaves `bias` undefined. The weight
    // takes the generator's next stream, then the bias.
    Linear(int in_features, int out_features, bool bias = true, const ParameterOptions& options = {});
    // GPT-2's: weight ~ N(0, weight_std²); bias = 0.
    Linear(int in_features, int out_features, const InitOptions& init, double weight_std);
    Tensor forward(const Tensor& input) const override {
        if (nf4_.defined()) return with_lora(nf4_linear(input, nf4_, false, working(bias)), input);
        return with_lora(linear(input, working(weight), working(bias)), input);
    }
    int in_features() const override { return nf4_.defined() ? nf4_in_features() : static_cast<int>(weight.size(0)); }
    int out_features() const override { return nf4_.defined() ? nf4_out_features() : static_cast<int>(weight.size(1)); }
    Tensor weight, bias; // (in,out) (undefined once quantize_nf4 ran), (out) or undefined

protected:
    Tensor& dense_weight() override { return weight; }
    bool torch_layout() const override { return false; }
};

// Over the last dimension, eps 1e-5, with a gain and a bias.
class LayerNorm : public Layer {
public:
    // weight 1, bias 0 (PyTorch's and GPT-2's); each still takes a stream, so that the streams of the
    // parameters made after it do not depend on which parameters are constant.
    explicit LayerNorm(int channels, const ParameterOptions& options = {});
    Tensor forward(const Tensor& input) const override {
        return layernorm(input, working(weight), working(bias));
    }
    Tensor weight, bias; // (C), (C)
};

// y = x · weightᵀ over the last dimension, no bias: torch.nn.Linear(in, out, bias=False) with its (out, in)
// weight layout, as Hugging Face's Llama projections store it, so their checkpoints load without a transpose.
// Weight ~ N(0, init.standard_deviation²) (Hugging Face's initializer_range).
class TorchLinear : public AdaptableLinear {
public:
    TorchLinear(int in_features, int out_features, const InitOptions& init);
    // torch.nn.Linear's default initialisation: weight ~ U(-1/sqrt(in), 1/sqrt(in)).
    TorchLinear(int in_features, int out_features, const ParameterOptions& options);
    Tensor forward(const Tensor& input) const override {
        if (nf4_.defined()) return with_lora(nf4_linear(input, nf4_, true), input);
        return with_lora(matmul(input, working(weight), /*transpose_b=*/true), input);
    }
    int in_features() const override { return nf4_.defined() ? nf4_in_features() : static_cast<int>(weight.size(1)); }
    int out_features() const override { return nf4_.defined() ? nf4_out_features() : static_cast<int>(weight.size(0)); }
    Tensor weight; // (out,in); undefined once quantize_nf4 ran

protected:
    Tensor& dense_weight() override { return weight; }
    bool torch_layout() const override { return true; }
};

// Llama's RMSNorm over the last dimension: a gain (initially 1), no bias, epsilon from the model config.
class RMSNorm : public Layer {
public:
    RMSNorm(int channels, double eps, const ParameterOptions& options = {});
    Tensor forward(const Tensor& input) const override { return rms_norm(input, working(weight), eps); }
    Tensor weight; // (C)
    double eps;
};

// A table of `rows` vectors of `channels` values: forward looks rows up (torch.nn.Embedding; Llama's
// embed_tokens). GPT reads its two tables together through embedding(tokens, wte, wpe).
class Embedding : public Module {
public:
    // PyTorch's default initialisation: weight ~ N(0, 1).
    Embedding(int rows, int channels, const ParameterOptions& options = {});
    // GPT-2's: weight ~ N(0, init.standard_deviation²). padded_rows >= rows (0: none): the storage holds
    // padded_rows rows, those beyond `rows` zero, with a gradient buffer of the same size. Only weight
    // (rows, C) is a parameter: the optimizer, the files and the parameter count see the real rows, so the
    // padding is never updated and stays exactly zero.
    Embedding(int rows, int channels, const InitOptions& init, int padded_rows = 0);
    // tokens (B,T) i32 -> (B,T,C): row tokens[b,t] of the table (ids checked against `rows`).
    Tensor forward(const Tensor& tokens) const { return embedding(tokens, working(weight)); }
    Tensor weight;        // (rows, C)
    Tensor padded_weight; // (padded_rows, C): the same storage and gradient buffer; weight itself if unpadded
};

// Zeroes each element with `probability` and scales the rest by 1/(1-probability), in train mode only: in
// eval mode (Module::eval) it is the identity. The mask comes from the engine's dropout stream.
class Dropout : public Layer {
public:
    explicit Dropout(float probability = 0.5f); // PyTorch's default; throws outside [0,1)
    Tensor forward(const Tensor& input) const override { return dropout(input, probability, training()); }
    float probability;
};

// gelu as a layer: the tanh approximation (GPT-2's; PyTorch's nn.GELU(approximate="tanh"), not its default
// erf form).
class GELU : public Layer {
public:
    Tensor forward(const Tensor& input) const override { return gelu(input); }
};

// The other activations as layers (engine/ops/pointwise.h).
class ReLU : public Layer {
public:
    Tensor forward(const Tensor& input) const override { return relu(input); }
};
class SiLU : public Layer {
public:
    Tensor forward(const Tensor& input) const override { return silu(input); }
};
class Tanh : public Layer {
public:
    Tensor forward(const Tensor& input) const override { return engine::tanh(input); }
};
class Sigmoid : public Layer {
public:
    Tensor forward(const Tensor& input) const override { return sigmoid(input); }
};

// Any single-tensor function as a layer, to put an op or one's own composition into a Sequential. Tensors
// it captures are not parameters: it has none.
class Lambda : public Layer {
public:
    using Function = std::function<Tensor(const Tensor&)>;
    explicit Lambda(Function function); // throws if empty
    Tensor forward(const Tensor& input) const override { return function_(input); }

private:
    Function function_;
};

class CausalSelfAttention : public Layer {
public:
    CausalSelfAttention(int channels, int heads, int layers, float dropout_probability, const InitOptions& init);
    Tensor forward(const Tensor& input) const override { return forward(input, Tensor()); } // (B,T,C) -> (B,T,C)
    // positions (B,T) i32 or undefined: packed documents, attending within each document only (engine::attention).
    Tensor forward(const Tensor& input, const Tensor& positions) const;
    int heads;
    Linear c_attn, c_proj;
    Dropout residual_dropout;
};

class MLP : public Layer {
public:
    MLP(int channels, int layers, float dropout_probability, const InitOptions& init);
    // c_fc (C,4C) -> gelu -> c_proj (4C,C) -> dropout. With tile_rows > 0 the part before the dropout runs over
    // tiles of that many of the input's rows (checkpoint::tiled_rows: the sequence-tiled MLP); the dropout, whose
    // mask is drawn over the whole output, stays outside the tiles, so its draws are the untiled ones.
    Tensor forward(const Tensor& input) const override;
    Linear c_fc, c_proj;
    Dropout residual_dropout;
    int64_t tile_rows = 0; // 0: untiled (CausalLM::set_mlp_tile_tokens)
};

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)). The checkpointable unit.
class Block : public Layer {
public:
    Block(int channels, int heads, int layers, float dropout_probability, const InitOptions& init);
    Tensor forward(const Tensor& input) const override { return forward(input, Tensor()); }
    Tensor forward(const Tensor& input, const Tensor& positions) const; // packed documents: CausalSelfAttention's
    LayerNorm ln_1;
    CausalSelfAttention attn;
    LayerNorm ln_2;
    MLP mlp;
};

} // namespace engine::nn
