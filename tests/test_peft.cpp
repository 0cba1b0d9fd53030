// PEFT's adapter files (nn/io/peft.h, issue 28 items 2 and 4) against PEFT itself: adapters that PEFT wrote on the
// tiny Llama and GPT-2 directories (tests/golden/make_peft_lora_files.py) load, and the adapted model's logits,
// loss and every adapter gradient match PEFT's; an adapter libengine saves loads back bitwise with PEFT's config
// keys; bad adapter directories are refused, naming what is wrong, and change nothing.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "expect_error.h"
#include "hf_reference.h"
#include "nn/io/peft.h"
#include "nn/io/pretrained.h"
#include "nn/io/safetensors.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

const std::string data_directory = ENGINE_TEST_DATA_DIR;

std::unique_ptr<nn::CausalLM> load_base(const std::string& name) {
    const std::string directory = data_directory + "/" + name;
    std::unique_ptr<nn::CausalLM> model = nn::read_pretrained_config(directory).build(1, Device::cpu, DType::f32);
    nn::load_pretrained_into(*model, directory);
    return model;
}

struct PeftCase {
    std::string name, base;
    std::vector<std::string> targets;
};
const std::vector<PeftCase> cases = {{"llama", "hf_llama_tiny", {"q_proj", "v_proj", "down_proj"}},
                                     {"gpt2", "hf_gpt2_tiny", {"c_attn", "c_proj", "c_fc"}}};

double largest_relative_error(const std::vector<float>& actual, const std::vector<float>& oracle) {
    double scale = 0.0, worst = 0.0;
    for (float value : oracle) scale = std::max(scale, std::fabs(double(value)));
    EXPECT_GT(scale, 0.0) << "the oracle is zero: the comparison would be empty";
    for (size_t index = 0; index < actual.size(); ++index)
        worst = std::max(worst, std::fabs(double(actual[index]) - oracle[index]) / scale);
    return worst;
}

TEST(PeftParity, LogitsLossAndEveryAdapterGradientMatchPeft) {
    for (const PeftCase& peft : cases) {
        const std::unique_ptr<nn::CausalLM> model = load_base(peft.base);
        const nn::LoraConfig config = nn::load_adapter(*model, data_directory + "/peft_" + peft.name + "_lora");
        EXPECT_EQ(config.r, 4);
        EXPECT_EQ(config.lora_alpha, 8.0);
        EXPECT_EQ(nn::adapted_layers(*model).size(), static_cast<size_t>(peft.name == "llama" ? 3 : 4) * 2)
            << peft.name << ": every target of both layers";
        const HuggingFaceReference reference = read_hf_reference(data_directory + "/peft_" + peft.name + "_lora.logits");
        nn::Batch batch;
        batch.inputs = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
        batch.labels = Tensor::from_vector<int32_t>(reference.labels, {reference.batch, reference.time}, Device::cpu);
        {
            NoGradGuard no_grad;
            model->eval();
            const std::vector<float> logits = model->forward(batch.inputs).to_vector<float>();
            model->train();
            ASSERT_EQ(logits.size(), reference.logits.size());
            const double error = largest_relative_error(logits, reference.logits);
            std::printf("[ %s LoRA logits: max error / max |logit| = %.3g ]\n", peft.name.c_str(), error);
            EXPECT_LE(error, 1e-5) << peft.name;
        }
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = reference.batch;
        trainer_config.max_grad_norm = 0.0;
        optim::Trainer trainer(*model, trainer_config);
        const optim::Accumulation window = trainer.accumulate_gradients({batch});
        EXPECT_NEAR(window.loss_sum() / static_cast<double>(window.num_items_in_batch), reference.loss, 1e-5) << peft.name;
        const std::map<std::string, Tensor> expected =
            nn::read_safetensors(data_directory + "/peft_" + peft.name + "_lora.grads.safetensors");
        const auto trainable = model->named_trainable_parameters();
        ASSERT_EQ(trainable.size(), expected.size()) << peft.name << ": PEFT trains exactly the adapters";
        for (const auto& [name, parameter] : trainable) {
            const auto found = expected.find(nn::peft_tensor_name(*model, name));
            ASSERT_NE(found, expected.end()) << name << " has no PEFT gradient";
            const double error = largest_relative_error(parameter.grad().to_vector<float>(), found->second.to_vector<float>());
            std::printf("[ %-50s max error / max |grad| = %.3g ]\n", name.c_str(), error);
            EXPECT_LE(error, 1e-4) << name;
        }
    }
}

