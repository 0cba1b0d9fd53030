// LoRA (nn/lora.h, issue 28 item 2): PEFT's names, shapes and target rule; an adapted model starts as its base;
// the adapter's gradients and the input's against float64 central differences (Linear and TorchLinear); training
// moves only the adapters (GPT-2 and Llama, f32 and bf16, checkpointed, with adapter dropout) and the loss falls;
// merging gives the adapted model's logits; bad input changes nothing.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "adapter_training.h"
#include "expect_error.h"
#include "gradcheck.h"
#include "nn/lora.h"
#include "nn/model_config.h"
#include "optim/trainer.h"
#include "parameter_snapshot.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

constexpr int length = 24;

std::unique_ptr<nn::CausalLM> build(const std::string& model_name) {
    return nn::ModelConfig::named(model_name).build(5, Device::cpu, DType::f32);
}

nn::LoraConfig lora_config(std::vector<std::string> targets, int r = 4, double alpha = 8.0, double dropout = 0.0) {
    nn::LoraConfig config;
    config.r = r;
    config.lora_alpha = alpha;
    config.lora_dropout = dropout;
    config.target_modules = std::move(targets);
    return config;
}

TEST(Lora, PeftNamesShapesAndTargetRule) {
    const std::unique_ptr<nn::CausalLM> llama = build("llama-tiny");
    const size_t base_parameters = llama->named_parameters().size();
    const std::vector<std::string> adapted = nn::apply_lora(*llama, lora_config({"q_proj", "v_proj"}));
    const int layers = nn::ModelConfig::named("llama-tiny").layers();
    ASSERT_EQ(adapted.size(), static_cast<size_t>(2 * layers));
    EXPECT_EQ(adapted[0], "model.layers.0.self_attn.q_proj");
    EXPECT_EQ(adapted[1], "model.layers.0.self_attn.v_proj");
    const auto named = llama->named_parameters();
    EXPECT_EQ(named.size(), base_parameters + 2 * adapted.size());
    size_t adapters = 0;
    for (const auto& [name, parameter] : named) {
        const bool adapter = name.find(".lora_") != std::string::npos;
        EXPECT_EQ(parameter.requires_grad(), adapter) << name << ": only the adapters train";
        if (!adapter) continue;
        ++adapters;
        const bool a = name.find(".lora_A.weight") != std::string::npos;
        EXPECT_TRUE(a || name.find(".lora_B.weight") != std::string::npos) << name;
        EXPECT_EQ(a ? parameter.size(0) : parameter.size(1), 4) << name << ": the rank";
        if (!a) EXPECT_EQ(as_doubles(parameter), std::vector<double>(static_cast<size_t>(parameter.numel()), 0.0)) << name;
    }
    EXPECT_EQ(adapters, 2 * adapted.size());
    const nn::LlamaConfig shape = nn::ModelConfig::named("llama-tiny").llama();
    const auto find = [&](const std::string& wanted) {
        for (const auto& [name, parameter] : named)
            if (name == wanted) return parameter.shape();
        ADD_FAILURE() << "no " << wanted;
        return Shape{};
    };
    EXPECT_EQ(find("model.layers.1.self_attn.q_proj.lora_A.weight"), (Shape{4, shape.hidden_size}));
    EXPECT_EQ(find("model.layers.1.self_attn.v_proj.lora_B.weight"),
              (Shape{shape.num_key_value_heads * (shape.hidden_size / shape.num_attention_heads), 4}));

    // GPT-2: c_proj names both the attention's and the MLP's projection, as in PEFT; all-linear takes every
    // linear layer (the tied head is no layer).
    const std::unique_ptr<nn::CausalLM> gpt = build("tiny");
    const std::vector<std::string> projections = nn::apply_lora(*gpt, lora_config({"c_proj"}));
    ASSERT_GE(projections.size(), 2u);
    EXPECT_EQ(projections[0], "h.0.attn.c_proj");
    EXPECT_EQ(projections[1], "h.0.mlp.c_proj");
    EXPECT_EQ(nn::apply_lora(*build("tiny"), lora_config({"all-linear"})).size(),
              4 * static_cast<size_t>(nn::ModelConfig::named("tiny").layers()));
}

