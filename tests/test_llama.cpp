// Llama against transformers itself: a tiny LlamaForCausalLM with grouped-query attention and an untied head,
// written by save_pretrained (tests/golden/make_hf_llama_files.py), loads from its directory and gives
// transformers' logits, loss and every parameter gradient; the sharded, tied and BF16 variants load too; a saved
// directory reads back bitwise. Then the engine's own guarantees on Llama: every checkpoint policy (with offload,
// prefetch and accumulation) bitwise equal to no checkpointing, accumulation equal to the big batch, and a
// float64 finite-difference check through the whole model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "expect_error.h"
#include "gradcheck.h"
#include "hf_reference.h"
#include "llama_step.h"
#include "nn/io/pretrained.h"
#include "nn/io/safetensors.h"
#include "nn/model_config.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;
using test::accumulate_llama_gradients;
using test::bitwise_equal;
using test::LlamaGradients;
using test::make_llama_micro_batches;
using test::small_llama_config;

const std::string data_directory = ENGINE_TEST_DATA_DIR;
using Reference = HuggingFaceReference;
const auto read_reference = read_hf_reference;

std::unique_ptr<nn::CausalLM> load_directory(const std::string& directory, DType dtype = DType::f32) {
    const nn::ModelConfig config = nn::read_pretrained_config(directory);
    std::unique_ptr<nn::CausalLM> model = config.build(1, Device::cpu, dtype);
    nn::load_pretrained_into(*model, directory);
    return model;
}

// Logits within 1e-5 absolute (the bound; the logits are O(1) to O(10)), and the causal-LM loss within
// 1e-5 of transformers'. Both sides are float32 with different summation orders.
void expect_logits_and_loss(const nn::CausalLM& model, const Reference& reference) {
    NoGradGuard no_grad;
    const Tensor tokens = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
    const Tensor logits = model.forward(tokens);
    const std::vector<float> values = logits.to_vector<float>();
    ASSERT_EQ(values.size(), reference.logits.size());
    double max_error = 0.0, max_logit = 0.0;
    for (size_t index = 0; index < values.size(); ++index) {
        max_error = std::max(max_error, std::fabs(double(values[index]) - reference.logits[index]));
        max_logit = std::max(max_logit, std::fabs(double(reference.logits[index])));
    }
    std::printf("[ max |logit error| %.3g over logits up to %.3g ]\n", max_error, max_logit);
    EXPECT_LE(max_error, 1e-5);
    std::vector<int32_t> shifted(reference.labels.size(), default_ignore_index);
    for (int row = 0; row < reference.batch; ++row)
        for (int t = 0; t + 1 < reference.time; ++t)
            shifted[size_t(row) * reference.time + t] = reference.labels[size_t(row) * reference.time + t + 1];
    const Tensor targets = Tensor::from_vector<int32_t>(shifted, {reference.batch, reference.time}, Device::cpu);
    const double loss = cross_entropy(logits, targets, Reduction::mean).item();
    std::printf("[ loss %.9g, transformers %.9g ]\n", loss, reference.loss);
    EXPECT_NEAR(loss, reference.loss, 1e-5);
}

TEST(LlamaTransformersParity, ConfigJsonGivesTheArchitectureAndEverySize) {
    const nn::ModelConfig config = nn::read_pretrained_config(data_directory + "/hf_llama_tiny");
    ASSERT_TRUE(config.is_llama());
    const nn::LlamaConfig& llama = config.llama();
    EXPECT_EQ(llama.vocab_size, 64);
    EXPECT_EQ(llama.hidden_size, 32);
    EXPECT_EQ(llama.intermediate_size, 48);
    EXPECT_EQ(llama.num_hidden_layers, 2);
    EXPECT_EQ(llama.num_attention_heads, 4);
    EXPECT_EQ(llama.num_key_value_heads, 2);
    EXPECT_EQ(llama.max_position_embeddings, 16);
    EXPECT_EQ(llama.rope_theta, 500000.0);
    EXPECT_EQ(llama.rms_norm_eps, 1e-5);
    EXPECT_FALSE(llama.tie_word_embeddings);
    // GPT-2 directories are read the same way: no more --n-head by hand.
    const nn::ModelConfig gpt = nn::read_pretrained_config(data_directory + "/hf_gpt2_tiny");
    ASSERT_TRUE(gpt.is_gpt());
    EXPECT_EQ(gpt.gpt().n_head, 4);
    EXPECT_EQ(gpt.gpt().n_layer, 2);
    EXPECT_EQ(gpt.gpt().n_embd, 32);
    EXPECT_EQ(gpt.gpt().max_seq_len, 16);
}

