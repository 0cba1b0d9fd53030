// GPT-2 parity with an independent PyTorch implementation: logits, causal-LM loss and every parameter
// gradient against tests/data/gpt_tiny.golden (written by tests/golden/make_gpt_golden.py, float64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt.h"

namespace engine::testing {
namespace {

constexpr int32_t golden_magic = 0x474F4C44;
constexpr int32_t golden_version = 1;

struct GoldenParameter {
    std::string name;
    Shape shape;
    std::vector<double> value, gradient;
};

struct Golden {
    nn::GPTConfig config;
    int batch = 0, sequence_length = 0;
    std::vector<int32_t> tokens, labels; // (B,T)
    std::vector<GoldenParameter> parameters;
    double loss = 0.0;
    std::vector<double> logits; // (B,T,V)
};

class GoldenReader {
public:
    explicit GoldenReader(const std::string& path) : path_(path), file_(path, std::ios::binary) {
        ENGINE_CHECK(file_.good(), "golden file '" << path << "' cannot be opened");
    }
    template <typename T>
    std::vector<T> read(size_t count) {
        std::vector<T> values(count);
        file_.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(T)));
        ENGINE_CHECK(file_.good(), "golden file '" << path_ << "' is truncated");
        return values;
    }
    template <typename T>
    T one() { return read<T>(1)[0]; }
    bool at_end() { return file_.peek() == std::char_traits<char>::eof(); }

private:
    std::string path_;
    std::ifstream file_;
};

// Throws EngineError on a bad magic, an unknown version, a truncated file or trailing bytes.
Golden read_golden(const std::string& path) {
    GoldenReader reader(path);
    const auto magic = reader.one<int32_t>();
    ENGINE_CHECK(magic == golden_magic, "golden file '" << path << "': bad magic " << magic);
    const auto version = reader.one<int32_t>();
    ENGINE_CHECK(version == golden_version, "golden file '" << path << "': unsupported version " << version);
    Golden golden;
    const std::vector<int32_t> config = reader.read<int32_t>(7);
    golden.config = {config[0], config[1], config[2], config[3], config[4], 0.0f};
    golden.batch = config[5];
    golden.sequence_length = config[6];
    const size_t tokens = static_cast<size_t>(golden.batch) * static_cast<size_t>(golden.sequence_length);
    golden.tokens = reader.read<int32_t>(tokens);
    golden.labels = reader.read<int32_t>(tokens);
    const auto count = reader.one<int32_t>();
    for (int32_t index = 0; index < count; ++index) {
        GoldenParameter parameter;
        const std::vector<char> name = reader.read<char>(static_cast<size_t>(reader.one<int32_t>()));
        parameter.name.assign(name.begin(), name.end());
        const std::vector<int64_t> dims = reader.read<int64_t>(static_cast<size_t>(reader.one<int32_t>()));
        parameter.shape.assign(dims.begin(), dims.end());
        parameter.value = reader.read<double>(static_cast<size_t>(shape_numel(parameter.shape)));
        golden.parameters.push_back(std::move(parameter));
    }
    golden.loss = reader.one<double>();
    for (GoldenParameter& parameter : golden.parameters)
        parameter.gradient = reader.read<double>(parameter.value.size());
    golden.logits = reader.read<double>(tokens * static_cast<size_t>(golden.config.vocab_size));
    ENGINE_CHECK(reader.at_end(), "golden file '" << path << "' has trailing bytes");
    return golden;
}

const std::string golden_path = std::string(ENGINE_TEST_DATA_DIR) + "/gpt_tiny.golden";

// Every element must satisfy |actual − expected| ≤ absolute + relative·|expected|. Both sides are float64
// and differ only in summation order, so relative 1e-10 leaves ~5 orders of magnitude above rounding;
// the 1e-13 absolute floor only matters for elements that are themselves ~0.
constexpr double relative_tolerance = 1e-10;
constexpr double absolute_tolerance = 1e-13;

