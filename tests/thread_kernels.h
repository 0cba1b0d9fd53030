// The CPU kernels that run threaded, and whole GPT-2 and Llama training steps, each run on fixed inputs with
// every output kept as raw bytes: tests/test_cpu_threads.cpp compares them across thread counts, and a dump of
// them taken before threading was added is what "bitwise unchanged" was checked against. No gtest here.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "kernels/common/pointwise_functions.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/cpu/reduction_kernels.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/trainer.h"

namespace engine::test::threads {

struct NamedBytes {
    std::string name;
    std::vector<uint8_t> bytes;
};
using Outputs = std::vector<NamedBytes>;

template <typename T>
void keep(Outputs& outputs, const std::string& name, const std::vector<T>& values) {
    NamedBytes entry{name, std::vector<uint8_t>(values.size() * sizeof(T))};
    if (!values.empty()) std::memcpy(entry.bytes.data(), values.data(), entry.bytes.size());
    outputs.push_back(std::move(entry));
}

// Values in [-2, 2) from a fixed generator, converted to the kernel's storage type.
template <typename T>
std::vector<T> random_values(size_t count, uint32_t seed, double low = -2.0, double high = 2.0) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<double> value(low, high);
    std::vector<T> values(count);
    for (T& element : values) {
        if constexpr (std::is_same_v<T, bfloat16>) element = to_bfloat16(static_cast<float>(value(generator)));
        else element = static_cast<T>(value(generator));
    }
    return values;
}

// Shapes: every row kernel gets N rows of C (N*C = 2^18, many chunks whatever rows per chunk), the element
// kernels 2^19 elements, attention B*heads = 16 blocks; see tests/test_cpu_threads.cpp for the chunk counts.
inline constexpr int rows = 2048, channels = 128, elements = 1 << 19;
inline constexpr int batch = 4, length = 64, heads = 4, kv_heads = 2, vocabulary = 512;