// lora_B starts at zero: the adapted model's logits are its base's, bit for bit; with a non-zero lora_B they are not.
TEST(Lora, AnAdaptedModelStartsAsItsBase) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        const std::unique_ptr<nn::CausalLM> model = build(model_name);
        const Tensor tokens = tokens_for(model->vocab_size(), length);
        const std::vector<float> base = logits_of(*model, tokens);
        nn::apply_lora(*model, lora_config({"all-linear"}, 4, 16.0, 0.1));
        EXPECT_EQ(logits_of(*model, tokens), base) << model_name;
        perturb_adapters(*model, 0.5);
        EXPECT_NE(logits_of(*model, tokens), base) << model_name;
    }
}

// The adapter path's gradients in float64, for both layouts: d(input), d(lora_A), d(lora_B) against central
// differences with the base weight frozen (it gets no gradient).
class LoraGradients : public TapeTest {};

TEST_F(LoraGradients, MatchCentralDifferences) {
    nn::ParameterOptions options;
    options.dtype = DType::f64;
    nn::Linear conv1d(5, 7, true, options);
    nn::TorchLinear torch_linear(5, 7, options);
    for (nn::AdaptableLinear* layer : std::initializer_list<nn::AdaptableLinear*>{&conv1d, &torch_linear}) {
        layer->set_requires_grad(false);
        layer->attach_lora(std::make_shared<nn::LoraAdapter>(5, 7, lora_config({"x"}, 3, 6.0), options));
        const nn::LoraAdapter& adapter = *layer->lora();
        Tensor(adapter.lora_B.weight).copy_from(random_tensor(generator, adapter.lora_B.weight.shape()));
        const Tensor input = random_leaf(generator, {2, 3, 5});
        const Tensor upstream = random_tensor(generator, {2, 3, 7});
        const auto loss = [&] { return weighted_sum(layer->forward(input), upstream); };
        EXPECT_GRADCHECK(gradcheck(loss, {input, adapter.lora_A.weight, adapter.lora_B.weight}), "lora");
        for (const Tensor& parameter : layer->parameters())
            if (parameter.shares_storage_with(layer == &conv1d ? conv1d.weight : torch_linear.weight))
                EXPECT_FALSE(parameter.grad().defined()) << "the frozen base weight";
        current_tape().clear();
    }
}

optim::TrainerConfig config_of(Precision precision) {
    optim::TrainerConfig config = adapter_trainer_config(precision, true, 1e-2, 8);
    config.weight_decay = 0.1;
    return config;
}

// Eight steps with adapter dropout, checkpointing and accumulation: every base weight keeps its bits, every
// adapter moves, the optimizer holds only the adapters, and the loss falls.
TEST(Lora, TrainsOnlyTheAdapters) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            const std::string what = model_name + " " + precision_name(precision);
            current_tape().clear();
            const std::unique_ptr<nn::CausalLM> model = build(model_name);
            const std::vector<std::string> targets = model_name == "tiny"
                                                         ? std::vector<std::string>{"c_attn", "c_fc"}
                                                         : std::vector<std::string>{"q_proj", "v_proj", "down_proj"};
            nn::apply_lora(*model, lora_config(targets, 4, 8.0, 0.1));
            const Snapshot initial = values_of(*model);
            optim::Trainer trainer(*model, config_of(precision));
            EXPECT_EQ(trainer.optimizer().parameter_names().size(), model->named_trainable_parameters().size()) << what;
            int cursor = 0;
            const nn::BatchSource source = token_stream_batches(model->vocab_size(), 2, length, cursor);
            std::vector<double> losses;
            for (int step = 0; step < 8; ++step) losses.push_back(trainer.train_step(source)->loss);
            EXPECT_LT(losses.back(), losses.front() - 0.05) << what;
            const Snapshot trained = values_of(*model);
            const auto named = model->named_parameters();
            for (size_t index = 0; index < named.size(); ++index) {
                if (named[index].first.find(".lora_") != std::string::npos)
                    EXPECT_NE(trained[index], initial[index]) << what << " " << named[index].first << " did not learn";
                else // the base in bf16 under bf16 (docs/TRAINING.md, "Frozen parameters")
                    EXPECT_EQ(trained[index], precision == Precision::bf16 ? bf16_rounded(initial[index]) : initial[index])
                        << what << " " << named[index].first << " moved";
            }
            std::printf("  %s LoRA: loss %.4f -> %.4f over 8 steps\n", what.c_str(), losses.front(), losses.back());
        }
    }
}

