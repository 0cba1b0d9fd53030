// Every op's backward against central finite differences in float64 (tolerance: max relative error 1e-6,
// see gradcheck.h), on fresh random inputs and awkward shapes.
#include "gradcheck.h"

namespace engine::testing {
namespace {

class OpGradcheck : public TapeTest {};

TEST_F(OpGradcheck, Embedding) {
    const int batch = 2, time = 5, channels = 6, vocabulary = 11, max_time = 7;
    Tensor token_table = random_leaf(generator, {vocabulary, channels});
    Tensor position_table = random_leaf(generator, {max_time, channels});
    std::uniform_int_distribution<int32_t> token(0, vocabulary - 1);
    std::vector<int32_t> ids(batch * time);
    for (int32_t& id : ids) id = token(generator);
    ids[1] = ids[3]; // a repeated token must accumulate both rows' gradients
    Tensor tokens = Tensor::from_vector<int32_t>(ids, {batch, time}, Device::cpu);
    Tensor weights = random_tensor(generator, {batch * time * channels});
    auto result = gradcheck([&] { return weighted_sum(embedding(tokens, token_table, position_table), weights); },
                            {token_table, position_table});
    EXPECT_GRADCHECK(result);
}

TEST_F(OpGradcheck, LinearWithBias) {
    Tensor input = random_leaf(generator, {2, 7, 12});
    Tensor weight = random_leaf(generator, {12, 5}, 0.3);
    Tensor bias = random_leaf(generator, {5});
    Tensor weights = random_tensor(generator, {2 * 7 * 5});
    auto result = gradcheck([&] { return weighted_sum(linear(input, weight, bias), weights); }, {input, weight, bias});
    EXPECT_GRADCHECK(result);
}

TEST_F(OpGradcheck, MatmulPlainAndTransposed) {
    Tensor a = random_leaf(generator, {3, 4, 6});
    Tensor b = random_leaf(generator, {6, 9});
    Tensor b_transposed = random_leaf(generator, {9, 6});
    Tensor weights = random_tensor(generator, {3 * 4 * 9});
    auto plain = gradcheck([&] { return weighted_sum(matmul(a, b), weights); }, {a, b});
    EXPECT_GRADCHECK(plain);
    auto transposed = gradcheck([&] { return weighted_sum(matmul(a, b_transposed, true), weights); }, {a, b_transposed});
    EXPECT_GRADCHECK(transposed);
}

TEST_F(OpGradcheck, LayerNorm) {
    Tensor input = random_leaf(generator, {3, 7, 12}, 2.0);
    Tensor weight = random_leaf(generator, {12});
    Tensor bias = random_leaf(generator, {12});
    Tensor weights = random_tensor(generator, {3 * 7 * 12});
    auto result = gradcheck([&] { return weighted_sum(layernorm(input, weight, bias), weights); }, {input, weight, bias});
    EXPECT_GRADCHECK(result);
}

TEST_F(OpGradcheck, Gelu) {
    Tensor input = random_leaf(generator, {5, 13}, 2.0);
    Tensor weights = random_tensor(generator, {5 * 13});
    auto result = gradcheck([&] { return weighted_sum(gelu(input), weights); }, {input});
    EXPECT_GRADCHECK(result);
}

TEST_F(OpGradcheck, ResidualAddIncludingATensorUsedTwice) {
    Tensor a = random_leaf(generator, {4, 7});
    Tensor b = random_leaf(generator, {4, 7});
    Tensor weights = random_tensor(generator, {4 * 7});
    // (a + b) + a: `a` receives the sum of both paths.
    auto result = gradcheck([&] { return weighted_sum(add(add(a, b), gelu(a)), weights); }, {a, b});
    EXPECT_GRADCHECK(result);
    auto doubled = gradcheck([&] { return weighted_sum(add(a, a), weights); }, {a});
    EXPECT_GRADCHECK(doubled);
}

TEST_F(OpGradcheck, CausalAttentionAwkwardShapes) {
    // T=7, C=12, 3 heads (head size 4), and a second shape with one head.
    for (auto [batch, time, channels, heads] : {std::tuple{2, 7, 12, 3}, std::tuple{1, 5, 6, 1}}) {
        Tensor qkv = random_leaf(generator, {batch, time, 3 * channels});
        Tensor weights = random_tensor(generator, {batch * time * channels});
        auto result = gradcheck([&] { return weighted_sum(attention(qkv, heads), weights); }, {qkv});
        EXPECT_GRADCHECK(result, "attention B=" + std::to_string(batch) + " T=" + std::to_string(time) +
                                     " C=" + std::to_string(channels) + " NH=" + std::to_string(heads));
    }
}

TEST_F(OpGradcheck, DropoutReplaysItsMask) {
    Tensor input = random_leaf(generator, {6, 11});
    Tensor weights = random_tensor(generator, {6 * 11});
    auto result = gradcheck(
        [&] {
            manual_seed(1234); // every evaluation draws the same mask
            return weighted_sum(dropout(input, 0.3f), weights);
        },
        {input});
    EXPECT_GRADCHECK(result);
}

TEST_F(OpGradcheck, CrossEntropyEveryReductionWithIgnoredTargets) {
    const int rows = 9, vocabulary = 7;
    Tensor logits = random_leaf(generator, {rows, vocabulary}, 2.0);
    std::vector<int32_t> labels = {0, 6, default_ignore_index, 3, 3, 1, default_ignore_index, 5, 2};
    Tensor targets = Tensor::from_vector<int32_t>(labels, {rows}, Device::cpu);
    Tensor weights = random_tensor(generator, {rows});
    auto none = gradcheck([&] { return weighted_sum(cross_entropy(logits, targets, Reduction::none), weights); }, {logits});
    EXPECT_GRADCHECK(none);
    auto summed = gradcheck([&] { return cross_entropy(logits, targets, Reduction::sum); }, {logits});
    EXPECT_GRADCHECK(summed);
    auto mean = gradcheck([&] { return cross_entropy(logits, targets, Reduction::mean); }, {logits});
    EXPECT_GRADCHECK(mean);
}

TEST_F(OpGradcheck, SumAndMultiply) {
    Tensor input = random_leaf(generator, {3, 5});
    auto result = gradcheck([&] { return multiply(sum(gelu(input)), -0.37); }, {input});
    EXPECT_GRADCHECK(result);
}

} // namespace
} // namespace engine::testing