TEST(LlamaTransformersParity, LogitsAndLossMatchTransformers) {
    const std::unique_ptr<nn::CausalLM> model = load_directory(data_directory + "/hf_llama_tiny");
    expect_logits_and_loss(*model, read_reference(data_directory + "/hf_llama_tiny.logits"));
}

TEST(LlamaTransformersParity, TiedHeadWithOneKeyValueHeadMatchesTransformers) {
    const std::unique_ptr<nn::CausalLM> model = load_directory(data_directory + "/hf_llama_tiny_tied");
    ASSERT_TRUE(nn::read_pretrained_config(data_directory + "/hf_llama_tiny_tied").llama().tie_word_embeddings);
    expect_logits_and_loss(*model, read_reference(data_directory + "/hf_llama_tiny_tied.logits"));
}

TEST(LlamaTransformersParity, GpT2DirectoryLoadsWithItsConfig) {
    const std::unique_ptr<nn::CausalLM> model = load_directory(data_directory + "/hf_gpt2_tiny");
    const Reference reference = read_reference(data_directory + "/hf_gpt2_tiny.logits");
    NoGradGuard no_grad;
    const Tensor tokens = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
    const std::vector<float> logits = model->forward(tokens).to_vector<float>();
    ASSERT_EQ(logits.size(), reference.logits.size());
    for (size_t index = 0; index < logits.size(); ++index)
        ASSERT_LE(std::fabs(logits[index] - reference.logits[index]), 1e-6 + 1e-5 * std::fabs(reference.logits[index]));
}

// The trainer's gradient of one window is d(mean token loss)/dθ, transformers' loss.backward(). Each element is
// held to 1e-4 of its tensor's largest transformers gradient: float32 on both sides, summed in other orders.
TEST(LlamaTransformersParity, EveryParameterGradientMatchesTransformers) {
    const std::unique_ptr<nn::CausalLM> model = load_directory(data_directory + "/hf_llama_tiny");
    const Reference reference = read_reference(data_directory + "/hf_llama_tiny.logits");
    const std::map<std::string, Tensor> expected = nn::read_safetensors(data_directory + "/hf_llama_tiny.grads.safetensors");
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = reference.batch;
    config.max_grad_norm = 0.0;
    optim::Trainer trainer(*model, config);
    nn::Batch batch;
    batch.inputs = Tensor::from_vector<int32_t>(reference.tokens, {reference.batch, reference.time}, Device::cpu);
    batch.labels = Tensor::from_vector<int32_t>(reference.labels, {reference.batch, reference.time}, Device::cpu);
    const optim::Accumulation window = trainer.accumulate_gradients({batch});
    EXPECT_NEAR(window.loss_sum() / static_cast<double>(window.num_items_in_batch), reference.loss, 1e-5);
    const auto parameters = model->named_parameters();
    ASSERT_EQ(parameters.size(), expected.size());
    for (const auto& [name, parameter] : parameters) {
        const auto found = expected.find(name);
        ASSERT_NE(found, expected.end()) << name << " has no transformers gradient";
        const std::vector<float> actual = parameter.grad().to_vector<float>();
        const std::vector<float> oracle = found->second.to_vector<float>();
        ASSERT_EQ(actual.size(), oracle.size()) << name;
        double scale = 0.0, worst = 0.0;
        for (float value : oracle) scale = std::max(scale, std::fabs(double(value)));
        ASSERT_GT(scale, 0.0) << name << ": transformers' gradient is zero, the comparison would be empty";
        for (size_t index = 0; index < actual.size(); ++index)
            worst = std::max(worst, std::fabs(double(actual[index]) - oracle[index]) / scale);
        std::printf("[ %-45s max error / max |grad| = %.3g ]\n", name.c_str(), worst);
        EXPECT_LE(worst, 1e-4) << name;
    }
}

