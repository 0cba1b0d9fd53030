// Packed documents (issue 29 item 4) on the CPU: each document of a packed batch gets the loss and the gradients
// it gets alone (tests/packed_documents.h), GPT-2 and Llama, f64 and f32, plain and checkpointed; the batch
// layout; and bad positions refused with one clear line.
#include <gtest/gtest.h>

#include "tests/expect_error.h"
#include "tests/llama_step.h"
#include "tests/packed_documents.h"

namespace engine::test {
namespace {

using checkpoint::CheckpointPolicy;
using engine::testing::expect_error;

// f64 is the kernels' specification, summed in another order packed than alone: 1e-13 of each tensor's scale
// (measured 2.0e-15). f32 sums through the BLAS in panels that differ between the two layouts: 1e-5 (measured
// 1.1e-6 for Llama, 4.5e-7 for GPT-2, 2026-12-06).
double bound_for(DType dtype) { return dtype == DType::f64 ? 1e-13 : 1e-5; }

TEST(PackedDocuments, EveryDocumentGetsItsOwnLossAndGradientsGpt2) {
    for (DType dtype : {DType::f64, DType::f32})
        for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 1, 1, false}})
            check_packed_model<nn::GPT>(packed_test_gpt_config(), Device::cpu, dtype, policy, bound_for(dtype),
                                        "GPT-2");
}

TEST(PackedDocuments, EveryDocumentGetsItsOwnLossAndGradientsLlama) {
    for (DType dtype : {DType::f64, DType::f32})
        for (const CheckpointPolicy& policy : {CheckpointPolicy{}, CheckpointPolicy{true, 2, 1, true}})
            check_packed_model<nn::Llama>(small_llama_config(false), Device::cpu, dtype, policy, bound_for(dtype),
                                          "Llama");
}

// Without packing the oracle's other side is today's forward: one document a row with positions 0..T-1 is
// bitwise the forward without positions (the kernels' masks then cut nothing).
TEST(PackedDocuments, OneDocumentPerRowIsBitwiseTheUnpackedForward) {
    nn::Llama model(small_llama_config(false), 3, Device::cpu, DType::f32);
    const Rows rows = {{std::vector<int32_t>(packed_test_length, 5)}, {std::vector<int32_t>(packed_test_length, 7)}};
    const nn::Batch batch = nn::make_packed_document_batch(rows, packed_test_length);
    const std::vector<float> with = model.forward(batch.inputs, batch.positions).to_vector<float>();
    const std::vector<float> without = model.forward(batch.inputs).to_vector<float>();
    EXPECT_EQ(with, without);
}

TEST(PackedDocuments, BatchLayoutRestartsPositionsAndIgnoresTheLabelAcrossABoundary) {
    const nn::Batch batch = nn::make_packed_document_batch({{{11, 12, 13}, {21, 22}}, {{31}}}, 6, 0);
    EXPECT_EQ(batch.inputs.to_vector<int32_t>(), (std::vector<int32_t>{11, 12, 13, 21, 22, 0, 31, 0, 0, 0, 0, 0}));
    EXPECT_EQ(batch.labels.to_vector<int32_t>(),
              (std::vector<int32_t>{-100, 12, 13, -100, 22, -100, -100, -100, -100, -100, -100, -100}));
    EXPECT_EQ(batch.positions.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 0, 1, 2, 3, 4}));
    expect_error([] { nn::make_packed_document_batch({{{1, 2, 3}, {4, 5}}}, 4); }, {"more than 4 tokens"});
    expect_error([] { nn::make_packed_document_batch({{{1}, {}}}, 4); }, {"empty document"});
}

TEST(PackedDocuments, LoaderPacksWholeDocumentsInFileOrder) {
    // Documents (end of text 0) of 3, 2, 4, 1 and 5 tokens into rows of 6: {3, 2}, {4, 1}, {5}.
    const std::vector<int32_t> tokens = {1, 2, 0, 3, 0, 4, 5, 6, 0, 0, 7, 8, 9, 9, 0};
    nn::DataLoaderOptions options;
    options.batch_size = 3;
    options.sequence_length = 6;
    options.shuffle = false;
    options.layout = nn::DataLayout::packed_documents;
    options.end_of_text = 0;
    nn::DataLoader loader(tokens, options);
    EXPECT_EQ(loader.window_count(), 3);
    const nn::Batch batch = *loader.next();
    EXPECT_EQ(batch.inputs.to_vector<int32_t>(),
              (std::vector<int32_t>{1, 2, 0, 3, 0, 0, 4, 5, 6, 0, 0, 0, 7, 8, 9, 9, 0, 0}));
    EXPECT_EQ(batch.positions.to_vector<int32_t>(),
              (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 0, 0, 1, 2, 3, 4, 0}));
    EXPECT_EQ(nn::parse_data_layout("packed-documents"), nn::DataLayout::packed_documents);
    EXPECT_STREQ(nn::data_layout_name(nn::DataLayout::packed_documents), "packed-documents");
}