std::filesystem::path fresh_directory(const std::string& name) {
    const std::filesystem::path directory = std::filesystem::temp_directory_path() / ("engine_peft_" + name);
    std::filesystem::remove_all(directory);
    return directory;
}

// An adapter saved by libengine loads back bitwise, with PEFT's config keys and names.
TEST(PeftFiles, SavedAdapterLoadsBackBitwise) {
    for (const PeftCase& peft : cases) {
        const std::unique_ptr<nn::CausalLM> model = load_base(peft.base);
        const nn::LoraConfig config = nn::load_adapter(*model, data_directory + "/peft_" + peft.name + "_lora");
        const std::filesystem::path directory = fresh_directory(peft.name);
        nn::save_adapter(*model, config, directory.string(), peft.base);
        std::ifstream file(directory / "adapter_config.json");
        const nlohmann::json saved = nlohmann::json::parse(file);
        EXPECT_EQ(saved["peft_type"], "LORA");
        EXPECT_EQ(saved["task_type"], "CAUSAL_LM");
        EXPECT_EQ(saved["r"], 4);
        EXPECT_EQ(saved["fan_in_fan_out"], peft.name == "gpt2");
        EXPECT_EQ(saved["base_model_name_or_path"], peft.base);
        const std::map<std::string, Tensor> written = nn::read_safetensors((directory / "adapter_model.safetensors").string());
        const std::map<std::string, Tensor> original =
            nn::read_safetensors(data_directory + "/peft_" + peft.name + "_lora/adapter_model.safetensors");
        ASSERT_EQ(written.size(), original.size());
        for (const auto& [name, tensor] : original) {
            ASSERT_TRUE(written.count(name)) << name;
            EXPECT_EQ(written.at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
        }
        const std::unique_ptr<nn::CausalLM> reloaded = load_base(peft.base);
        EXPECT_EQ(nn::load_adapter(*reloaded, directory.string()).target_modules.size(), config.target_modules.size());
        std::filesystem::remove_all(directory);
    }
}

TEST(PeftFiles, BadAdaptersAreRefusedAndChangeNothing) {
    const std::unique_ptr<nn::CausalLM> model = load_base("hf_llama_tiny");
    const size_t parameters = model->named_parameters().size();
    const auto unchanged = [&] {
        EXPECT_EQ(model->named_parameters().size(), parameters);
        EXPECT_TRUE(nn::adapted_layers(*model).empty());
        EXPECT_EQ(model->trainable_parameter_count(), model->parameter_count());
    };
    // GPT-2's adapter on Llama: its targets are no Llama layer.
    expect_error([&] { nn::load_adapter(*model, data_directory + "/peft_gpt2_lora"); },
                 {"peft_gpt2_lora", "matches no linear layer"});
    unchanged();
    expect_error([&] { nn::load_adapter(*model, data_directory + "/no_such_adapter"); }, {"no_such_adapter"});
    unchanged();

    // Copies of Llama's adapter, each broken one way.
    const std::filesystem::path directory = fresh_directory("bad");
    const auto broken = [&](const std::function<void(nlohmann::json&)>& edit) {
        std::filesystem::remove_all(directory);
        std::filesystem::copy(data_directory + "/peft_llama_lora", directory);
        std::ifstream in(directory / "adapter_config.json");
        nlohmann::json config = nlohmann::json::parse(in);
        in.close();
        edit(config);
        std::ofstream(directory / "adapter_config.json") << config.dump(2);
        return directory.string();
    };
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c["r"] = 2; })); },
                 {"adapter_model.safetensors", "has shape (4,32)", "needs (2,32)"});
    unchanged();
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c["target_modules"] = {"q_proj"}; })); },
                 {"is no adapter of this model's target modules"});
    unchanged();
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c["bias"] = "all"; })); },
                 {"adapter_config.json", "bias \"all\""});
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c["peft_type"] = "IA3"; })); },
                 {"only LORA adapters"});
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c["target_modules"] = ".*proj"; })); },
                 {"regular expression"});
    expect_error([&] { nn::load_adapter(*model, broken([](nlohmann::json& c) { c.erase("r"); })); }, {"key 'r' is missing"});
    unchanged();
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
    std::ofstream(directory / "adapter_config.json") << "{ not json";
    expect_error([&] { nn::load_adapter(*model, directory.string()); }, {"adapter_config.json", "not valid JSON"});
    unchanged();
    expect_error([&] { nn::save_adapter(*model, nn::LoraConfig{4, 8.0, 0.0, {"q_proj"}}, directory.string()); },
                 {"the model has no LoRA adapter"});
    std::filesystem::remove_all(directory);
}

} // namespace
} // namespace engine::testing