TEST(LlamaCheckpointFiles, ShardedDirectoryLoadsTheSameWeights) {
    const auto single = load_directory(data_directory + "/hf_llama_tiny");
    const auto sharded = load_directory(data_directory + "/hf_llama_tiny_sharded");
    EXPECT_GT(nn::pretrained_weight_files(data_directory + "/hf_llama_tiny_sharded").size(), 2u);
    const auto expected = single->named_parameters();
    const auto actual = sharded->named_parameters();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t index = 0; index < actual.size(); ++index)
        EXPECT_TRUE(bitwise_equal(actual[index].second, expected[index].second)) << actual[index].first;
}

// transformers' bfloat16 save: every value widens exactly into the f32 masters, so they equal the f32 file's
// weights rounded to bf16.
TEST(LlamaCheckpointFiles, Bf16DirectoryLoadsIntoF32Masters) {
    const auto f32 = load_directory(data_directory + "/hf_llama_tiny");
    const auto bf16 = load_directory(data_directory + "/hf_llama_tiny_bf16");
    const auto expected = f32->named_parameters();
    const auto actual = bf16->named_parameters();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t index = 0; index < actual.size(); ++index) {
        ASSERT_EQ(actual[index].second.dtype(), DType::f32);
        const std::vector<float> values = actual[index].second.to_vector<float>();
        const std::vector<float> source = expected[index].second.to_vector<float>();
        for (size_t element = 0; element < values.size(); ++element)
            ASSERT_EQ(values[element], to_float(to_bfloat16(source[element]))) << actual[index].first << " " << element;
    }
}

TEST(LlamaCheckpointFiles, SavedDirectoryReadsBackBitwise) {
    for (bool tied : {false, true}) {
        const nn::LlamaConfig config = small_llama_config(tied);
        nn::Llama model(config, 11);
        const fs::path directory = fs::temp_directory_path() / ("engine_llama_save_" + std::to_string(tied));
        fs::remove_all(directory);
        nn::save_pretrained(model, directory.string(), std::nullopt, data_directory + "/hf_llama_tiny");
        // the source directory's other keys and files come along
        EXPECT_TRUE(fs::exists(directory / "generation_config.json"));
        const nlohmann::json written = nlohmann::json::parse(std::ifstream(directory / "config.json"));
        EXPECT_EQ(written["bos_token_id"], 1);
        EXPECT_EQ(written["architectures"][0], "LlamaForCausalLM");
        EXPECT_EQ(written["num_key_value_heads"], 2);
        const nn::ModelConfig read = nn::read_pretrained_config(directory.string());
        ASSERT_TRUE(read.is_llama());
        EXPECT_EQ(read.llama().tie_word_embeddings, tied);
        EXPECT_EQ(read.llama().intermediate_size, config.intermediate_size);
        const auto loaded = read.build(99, Device::cpu, DType::f32); // other initial weights
        nn::load_pretrained_into(*loaded, directory.string());
        const auto expected = model.named_parameters();
        const auto actual = loaded->named_parameters();
        ASSERT_EQ(actual.size(), expected.size());
        for (size_t index = 0; index < actual.size(); ++index)
            EXPECT_TRUE(bitwise_equal(actual[index].second, expected[index].second)) << actual[index].first;
        const auto header = nn::read_safetensors_header((directory / "model.safetensors").string());
        EXPECT_EQ(header.find("lm_head.weight") != nullptr, !tied); // a tied head is not written, as transformers does
        fs::remove_all(directory);
    }
}