namespace engine::testing {
namespace {

// attention's forward against the textbook formula with the whole T×T matrix, in float64: the gradchecks
// above only prove the backward matches the forward, so a forward that sees one key too many would pass them.
TEST_F(OpGradcheck, AttentionForwardEqualsTheFullMaskedSoftmax) {
    const int batch = 2, time = 7, channels = 12, heads = 3, head_size = channels / heads;
    Tensor qkv = random_tensor(generator, {batch, time, 3 * channels});
    const std::vector<double> packed = qkv.to_vector<double>();
    const std::vector<double> out = attention(qkv, heads).to_vector<double>();
    auto at = [&](int b, int t, int part, int h, int d) {
        return packed[static_cast<size_t>(((b * time + t) * 3 + part) * channels + h * head_size + d)];
    };
    double max_error = 0.0;
    for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
            for (int t = 0; t < time; ++t) {
                std::vector<double> scores(static_cast<size_t>(time), -INFINITY);
                double largest = -INFINITY;
                for (int key = 0; key <= t; ++key) { // causal: keys 0..t only
                    double dot = 0.0;
                    for (int d = 0; d < head_size; ++d) dot += at(b, t, 0, h, d) * at(b, key, 1, h, d);
                    scores[static_cast<size_t>(key)] = dot / std::sqrt(static_cast<double>(head_size));
                    largest = std::max(largest, scores[static_cast<size_t>(key)]);
                }
                double total = 0.0;
                for (double& score : scores) total += (score = std::exp(score - largest));
                for (int d = 0; d < head_size; ++d) {
                    double expected = 0.0;
                    for (int key = 0; key < time; ++key) expected += scores[static_cast<size_t>(key)] / total * at(b, key, 2, h, d);
                    const double actual = out[static_cast<size_t>((b * time + t) * channels + h * head_size + d)];
                    max_error = std::max(max_error, std::fabs(actual - expected));
                }
            }
    EXPECT_LE(max_error, 1e-12);
}

// Causality as a property: changing anything at positions after t leaves outputs at positions ≤ t bitwise.
TEST_F(OpGradcheck, AttentionOutputsIgnoreLaterPositions) {
    const int time = 9, channels = 8;
    Tensor qkv = random_tensor(generator, {1, time, 3 * channels});
    const std::vector<double> before = attention(qkv, 2).to_vector<double>();
    for (int cut = 0; cut + 1 < time; ++cut) {
        std::vector<double> changed = qkv.to_vector<double>();
        for (size_t index = static_cast<size_t>((cut + 1) * 3 * channels); index < changed.size(); ++index)
            changed[index] += 1.0;
        const std::vector<double> after =
            attention(Tensor::from_vector<double>(changed, qkv.shape(), Device::cpu), 2).to_vector<double>();
        for (int index = 0; index < (cut + 1) * channels; ++index)
            ASSERT_EQ(after[static_cast<size_t>(index)], before[static_cast<size_t>(index)]) << "cut " << cut;
    }
}

// Dropout's values: each output is 0 or exactly input/(1-p), and its gradient is 1/(1-p) where kept, else 0.
TEST_F(OpGradcheck, DropoutScalesKeptValuesAndTheirGradient) {
    const float probability = 0.25f;
    Tensor input = random_tensor(generator, {1000}, DType::f64);
    input.set_requires_grad(true);
    manual_seed(3);
    Tensor out = dropout(input, probability);
    const std::vector<double> values = input.to_vector<double>(), kept = out.to_vector<double>();
    const double scale = 1.0 / (1.0 - static_cast<double>(probability));
    int kept_count = 0;
    for (size_t index = 0; index < values.size(); ++index) {
        if (kept[index] == 0.0) continue;
        ++kept_count;
        ASSERT_EQ(kept[index], values[index] * scale) << "element " << index;
    }
    EXPECT_GT(kept_count, 650);
    EXPECT_LT(kept_count, 850);
    backward(sum(out));
    const std::vector<double> gradient = input.grad().to_vector<double>();
    for (size_t index = 0; index < values.size(); ++index)
        ASSERT_EQ(gradient[index], kept[index] == 0.0 ? 0.0 : scale) << "element " << index;
}

} // namespace
} // namespace engine::testing