TEST(PackedDocuments, BadPositionsAreRefusedBeforeAnyKernel) {
    nn::Llama model(small_llama_config(false), 3, Device::cpu, DType::f32);
    const Tensor tokens = Tensor::from_vector<int32_t>({1, 2, 3, 4}, {1, 4}, Device::cpu);
    expect_error(
        [&] {
            model.forward(tokens, Tensor::from_vector<int32_t>({0, 1, 3, 0}, {1, 4}, Device::cpu));
        },
        {"hold 3 at (0,2) after 1"});
    expect_error(
        [&] {
            model.forward(tokens, Tensor::from_vector<int32_t>({1, 2, 3, 4}, {1, 4}, Device::cpu));
        },
        {"hold 1 at (0,0)"});
    expect_error(
        [&] {
            model.forward(tokens, Tensor::from_vector<int32_t>({0, 1, 2}, {1, 3}, Device::cpu));
        },
        {"must be (1,4) i32"});
    const Tensor qkv = Tensor::zeros({1, 4, 12}, DType::f32, Device::cpu);
    expect_error(
        [&] {
            attention(qkv, 2, 2, Tensor::from_vector<int32_t>({0, 2, 0, 1}, {1, 4}, Device::cpu));
        },
        {"attention: document positions"});
}

} // namespace
} // namespace engine::test

namespace engine::test {
namespace {

// Documents (end of text 0) of the given lengths, end of text included, ids 1.. otherwise.
std::vector<int32_t> documents_of(const std::vector<int>& lengths) {
    std::vector<int32_t> tokens;
    for (int length : lengths) {
        for (int index = 0; index + 1 < length; ++index) tokens.push_back(1 + static_cast<int32_t>(tokens.size() % 50));
        tokens.push_back(0);
    }
    return tokens;
}

nn::DataLoaderOptions budget_options(nn::DataLayout layout, int max_tokens) {
    nn::DataLoaderOptions options;
    options.batch_size = 4;
    options.sequence_length = 12;
    options.layout = layout;
    options.end_of_text = 0;
    options.max_tokens = max_tokens;
    options.seed = 3;
    return options;
}

// Issue 29 item 5: a token budget per micro-batch bounds rows x longest row, cuts the batch to its longest row,
// uses every row of an epoch once, and resumes from its cursor exactly.
TEST(TokenBudget, BatchesStayWithinTheBudgetAndUseEveryRowOnce) {
    const std::vector<int> lengths = {3, 12, 5, 20, 2, 7, 7, 1, 9, 4, 11, 6, 2, 8};
    for (const nn::DataLayout layout : {nn::DataLayout::padded, nn::DataLayout::packed_documents}) {
        const nn::DataLoaderOptions options = budget_options(layout, 24);
        nn::DataLoader loader(documents_of(lengths), options);
        const int64_t batches = loader.batches_per_epoch();
        int64_t rows = 0, tokens = 0;
        for (int64_t index = 0; index < batches; ++index) {
            const nn::Batch batch = *loader.next();
            const int64_t batch_rows = batch.inputs.size(0), length = batch.inputs.size(1);
            EXPECT_LE(batch_rows * length, 24) << nn::data_layout_name(layout) << " batch " << index;
            EXPECT_LE(batch_rows, 4);
            EXPECT_LE(length, 12);
            // Cut to its longest row: some row's last position holds a token (a label, or a document's first).
            const std::vector<int32_t> labels = batch.labels.to_vector<int32_t>();
            bool full = false;
            for (int64_t row = 0; row < batch_rows; ++row)
                full = full || labels[size_t(row * length + length - 1)] != default_ignore_index || length == 1;
            EXPECT_TRUE(full) << nn::data_layout_name(layout) << " batch " << index << " is not cut to its longest row";
            rows += batch_rows;
            for (int32_t label : labels) tokens += label != default_ignore_index;
        }
        EXPECT_EQ(rows, loader.window_count()) << nn::data_layout_name(layout);
        EXPECT_EQ(loader.cursor().position, loader.window_count()) << nn::data_layout_name(layout);
        // Resume: a restored cursor yields what the loader yields next.
        const nn::LoaderCursor cursor = loader.cursor();
        const nn::Batch expected = *loader.next();
        nn::DataLoader resumed(documents_of(lengths), options);
        resumed.restore(cursor);
        const nn::Batch actual = *resumed.next();
        EXPECT_EQ(actual.inputs.to_vector<int32_t>(), expected.inputs.to_vector<int32_t>());
        EXPECT_EQ(actual.inputs.shape(), expected.inputs.shape());
    }
}

TEST(TokenBudget, WorstBatchShapeAndRefusals) {
    EXPECT_EQ(nn::largest_batch_shape(4, 24, 48), (std::pair<int, int>{2, 24}));
    EXPECT_EQ(nn::largest_batch_shape(8, 64, 100), (std::pair<int, int>{2, 50}));
    EXPECT_EQ(nn::largest_batch_shape(3, 16, 1000), (std::pair<int, int>{3, 16}));
    EXPECT_EQ(nn::largest_batch_shape(3, 16, 0), (std::pair<int, int>{3, 16}));
    EXPECT_EQ(nn::largest_batch_shape(4, 16, 40, true), (std::pair<int, int>{2, 16})); // packed: rows of T only
    const std::vector<int32_t> tokens = documents_of({3, 4, 5, 6});
    expect_error([&] { nn::DataLoader(tokens, budget_options(nn::DataLayout::padded, 11)); },
                 {"token budget of 11", "below one row of 12"});
    nn::DataLoaderOptions ranks = budget_options(nn::DataLayout::padded, 24);
    ranks.world_size = 2;
    expect_error([&] { nn::DataLoader(tokens, ranks); }, {"one rank"});
}

} // namespace
} // namespace engine::test