// A copy of hf_llama_tiny with config.json edited by `edit`, or a file removed.
fs::path edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path directory = fs::temp_directory_path() / ("engine_llama_bad_" + name);
    fs::remove_all(directory);
    fs::copy(data_directory + "/hf_llama_tiny_sharded", directory);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(directory / "config.json"));
    edit(config);
    std::ofstream(directory / "config.json") << config.dump();
    return directory;
}

TEST(LlamaCheckpointFiles, ErrorsNameTheFileAndTheKey) {
    const fs::path qwen = edited_copy("type", [](auto& c) { c["model_type"] = "qwen2"; });
    expect_error([&] { nn::read_pretrained_config(qwen.string()); }, {"config.json", "model_type", "qwen2"});
    const fs::path scaled = edited_copy("rope", [](auto& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
    expect_error([&] { nn::read_pretrained_config(scaled.string()); }, {"config.json", "rope_scaling", "not supported"});
    const fs::path biased = edited_copy("bias", [](auto& c) { c["attention_bias"] = true; });
    expect_error([&] { nn::read_pretrained_config(biased.string()); }, {"config.json", "attention_bias"});
    const fs::path heads = edited_copy("heads", [](auto& c) { c["num_key_value_heads"] = 3; });
    expect_error([&] { nn::read_pretrained_config(heads.string()); }, {"config.json", "num_key_value_heads"});
    const fs::path missing = edited_copy("missing_key", [](auto& c) { c.erase("hidden_size"); });
    expect_error([&] { nn::read_pretrained_config(missing.string()); }, {"config.json", "hidden_size", "missing"});
    const fs::path rope_type = edited_copy("rope_type", [](auto& c) {
        c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 500000.0}};
    });
    expect_error([&] { nn::read_pretrained_config(rope_type.string()); },
                 {"config.json", "rope_parameters.rope_type", "yarn"});
    const fs::path rope_theta = edited_copy("rope_theta", [](auto& c) {
        c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}}; // top level says 500000
    });
    expect_error([&] { nn::read_pretrained_config(rope_theta.string()); }, {"config.json", "rope_parameters.rope_theta"});
    const fs::path dropout = edited_copy("dropout", [](auto& c) { c["attention_dropout"] = 0.1; });
    expect_error([&] { nn::read_pretrained_config(dropout.string()); }, {"config.json", "attention_dropout"});
    const fs::path shard = edited_copy("shard", [](auto&) {});
    fs::remove(shard / "model-00003-of-00010.safetensors");
    nn::Llama model(nn::read_pretrained_config(shard.string()).llama(), 1);
    expect_error([&] { nn::load_pretrained_into(model, shard.string()); },
                 {"model.safetensors.index.json", "model-00003-of-00010.safetensors", "missing"});
    // A later shard whose tensor has the wrong shape: found only after earlier shards were read, and still
    // nothing of the model changes.
    const fs::path wrong = edited_copy("wrong_shape", [](auto&) {});
    nn::Llama narrow_model(nn::read_pretrained_config(wrong.string()).llama(), 1);
    {
        nn::LlamaConfig other = nn::read_pretrained_config(wrong.string()).llama();
        other.intermediate_size = 40;
        nn::Llama narrow(other, 3);
        nn::save_safetensors(narrow, (wrong / "model-00010-of-00010.safetensors").string()); // every tensor, narrower MLP
    }
    const auto snapshot = [&] {
        std::vector<std::vector<float>> values;
        for (const auto& [name, parameter] : narrow_model.named_parameters()) values.push_back(parameter.to_vector<float>());
        return values;
    };
    const auto unchanged = snapshot();
    expect_error([&] { nn::load_pretrained_into(narrow_model, wrong.string()); }, {"model-000"});
    EXPECT_EQ(snapshot(), unchanged);
    // the rotary settings of transformers 5 are read: a default rope_type with its theta
    const fs::path modern = edited_copy("modern", [](auto& c) {
        c.erase("rope_theta");
        c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
    });
    EXPECT_EQ(nn::read_pretrained_config(modern.string()).llama().rope_theta, 250000.0);
    for (const fs::path& directory :
         {qwen, scaled, biased, heads, missing, shard, rope_type, rope_theta, dropout, wrong, modern})
        fs::remove_all(directory);
}