template <typename S>
void run_row_and_pointwise_kernels(Outputs& outputs, const std::string& type) {
    namespace k = engine::kernels::cpu;
    using C_ = Compute<S>;
    const int N = rows, C = channels;
    const size_t NC = size_t(N) * C;
    const auto x = random_values<S>(NC, 1), dy = random_values<S>(NC, 2), w = random_values<S>(C, 3, 0.5, 1.5),
               bias = random_values<S>(C, 4);
    { // layernorm
        std::vector<S> out(NC), dx = random_values<S>(NC, 5);
        std::vector<C_> mean(N), rstd(N), dw(C, C_(0.25)), db(C, C_(-0.5));
        k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
        k::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                              N, C);
        keep(outputs, type + " layernorm out", out), keep(outputs, type + " layernorm mean", mean);
        keep(outputs, type + " layernorm rstd", rstd), keep(outputs, type + " layernorm dinp", dx);
        keep(outputs, type + " layernorm dweight", dw), keep(outputs, type + " layernorm dbias", db);
    }
    { // rms_norm
        std::vector<S> out(NC), dx = random_values<S>(NC, 6);
        std::vector<C_> rstd(N), dw(C, C_(0.25));
        k::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
        k::rms_norm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
        keep(outputs, type + " rms_norm out", out), keep(outputs, type + " rms_norm rstd", rstd);
        keep(outputs, type + " rms_norm dinp", dx), keep(outputs, type + " rms_norm dweight", dw);
    }
    { // bias
        std::vector<S> out = x;
        std::vector<C_> db(C, C_(0.125));
        k::bias_add_forward(out.data(), bias.data(), N, C);
        k::bias_backward(db.data(), dy.data(), N, C);
        keep(outputs, type + " bias_add", out), keep(outputs, type + " bias_backward", db);
    }
    const size_t E = elements;
    const auto a = random_values<S>(E, 7), b = random_values<S>(E, 8), g = random_values<S>(E, 9);
    { // gelu, residual, dropout, swiglu, unary
        std::vector<S> out(E), da = random_values<S>(E, 10), db = random_values<S>(E, 11);
        k::gelu_forward(out.data(), a.data(), int64_t(E));
        keep(outputs, type + " gelu out", out);
        k::gelu_backward(da.data(), g.data(), a.data(), int64_t(E), true);
        keep(outputs, type + " gelu dinp", da);
        std::vector<S> written(E);
        k::gelu_backward(written.data(), g.data(), a.data(), int64_t(E), false);
        keep(outputs, type + " gelu dinp written", written);
        k::residual_forward(out.data(), a.data(), b.data(), int64_t(E));
        keep(outputs, type + " residual out", out);
        k::residual_backward(da.data(), db.data(), g.data(), int64_t(E));
        keep(outputs, type + " residual da", da), keep(outputs, type + " residual db", db);
        k::dropout_forward(out.data(), a.data(), 0.3f, 42, 1000, int64_t(E));
        keep(outputs, type + " dropout out", out);
        k::dropout_backward(da.data(), g.data(), 0.3f, 42, 1000, int64_t(E));
        keep(outputs, type + " dropout dinp", da);
        k::swiglu_forward(out.data(), a.data(), b.data(), int64_t(E));
        keep(outputs, type + " swiglu out", out);
        k::swiglu_backward(da.data(), db.data(), g.data(), a.data(), b.data(), int64_t(E));
        keep(outputs, type + " swiglu dgate", da), keep(outputs, type + " swiglu dup", db);
        k::swiglu_backward(da.data(), static_cast<S*>(nullptr), g.data(), a.data(), b.data(), int64_t(E));
        keep(outputs, type + " swiglu dgate only", da);
        for (kernels::UnaryFunction function :
             {kernels::UnaryFunction::silu, kernels::UnaryFunction::tanh, kernels::UnaryFunction::exp}) {
            const std::string name = type + " unary " + std::to_string(int(function));
            k::unary_forward(out.data(), a.data(), int64_t(E), function);
            keep(outputs, name + " out", out);
            k::unary_backward(da.data(), g.data(), a.data(), int64_t(E), function);
            keep(outputs, name + " dinp", da);
        }
    }
    { // rope (B,T,H,D) with D = 32
        const int B = batch, T = length, H = 16, D = 32;
        const size_t count = size_t(B) * T * H * D;
        const auto inp = random_values<S>(count, 12), dout = random_values<S>(count, 13);
        const auto cos = random_values<C_>(size_t(T) * D / 2, 14, -1, 1), sin = random_values<C_>(size_t(T) * D / 2, 15, -1, 1);
        std::vector<S> out(count), dx = random_values<S>(count, 16);
        k::rope_forward(out.data(), inp.data(), cos.data(), sin.data(), nullptr, B, T, H, D);
        k::rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), nullptr, B, T, H, D);
        keep(outputs, type + " rope out", out), keep(outputs, type + " rope dinp", dx);
    }
    { // cross-entropy over (N, V) logits with a few ignored targets
        const int CN = rows, V = vocabulary;
        const auto logits = random_values<S>(size_t(CN) * V, 17, -4, 4);
        std::vector<int32_t> targets(CN);
        std::mt19937 generator(18);
        for (int n = 0; n < CN; ++n) targets[n] = n % 13 == 0 ? -100 : int32_t(generator() % V);
        std::vector<C_> losses(CN);
        const auto dlosses = random_values<C_>(CN, 19);
        std::vector<S> dlogits = random_values<S>(size_t(CN) * V, 20);
        k::cross_entropy_forward(losses.data(), logits.data(), targets.data(), CN, V, -100);
        k::cross_entropy_backward(dlogits.data(), dlosses.data(), logits.data(), targets.data(), CN, V, -100);
        keep(outputs, type + " cross_entropy losses", losses), keep(outputs, type + " cross_entropy dlogits", dlogits);
        const int padded = V + 16;
        std::vector<S> fused = random_values<S>(size_t(CN) * padded, 21, -4, 4);
        k::cross_entropy_fused_forward(losses.data(), fused.data(), targets.data(), C_(0.001), CN, V, padded, -100);
        keep(outputs, type + " cross_entropy fused losses", losses), keep(outputs, type + " cross_entropy fused", fused);
        const C_ dout = C_(0.002);
        k::cross_entropy_fused_rescale(fused.data(), &dout, C_(0.001), int64_t(fused.size()));
        keep(outputs, type + " cross_entropy fused rescaled", fused);
    }
    { // softmax and log_softmax over the last dimension and over a middle one
        for (const int64_t inner : {int64_t(1), int64_t(8)}) {
            const int64_t outer = 256, size = 512;
            const size_t count = size_t(outer * size * inner);
            const auto inp = random_values<S>(count, 22, -4, 4), dout = random_values<S>(count, 23);
            std::vector<S> out(count), dx = random_values<S>(count, 24), log_out(count), log_dx = dx;
            k::softmax_forward(out.data(), inp.data(), outer, size, inner);
            k::softmax_backward(dx.data(), dout.data(), out.data(), outer, size, inner);
            k::log_softmax_forward(log_out.data(), inp.data(), outer, size, inner);
            k::log_softmax_backward(log_dx.data(), dout.data(), log_out.data(), outer, size, inner);
            const std::string name = type + " softmax inner " + std::to_string(inner);
            keep(outputs, name + " out", out), keep(outputs, name + " dinp", dx);
            keep(outputs, name + " log out", log_out), keep(outputs, name + " log dinp", log_dx);
        }
    }
    { // embedding with repeated tokens, with and without a position table
        const int B = batch * 4, T = length, V = 64; // few rows, so tokens repeat
        std::vector<int32_t> tokens(size_t(B) * T);
        std::mt19937 generator(25);
        for (int32_t& token : tokens) token = int32_t(generator() % V);
        const auto token_table = random_values<S>(size_t(V) * C, 26), position_table = random_values<S>(size_t(T) * C, 27);
        const auto dout = random_values<S>(size_t(B) * T * C, 28);
        std::vector<S> out(size_t(B) * T * C);
        std::vector<C_> dtoken(size_t(V) * C, C_(0.5)), dposition(size_t(T) * C, C_(-0.5));
        k::embedding_forward(out.data(), tokens.data(), token_table.data(), position_table.data(), nullptr, B, T, C);
        keep(outputs, type + " embedding out", out);
        k::embedding_forward(out.data(), tokens.data(), token_table.data(), static_cast<const S*>(nullptr), nullptr, B,
                             T, C);
        keep(outputs, type + " embedding out (tokens only)", out);
        k::embedding_backward(dtoken.data(), dposition.data(), dout.data(), tokens.data(), nullptr, B, T, C);
        keep(outputs, type + " embedding dtoken", dtoken), keep(outputs, type + " embedding dposition", dposition);
        k::embedding_backward(dtoken.data(), static_cast<C_*>(nullptr), dout.data(), tokens.data(), nullptr, B, T, C);
        keep(outputs, type + " embedding dtoken (tokens only)", dtoken);
    }
    for (const int KVH : {heads, kv_heads}) { // attention, multi-head and grouped-query
        const int B = batch, T = length, C = channels, NH = heads;
        const int64_t row = C + 2 * int64_t(KVH) * (C / NH);
        const auto qkv = random_values<S>(size_t(B) * T * row, 29), dout = random_values<S>(size_t(B) * T * C, 30);
        std::vector<S> out(size_t(B) * T * C), dqkv = random_values<S>(size_t(B) * T * row, 31);
        std::vector<C_> logsumexp(size_t(B) * NH * T);
        k::attention_forward(out.data(), logsumexp.data(), qkv.data(), nullptr, B, T, C, NH, KVH);
        k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), nullptr, B, T, C, NH,
                              KVH);
        const std::string name = type + " attention kv heads " + std::to_string(KVH);
        keep(outputs, name + " out", out), keep(outputs, name + " logsumexp", logsumexp);
        keep(outputs, name + " dqkv", dqkv);
    }
}

