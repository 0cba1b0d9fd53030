// Every op's backward against central finite differences in float64 (tolerance: max relative error 1e-6,
// see gradcheck.h), on fresh random inputs and awkward shapes.
#include "gradcheck.h"

namespace engine::testing {
namespace {

constexpr double tolerance = 1e-6;

class OpGradcheck : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
};

#define EXPECT_GRADCHECK(result) \
    EXPECT_LE((result).max_relative_error, tolerance) << "worst: " << (result).worst

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
        EXPECT_GRADCHECK(result) << " B=" << batch << " T=" << time << " C=" << channels << " NH=" << heads;
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