// transformers' order: model.safetensors wins over an index beside it; and a save over a sharded directory
// leaves one set of weights (the index and its shards removed), which reads back as what was saved.
TEST(LlamaCheckpointFiles, SingleFileWinsAndSavingOverShardsRemovesThem) {
    const fs::path directory = fs::temp_directory_path() / "engine_llama_shards_then_single";
    fs::remove_all(directory);
    fs::copy(data_directory + "/hf_llama_tiny_sharded", directory);
    const nn::ModelConfig config = nn::read_pretrained_config(directory.string());
    nn::Llama saved(config.llama(), 42); // other weights than the shards'
    nn::save_pretrained(saved, directory.string(), std::nullopt, directory.string());
    EXPECT_FALSE(fs::exists(directory / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(directory / "model-00001-of-00010.safetensors"));
    EXPECT_EQ(nn::pretrained_weight_files(directory.string()).size(), 1u);
    const auto loaded = config.build(1, Device::cpu, DType::f32);
    nn::load_pretrained_into(*loaded, directory.string());
    const auto expected = saved.named_parameters();
    const auto actual = loaded->named_parameters();
    for (size_t index = 0; index < actual.size(); ++index)
        EXPECT_TRUE(bitwise_equal(actual[index].second, expected[index].second)) << actual[index].first;
    // An index put back beside the single file is ignored, as transformers ignores it.
    fs::copy_file(data_directory + "/hf_llama_tiny_sharded/model.safetensors.index.json",
                  directory / "model.safetensors.index.json");
    EXPECT_EQ(nn::pretrained_weight_files(directory.string()), std::vector<std::string>{(directory / "model.safetensors").string()});
    fs::remove_all(directory);
}

// transformers' LlamaRotaryEmbedding (float32) at positions up to 2047, head size 64: the tables are where a
// difference in inv_freq's f32 power would show, multiplied by the position. Each value within 2 ulp of 1 (2^-22):
// the f32 angle is the same product on both sides, and each side's cos/sin is within an ulp of the true value.
TEST(LlamaTransformersParity, RopeTablesMatchTransformersAtLongPositions) {
    const std::map<std::string, Tensor> golden = nn::read_safetensors(data_directory + "/hf_llama_rope_tables.safetensors");
    for (const double theta : {10000.0, 500000.0}) {
        const RopeTables tables = rope_tables(2048, 64, theta, DType::f32, Device::cpu);
        const std::string suffix = "_" + std::to_string(static_cast<int>(theta));
        for (const auto& [name, ours] : {std::pair{"cos", tables.cos}, std::pair{"sin", tables.sin}}) {
            const std::vector<float> expected = golden.at(name + suffix).to_vector<float>();
            const std::vector<float> actual = ours.to_vector<float>();
            ASSERT_EQ(actual.size(), expected.size());
            double worst = 0.0;
            for (size_t index = 0; index < actual.size(); ++index)
                worst = std::max(worst, std::fabs(double(actual[index]) - expected[index]));
            std::printf("[ %s theta %g: max |engine - transformers| %.3g ]\n", name, theta, worst);
            EXPECT_LE(worst, std::ldexp(1.0, -22)) << name << suffix;
        }
    }
}

// ---- the engine's guarantees on Llama ----

checkpoint::CheckpointPolicy policy(int every_n, int segment_size, bool offload, bool prefetch) {
    return checkpoint::CheckpointPolicy{true, every_n, segment_size, offload, prefetch};
}

// Every policy replays exactly the forward it replaces: losses and gradients bitwise the plain run's, with
// three accumulated micro-batches, for both heads and f32 and bf16.
TEST(LlamaCheckpointing, EveryPolicyIsBitwiseEqualToNoCheckpointing) {
    constexpr int batch = 2, length = 20;
    for (const DType dtype : {DType::f32, DType::bf16}) {
        for (const bool tied : {false, true}) {
            const nn::LlamaConfig config = small_llama_config(tied);
            const auto batches = make_llama_micro_batches(config, 3, batch, length);
            const LlamaGradients plain =
                accumulate_llama_gradients(config, Device::cpu, dtype, checkpoint::CheckpointPolicy{}, batches, batch, length);
            for (const checkpoint::CheckpointPolicy& checkpointed :
                 {policy(1, 1, false, false), policy(2, 1, false, false), policy(1, 2, false, false),
                  policy(1, 0, false, false), policy(1, 1, true, false), policy(2, 1, true, true)}) {
                const std::string what = std::string(dtype_name(dtype)) + (tied ? " tied " : " untied ") + checkpointed.to_string();
                checkpoint::reset_recomputed_segment_count();
                const LlamaGradients result =
                    accumulate_llama_gradients(config, Device::cpu, dtype, checkpointed, batches, batch, length);
                EXPECT_GT(checkpoint::recomputed_segment_count(), 0u) << what;
                EXPECT_EQ(result.losses, plain.losses) << what;
                ASSERT_EQ(result.gradients.size(), plain.gradients.size());
                for (size_t index = 0; index < result.gradients.size(); ++index)
                    EXPECT_TRUE(bitwise_equal(result.gradients[index].second, plain.gradients[index].second))
                        << what << ": " << result.gradients[index].first;
            }
        }
    }
}

// Three uneven micro-batches accumulate to the gradient of the one big batch. In float64 the two differ only
// by summation order: relative 1e-12 of each tensor's largest element.
TEST(LlamaAccumulation, MicroBatchesEqualTheBigBatch) {
    constexpr int length = 16;
    const nn::LlamaConfig config = small_llama_config();
    const auto pieces = make_llama_micro_batches(config, 3, 2, length);
    test::LlamaMicroBatch whole;
    for (const auto& piece : pieces) {
        whole.tokens.insert(whole.tokens.end(), piece.tokens.begin(), piece.tokens.end());
        whole.targets.insert(whole.targets.end(), piece.targets.begin(), piece.targets.end());
    }
    const checkpoint::CheckpointPolicy none;
    const LlamaGradients accumulated = accumulate_llama_gradients(config, Device::cpu, DType::f64, policy(2, 1, true, false),
                                                                  pieces, 2, length);
    const LlamaGradients big = accumulate_llama_gradients(config, Device::cpu, DType::f64, none, {whole}, 6, length);
    EXPECT_NEAR(accumulated.loss, big.loss, 1e-12 * std::fabs(big.loss));
    for (size_t index = 0; index < big.gradients.size(); ++index) {
        const std::vector<double> a = accumulated.gradients[index].second.to_vector<double>();
        const std::vector<double> b = big.gradients[index].second.to_vector<double>();
        double scale = 0.0;
        for (double value : b) scale = std::max(scale, std::fabs(value));
        for (size_t element = 0; element < a.size(); ++element)
            ASSERT_NEAR(a[element], b[element], 1e-12 * scale) << big.gradients[index].first << " " << element;
    }
}

// Central finite differences in float64 through the whole model (embedding, RMSNorm, RoPE, grouped-query
// attention, SwiGLU, tied head) for a sample of every parameter's elements.
TEST(LlamaGradcheck, WholeModelInFloat64) {
    nn::LlamaConfig config = small_llama_config(/*tied=*/true);
    config.num_hidden_layers = 2;
    config.hidden_size = 16;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.intermediate_size = 24;
    config.vocab_size = 11;
    nn::Llama model(config, 5, Device::cpu, DType::f64);
    const auto batches = make_llama_micro_batches(config, 1, 2, 7);
    const Tensor tokens = Tensor::from_vector<int32_t>(batches[0].tokens, {2, 7}, Device::cpu);
    const Tensor targets = Tensor::from_vector<int32_t>(batches[0].targets, {2, 7}, Device::cpu);
    auto loss_value = [&]() {
        NoGradGuard no_grad;
        return cross_entropy(model.forward(tokens), targets, Reduction::mean).item();
    };
    backward(cross_entropy(model.forward(tokens), targets, Reduction::mean));
    std::mt19937_64 generator = fresh_generator();
    for (const auto& [name, parameter] : model.named_parameters()) {
        const std::vector<double> analytic = parameter.grad().to_vector<double>();
        std::uniform_int_distribution<size_t> pick(0, analytic.size() - 1);
        for (int sample = 0; sample < 6; ++sample) {
            const size_t element = pick(generator);
            double* value = parameter.data<double>() + element;
            const double saved = *value, step = 1e-6;
            *value = saved + step;
            const double plus = loss_value();
            *value = saved - step;
            const double minus = loss_value();
            *value = saved;
            const double numeric = (plus - minus) / (2 * step);
            EXPECT_NEAR(analytic[element], numeric, 1e-7 + 1e-5 * std::fabs(numeric)) << name << " element " << element;
        }
    }
}

TEST(LlamaModel, ParameterNamesAreLlamaForCausalLMs) {
    nn::Llama model(nn::LlamaConfig::named("llama-tiny"), 1);
    const auto parameters = model.named_parameters();
    std::vector<std::string> names;
    for (const auto& [name, parameter] : parameters) names.push_back(name);
    EXPECT_EQ(names.front(), "model.embed_tokens.weight");
    EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
    EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.3.self_attn.k_proj.weight"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.3.mlp.down_proj.weight"), names.end());
    EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
    EXPECT_EQ(names.back(), "lm_head.weight");
    const nn::LlamaConfig& config = model.config();
    for (const auto& [name, parameter] : parameters)
        if (name.ends_with("k_proj.weight"))
            EXPECT_EQ(parameter.shape(), (Shape{config.key_value_width(), config.hidden_size})) << name;
    EXPECT_GT(model.parameter_count(), 100'000u); // "a few hundred thousand"
    EXPECT_LT(model.parameter_count(), 1'000'000u);
    EXPECT_EQ(model.block_count(), config.num_hidden_layers);
}