// Merging on a model without working copies (f32): the merged model's logits equal the adapted model's to f32
// rounding, and its parameters are the base architecture's again.
TEST(Lora, MergeGivesTheAdaptedLogits) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        const std::unique_ptr<nn::CausalLM> model = build(model_name);
        const size_t base_parameters = model->named_parameters().size();
        nn::apply_lora(*model, lora_config({"all-linear"}, 4, 16.0));
        perturb_adapters(*model, 0.5);
        const Tensor tokens = tokens_for(model->vocab_size(), length);
        const std::vector<float> adapted = logits_of(*model, tokens);
        nn::merge_lora(*model);
        EXPECT_TRUE(nn::adapted_layers(*model).empty());
        EXPECT_EQ(model->named_parameters().size(), base_parameters) << model_name;
        const std::vector<float> merged = logits_of(*model, tokens);
        ASSERT_EQ(merged.size(), adapted.size());
        double largest = 0.0;
        for (size_t index = 0; index < merged.size(); ++index)
            largest = std::max(largest, std::fabs(static_cast<double>(merged[index]) - adapted[index]));
        // Logits of order one through a few layers of f32 GEMMs (measured 1.3e-6 GPT-2, 8.8e-6 Llama).
        EXPECT_LT(largest, 1e-4) << model_name;
        std::printf("  %s: merged logits within %.3g of the adapted ones\n", model_name.c_str(), largest);
    }
}

TEST(Lora, BadInputIsRefusedAndChangesNothing) {
    const std::unique_ptr<nn::CausalLM> model = build("llama-tiny");
    const size_t parameters = model->named_parameters().size();
    const auto unchanged = [&] {
        EXPECT_EQ(model->named_parameters().size(), parameters);
        EXPECT_EQ(model->trainable_parameter_count(), model->parameter_count());
    };
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj", "c_attn"})); },
                 {"target module 'c_attn' matches no linear layer", "model.layers.0.self_attn.q_proj"});
    unchanged();
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"}, 0)); }, {"LoRA: r 0 must be at least 1"});
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"}, 4096)); },
                 {"r 4096 exceeds layer 'model.layers.0.self_attn.q_proj'"});
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"}, 4, -1.0)); }, {"lora_alpha -1"});
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"}, 4, 8.0, 1.0)); }, {"lora_dropout 1"});
    expect_error([&] { nn::apply_lora(*model, lora_config({})); }, {"target_modules is empty"});
    expect_error([&] { nn::apply_lora(*model, lora_config({"lm_head"})); }, {"the LM head 'lm_head'"});
    unchanged();
    model->set_compute_dtype(DType::bf16);
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"})); }, {"has working copies"});
    unchanged();
    model->set_compute_dtype(DType::f32);
    nn::apply_lora(*model, lora_config({"q_proj"}));
    expect_error([&] { nn::apply_lora(*model, lora_config({"q_proj"})); }, {"has an adapter already"});
}

} // namespace
} // namespace engine::testing