template <typename T>
void run_optimizer_kernels(Outputs& outputs, const std::string& type) {
    namespace k = engine::kernels::cpu;
    const size_t E = elements;
    std::vector<T> param = random_values<T>(E, 40), m = random_values<T>(E, 41), v = random_values<T>(E, 42, 0, 1);
    const auto grad = random_values<T>(E, 43);
    k::adamw_update(param.data(), grad.data(), m.data(), v.data(), int64_t(E), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f,
                    0.05f, 0.5f);
    keep(outputs, type + " adamw param", param), keep(outputs, type + " adamw m", m), keep(outputs, type + " adamw v", v);
    std::vector<T> momentum = random_values<T>(E, 44);
    k::sgd_update(param.data(), grad.data(), momentum.data(), int64_t(E), 1e-2f, 0.9f, 0.01f, 0.5f);
    keep(outputs, type + " sgd param", param), keep(outputs, type + " sgd momentum", momentum);
    { // the list update with the step's epilogue, and the conversion it replaces
        std::vector<T> gradient = grad;
        std::vector<engine::bfloat16> copy(E);
        const engine::kernels::AdamWTensor<T> tensor{param.data(), gradient.data(), m.data(), v.data(), copy.data(),
                                                     int64_t(E), 0.1f};
        k::adamw_update_list(&tensor, 1, true, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f, 0.5f);
        keep(outputs, type + " adamw list param", param), keep(outputs, type + " adamw list gradient", gradient);
        std::vector<T> widened(E);
        k::convert(widened.data(), copy.data(), int64_t(E));
        keep(outputs, type + " adamw list copy", widened);
        k::convert(copy.data(), param.data(), int64_t(E));
        k::convert(widened.data(), copy.data(), int64_t(E));
        keep(outputs, type + " convert", widened);
    }
    std::vector<double> squares(1);
    k::sum_of_squares(squares.data(), grad.data(), int64_t(E)); // the gradient norm: chunk sums in chunk order
    keep(outputs, type + " sum_of_squares", squares);
}

