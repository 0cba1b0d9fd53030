// The packed-documents oracle (issue 29): a batch of documents packed back to back gives every document the loss
// and the gradients it gets run alone. Shared by the CPU test (tests/test_packed_documents.cpp) and the device one
// (tests/cuda/test_packed_documents_cuda.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "nn/causal_lm.h"
#include "nn/gpt.h"
#include "nn/io/token_data.h"
#include "nn/llama.h"

namespace engine::test {

using Rows = std::vector<std::vector<std::vector<int32_t>>>; // row -> documents -> tokens

// Three rows of T = 24: documents of 5, 1, 9 and 3 tokens (6 of padding), of 7, 12 and 4 (1), and of 1, 16 and 2
// (5): a one-token document at a row's start and inside one, documents that start mid-tile, and padding.
inline Rows packed_test_rows(int vocabulary, uint32_t seed = 20261206) {
    const std::vector<std::vector<int>> lengths = {{5, 1, 9, 3}, {7, 12, 4}, {1, 16, 2}};
    std::mt19937 generator(seed);
    std::uniform_int_distribution<int32_t> token(1, vocabulary - 1);
    Rows rows;
    for (const std::vector<int>& row : lengths) {
        std::vector<std::vector<int32_t>>& documents = rows.emplace_back();
        for (int length : row) {
            std::vector<int32_t>& document = documents.emplace_back();
            for (int index = 0; index < length; ++index) document.push_back(token(generator));
        }
    }
    return rows;
}
inline constexpr int packed_test_length = 24;

struct DocumentRun {
    std::vector<double> losses;                                         // per document, in row order
    std::vector<std::pair<std::string, std::vector<double>>> gradients; // every trainable parameter's
};

template <typename T>
std::vector<double> as_doubles_of(const Tensor& tensor) {
    const std::vector<T> values = tensor.to(Device::cpu).to_vector<T>();
    return std::vector<double>(values.begin(), values.end());
}

inline std::vector<double> to_doubles(const Tensor& tensor) {
    const Tensor host = tensor.to(Device::cpu);
    if (host.dtype() == DType::f64) return as_doubles_of<double>(host);
    return as_doubles_of<float>(host.dtype() == DType::f32 ? host : cast(host, DType::f32));
}

inline std::vector<std::pair<std::string, std::vector<double>>> gradients_of(nn::Module& model) {
    std::vector<std::pair<std::string, std::vector<double>>> gradients;
    for (const auto& [name, parameter] : model.named_parameters())
        if (parameter.requires_grad()) gradients.emplace_back(name, to_doubles(parameter.grad()));
    return gradients;
}

// Targets of a (B,T) label tensor, shifted as the trainer shifts them: position t predicts labels[t+1].
inline Tensor shifted(const Tensor& labels, Device device) {
    const int64_t rows = labels.size(0), time = labels.size(1);
    const std::vector<int32_t> values = labels.to(Device::cpu).to_vector<int32_t>();
    std::vector<int32_t> targets(values.size(), default_ignore_index);
    for (int64_t b = 0; b < rows; ++b)
        for (int64_t t = 0; t + 1 < time; ++t) targets[size_t(b * time + t)] = values[size_t(b * time + t + 1)];
    return Tensor::from_vector(targets, labels.shape(), device);
}

// The packed batch through forward(inputs, positions): per-document sums of the per-token losses, and the
// gradients of their total.
inline DocumentRun run_packed(nn::CausalLM& model, const Rows& rows, Device device) {
    model.zero_grad();
    const nn::Batch batch = nn::make_packed_document_batch(rows, packed_test_length, 0, Device::cpu);
    const Tensor inputs = batch.inputs.to(device), positions = batch.positions.to(device);
    const Tensor targets = shifted(batch.labels, device);
    const Tensor logits = model.forward(inputs, positions); // (B,T,V)
    const Tensor per_token = cross_entropy(logits, targets, Reduction::none);
    const std::vector<double> token_losses = to_doubles(per_token);
    DocumentRun run;
    for (size_t row = 0; row < rows.size(); ++row) {
        size_t start = 0;
        for (const std::vector<int32_t>& document : rows[row]) {
            double sum = 0.0; // the document's targets: its positions but the last
            for (size_t t = start; t + 1 < start + document.size(); ++t)
                sum += token_losses[row * packed_test_length + t];
            run.losses.push_back(sum);
            start += document.size();
        }
    }
    backward(cross_entropy(logits, targets, Reduction::sum));
    run.gradients = gradients_of(model);
    return run;
}

// Each document alone, a (1,L) batch with positions 0..L-1: its summed loss, and the gradients of all of them
// (accumulated, as the trainer's micro-batches are).
inline DocumentRun run_alone(nn::CausalLM& model, const Rows& rows, Device device) {
    model.zero_grad();
    DocumentRun run;
    for (const std::vector<std::vector<int32_t>>& documents : rows)
        for (const std::vector<int32_t>& document : documents) {
            const int64_t length = static_cast<int64_t>(document.size());
            std::vector<int32_t> targets(document.size(), default_ignore_index);
            for (size_t t = 0; t + 1 < document.size(); ++t) targets[t] = document[t + 1];
            const Tensor inputs = Tensor::from_vector(document, {1, length}, device);
            const Tensor target_tensor = Tensor::from_vector(targets, {1, length}, device);
            const Tensor loss = cross_entropy(model.forward(inputs), target_tensor, Reduction::sum);
            run.losses.push_back(to_doubles(loss)[0]);
            backward(loss);
        }
    run.gradients = gradients_of(model);
    return run;
}

// |a - b| <= bound · max(1, max |b|) over a tensor: the bound relative to the tensor's scale.
inline ::testing::AssertionResult close_on_scale(const std::vector<double>& actual, const std::vector<double>& expected,
                                                 double bound, const std::string& what) {
    if (actual.size() != expected.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
    double scale = 1.0, worst = 0.0;
    for (double value : expected) scale = std::max(scale, std::abs(value));
    for (size_t index = 0; index < actual.size(); ++index)
        worst = std::max(worst, std::abs(actual[index] - expected[index]));
    if (!(worst <= bound * scale))
        return ::testing::AssertionFailure()
               << what << ": worst difference " << worst << " above " << bound << " x " << scale;
    return ::testing::AssertionSuccess() << what << ": worst difference " << worst << " (scale " << scale << ")";
}

// The largest |a - b| / max(1, max |b|) over a tensor.
inline double relative_difference(const std::vector<double>& actual, const std::vector<double>& expected) {
    double scale = 1.0, worst = 0.0;
    for (double value : expected) scale = std::max(scale, std::abs(value));
    for (size_t index = 0; index < actual.size() && index < expected.size(); ++index)
        worst = std::max(worst, std::abs(actual[index] - expected[index]));
    return worst / scale;
}

inline void expect_documents_match(const DocumentRun& packed, const DocumentRun& alone, double bound,
                                   const std::string& what) {
    EXPECT_TRUE(close_on_scale(packed.losses, alone.losses, bound, what + ", per-document losses"));
    ASSERT_EQ(packed.gradients.size(), alone.gradients.size());
    double largest = relative_difference(packed.losses, alone.losses);
    for (size_t index = 0; index < packed.gradients.size(); ++index) {
        EXPECT_TRUE(close_on_scale(packed.gradients[index].second, alone.gradients[index].second, bound,
                                   what + ", gradient of " + packed.gradients[index].first));
        largest = std::max(largest, relative_difference(packed.gradients[index].second, alone.gradients[index].second));
    }
    std::cout << "  " << what << ": largest difference " << largest << " of a tensor's scale (bound " << bound << ")\n";
}

// The oracle for one model on `device`: the packed batch under `policy`, against its documents run alone (plain).
template <typename Model, typename Config>
void check_packed_model(const Config& config, Device device, DType dtype, const checkpoint::CheckpointPolicy& policy,
                        double bound, const std::string& what) {
    Model model(config, 5, device, dtype);
    model.train(true);
    const Rows rows = packed_test_rows(config.vocab_size);
    model.set_checkpointing(policy);
    const DocumentRun packed = run_packed(model, rows, device);
    model.set_checkpointing(checkpoint::CheckpointPolicy{});
    const DocumentRun alone = run_alone(model, rows, device);
    expect_documents_match(packed, alone, bound, what + " " + dtype_name(dtype) + " " + policy.to_string());
}

inline nn::GPTConfig packed_test_gpt_config() {
    nn::GPTConfig config;
    config.vocab_size = 97;
    config.max_seq_len = 32;
    config.n_layer = 3;
    config.n_head = 4;
    config.n_embd = 32;
    return config;
}

} // namespace engine::test