// Returns the worst |actual − expected| / |expected| over elements with |expected| > 1e-8, for the report
// (the key biases' gradients are exactly 0 in exact arithmetic: softmax ignores a per-row constant).
double expect_close(const std::vector<double>& actual, const std::vector<double>& expected, const std::string& what) {
    EXPECT_EQ(actual.size(), expected.size()) << what;
    if (actual.size() != expected.size()) return 0.0;
    double worst_relative = 0.0;
    double worst = 0.0;
    size_t worst_index = 0, mismatches = 0;
    for (size_t index = 0; index < actual.size(); ++index) {
        const double error = std::abs(actual[index] - expected[index]);
        const double allowed = absolute_tolerance + relative_tolerance * std::abs(expected[index]);
        if (error / allowed > worst) worst = error / allowed, worst_index = index;
        if (std::abs(expected[index]) > 1e-8) worst_relative = std::max(worst_relative, error / std::abs(expected[index]));
        if (error > allowed && ++mismatches <= 3)
            ADD_FAILURE() << what << "[" << index << "]: " << actual[index] << " vs golden " << expected[index]
                          << " (error " << error << ", allowed " << allowed << ")";
    }
    EXPECT_EQ(mismatches, 0u) << what << ": worst error/allowed " << worst << " at " << worst_index;
    return worst_relative;
}

TEST(GoldenGpt, LogitsLossAndGradientsMatchPyTorch) {
    current_tape().clear();
    const Golden golden = read_golden(golden_path);
    const int B = golden.batch, T = golden.sequence_length, V = golden.config.vocab_size;
    nn::GPT model(golden.config, /*seed=*/7, Device::cpu, DType::f64);

    const auto parameters = model.named_parameters();
    ASSERT_EQ(parameters.size(), golden.parameters.size());
    for (size_t index = 0; index < parameters.size(); ++index) {
        const GoldenParameter& expected = golden.parameters[index];
        ASSERT_EQ(parameters[index].first, expected.name) << "parameter order differs from the golden file";
        ASSERT_EQ(parameters[index].second.shape(), expected.shape) << expected.name;
        Tensor parameter = parameters[index].second;
        parameter.copy_from(Tensor::from_vector<double>(expected.value, expected.shape, Device::cpu));
    }

    // Causal LM: position t's target is labels[t+1]; the last position has none (-100).
    std::vector<int32_t> shifted(golden.labels.size(), default_ignore_index); // (B,T)
    for (int row = 0; row < B; ++row)
        for (int t = 0; t + 1 < T; ++t) shifted[static_cast<size_t>(row * T + t)] = golden.labels[static_cast<size_t>(row * T + t + 1)];
    const Tensor tokens = Tensor::from_vector<int32_t>(golden.tokens, {B, T}, Device::cpu);
    const Tensor targets = Tensor::from_vector<int32_t>(shifted, {B, T}, Device::cpu);

    model.zero_grad();
    const Tensor logits = model.forward(tokens); // (B,T,V)
    ASSERT_EQ(logits.shape(), (Shape{B, T, V}));
    const Tensor loss = cross_entropy(logits, targets, Reduction::mean);
    backward(loss);

    const double logits_error = expect_close(logits.to_vector<double>(), golden.logits, "logits");
    const double loss_error = expect_close({loss.item()}, {golden.loss}, "loss");
    double gradient_error = 0.0;
    for (size_t index = 0; index < parameters.size(); ++index)
        gradient_error = std::max(gradient_error, expect_close(parameters[index].second.grad().to_vector<double>(),
                                                               golden.parameters[index].gradient,
                                                               "d loss / d " + golden.parameters[index].name));
    std::printf("[ worst relative error: logits %.3g, loss %.3g, gradients %.3g ]\n", logits_error, loss_error,
                gradient_error);
}

TEST(GoldenGpt, ReaderRejectsBadMagicAndVersion) {
    std::ifstream source(golden_path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(source)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 8u);
    const std::string path = ::testing::TempDir() + "gpt_tiny_corrupt.golden";
    auto write_with_word = [&](size_t offset, int32_t word) {
        std::vector<char> copy = bytes;
        std::memcpy(copy.data() + offset, &word, sizeof(word));
        std::ofstream(path, std::ios::binary).write(copy.data(), static_cast<std::streamsize>(copy.size()));
    };
    write_with_word(0, golden_magic + 1);
    EXPECT_THROW(read_golden(path), EngineError);
    write_with_word(4, golden_version + 1);
    EXPECT_THROW(read_golden(path), EngineError);
    write_with_word(4, golden_version); // unchanged copy reads fine: the checks above are not vacuous
    EXPECT_NO_THROW(read_golden(path));
    std::remove(path.c_str());
}

} // namespace
} // namespace engine::testing
