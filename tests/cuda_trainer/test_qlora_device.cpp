// QLoRA on the CUDA device (nn/qlora.h): a model quantised there holds the codes the host quantises bit for bit;
// one quantised on the host keeps them through to() and set_master_device; QLoRA training on the device follows the
// host's losses and keeps every code.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "nn/lora.h"
#include "nn/model_config.h"
#include "nn/qlora.h"
#include "optim/trainer.h"
#include "tests/adapter_training.h"
#include "tests/token_stream.h"

namespace engine::test {
namespace {

std::unique_ptr<nn::CausalLM> quantizable(const std::string& model_name) {
    std::unique_ptr<nn::CausalLM> model = nn::ModelConfig::named(model_name).build(5, Device::cpu, DType::f32);
    nn::LoraConfig config;
    config.r = 4;
    config.lora_alpha = 16.0;
    config.target_modules = {"all-linear"};
    nn::ParameterOptions options;
    options.generator = std::make_shared<nn::Generator>(11);
    nn::apply_lora(*model, config, options);
    return model;
}

Device nf4_device(nn::Module& model) { return nn::nf4_layers(model).front().second->nf4_weight()->device(); }

std::vector<double> train(nn::CausalLM& model, Precision precision) {
    optim::Trainer trainer(model, testing::adapter_trainer_config(precision, true, 1e-2, 4));
    int cursor = 0;
    const nn::BatchSource source = testing::token_stream_batches(model.vocab_size(), 2, 24, cursor);
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) losses.push_back(trainer.train_step(source)->loss);
    return losses;
}

TEST(QloraDevice, QuantisesAsTheHostAndTrainsAsIt) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    engine::cuda::set_tf32_enabled(false);
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            const std::string what = model_name + " " + precision_name(precision);
            current_tape().clear();
            // Quantised on the host, and on the device after to(): the same bytes.
            const std::unique_ptr<nn::CausalLM> host = quantizable(model_name);
            nn::quantize_nf4(*host);
            const std::unique_ptr<nn::CausalLM> device = quantizable(model_name);
            device->to(Device::cuda);
            nn::quantize_nf4(*device);
            ASSERT_EQ(nf4_device(*device), Device::cuda);
            const std::vector<std::vector<unsigned char>> codes = testing::nf4_codes_of(*host);
            EXPECT_TRUE(testing::nf4_codes_of(*device) == codes) << what << ": the device's codes differ from the host's";
            // Quantised on the host, then moved: the buffers travel with the parameters.
            const std::unique_ptr<nn::CausalLM> moved = quantizable(model_name);
            nn::quantize_nf4(*moved);
            moved->to(Device::cuda);
            ASSERT_EQ(nf4_device(*moved), Device::cuda);
            EXPECT_TRUE(testing::nf4_codes_of(*moved) == codes) << what;
            const std::vector<double> on_host = train(*host, precision);
            const std::vector<double> on_device = train(*device, precision);
            ASSERT_EQ(on_device.size(), on_host.size());
            double largest = 0.0;
            for (size_t step = 0; step < on_host.size(); ++step)
                largest = std::max(largest, std::fabs(on_device[step] - on_host[step]));
            // The same values through the device's GEMMs and reductions, summed in other orders: f32 rounding on
            // losses near 5.5, bf16's on the bf16 runs (measured on the emulated device: 6.6e-7 and 3.3e-4).
            EXPECT_LT(largest, precision == Precision::bf16 ? 2e-3 : 1e-5) << what;
            EXPECT_LT(on_device.back(), on_device.front()) << what;
            EXPECT_TRUE(testing::nf4_codes_of(*device) == codes) << what << ": training changed the codes";
            std::printf("  %s: device codes bitwise the host's; losses %.6f -> %.6f, within %.3g of the host's\n",
                        what.c_str(), on_device.front(), on_device.back(), largest);
        }
    }
    // The masters apart (the optimizer on the host): the codes go to the compute device with the working copies.
    const std::unique_ptr<nn::CausalLM> apart = quantizable("llama-tiny");
    nn::quantize_nf4(*apart);
    const std::vector<std::vector<unsigned char>> codes = testing::nf4_codes_of(*apart);
    apart->set_compute_dtype(DType::bf16);
    apart->set_master_device(Device::cpu, Device::cuda);
    EXPECT_EQ(nf4_device(*apart), Device::cuda);
    EXPECT_TRUE(testing::nf4_codes_of(*apart) == codes);
    current_tape().clear();
}

} // namespace
} // namespace engine::test