inline Outputs run_kernels() {
    Outputs outputs;
    run_row_and_pointwise_kernels<float>(outputs, "f32");
    run_row_and_pointwise_kernels<bfloat16>(outputs, "bf16");
    run_optimizer_kernels<float>(outputs, "f32");
    run_optimizer_kernels<double>(outputs, "f64");
    return outputs;
}

// Two optimizer steps of a causal LM through optim::Trainer (forward, fused loss, backward, clip, AdamW), then
// one more forward/backward through the autograd cross-entropy: every loss, the grad norms, every parameter after
// the steps and every gradient of the last backward.
inline void run_training(Outputs& outputs, const std::string& name, nn::CausalLM& model, int vocab) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = batch;
    config.shape.gradient_accumulation_steps = 2;
    config.learning_rate = 1e-3;
    config.weight_decay = 0.1;
    config.max_grad_norm = 1.0;
    config.max_steps = 10;
    optim::Trainer trainer(model, config);
    model.train(true);
    std::mt19937 generator(77);
    std::vector<nn::Batch> batches;
    for (int index = 0; index < 4; ++index) {
        std::vector<int32_t> ids(size_t(batch) * length);
        for (int32_t& id : ids) id = int32_t(generator() % uint32_t(vocab));
        nn::Batch micro;
        micro.inputs = Tensor::from_vector(ids, {batch, length}, Device::cpu);
        micro.labels = micro.inputs;
        batches.push_back(micro);
    }
    size_t next = 0;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> { return batches[next++ % batches.size()]; };
    std::vector<double> losses;
    for (int step = 0; step < 2; ++step) {
        const optim::StepResult result = *trainer.train_step(source);
        losses.push_back(result.loss), losses.push_back(result.grad_norm);
    }
    keep(outputs, name + " losses and grad norms", losses);
    for (const auto& [parameter_name, parameter] : model.named_parameters())
        keep(outputs, name + " parameter " + parameter_name, parameter.to_vector<float>());

    const Tensor tokens = batches[0].inputs;
    const Tensor loss = cross_entropy(model.forward(tokens), optim::Trainer::shift_targets(batches[0]), Reduction::mean);
    keep(outputs, name + " autograd loss", std::vector<double>{loss.item()});
    backward(loss);
    for (const auto& [parameter_name, parameter] : model.named_parameters())
        keep(outputs, name + " gradient " + parameter_name, parameter.grad().to_vector<float>());
}

inline Outputs run_gpt_training() {
    nn::GPTConfig config;
    config.vocab_size = vocabulary;
    config.max_seq_len = length;
    config.n_layer = 2;
    config.n_head = heads;
    config.n_embd = channels;
    config.dropout = 0.1f;
    manual_seed(1234);
    nn::GPT model(config, 7, Device::cpu);
    Outputs outputs;
    run_training(outputs, "gpt", model, config.vocab_size);
    return outputs;
}

inline Outputs run_llama_training() {
    nn::LlamaConfig config;
    config.vocab_size = vocabulary;
    config.hidden_size = channels;
    config.intermediate_size = 256;
    config.num_hidden_layers = 2;
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.max_position_embeddings = length;
    config.initializer_range = 0.1;
    manual_seed(1234);
    nn::Llama model(config, 7, Device::cpu, DType::f32);
    Outputs outputs;
    run_training(outputs, "llama", model, config.vocab_size);
    return outputs;
}

} // namespace engine::test::threads