TEST(LlamaModel, SmolLmShapeIsThePublishedOne) {
    const nn::LlamaConfig config = nn::LlamaConfig::named("smollm-135m");
    EXPECT_EQ(config.hidden_size, 576);
    EXPECT_EQ(config.num_hidden_layers, 30);
    EXPECT_EQ(config.num_attention_heads, 9);
    EXPECT_EQ(config.num_key_value_heads, 3);
    EXPECT_EQ(config.intermediate_size, 1536);
    EXPECT_EQ(config.vocab_size, 49152);
    EXPECT_TRUE(config.tie_word_embeddings);
    // 134,515,008 parameters: the published count of SmolLM-135M (tied head counted once)
    const size_t width = 576, kv = 192, inner = 1536;
    const size_t per_layer = width * width * 2 + width * kv * 2 + 3 * width * inner + 2 * width;
    EXPECT_EQ(49152 * width + 30 * per_layer + width, 134'515'008u);
}

TEST(LlamaModel, BadConfigsAndTokensAreRefusedByName) {
    nn::LlamaConfig config = small_llama_config();
    config.num_key_value_heads = 4; // does not divide 6
    expect_error([&] { nn::Llama model(config, 1); }, {"num_key_value_heads", "4", "6"});
    config = small_llama_config();
    config.rope_theta = -1.0;
    expect_error([&] { nn::Llama model(config, 1); }, {"rope_theta"});
    nn::Llama model(small_llama_config(), 1);
    const Tensor too_long = Tensor::zeros({1, 34}, DType::i32, Device::cpu);
    expect_error([&] { model.forward(too_long); }, {"Llama", "34", "33"});
}

} // namespace
} // namespace engine::testing
