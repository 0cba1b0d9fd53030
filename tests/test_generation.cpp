// Cached decoding and sampling (nn/generation.h): the logits of prefill-then-one-token decoding against the
// full forward at every position, greedy generation against argmax of full forwards re-run on the growing
// sequence, seeded sampling, and the errors for bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/autograd.h"
#include "engine/ops/decode.h"
#include "expect_error.h"
#include "gradcheck.h"
#include "nn/generation.h"

namespace engine::testing {
namespace {

class Generation : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }
    void TearDown() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();

    std::vector<int32_t> random_ids(int count, int vocabulary) {
        std::uniform_int_distribution<int> token(0, vocabulary - 1);
        std::vector<int32_t> ids(static_cast<size_t>(count));
        for (int32_t& id : ids) id = token(generator);
        return ids;
    }
};

std::vector<double> as_doubles(const Tensor& tensor) {
    return cast(tensor.to(Device::cpu), DType::f64).to_vector<double>();
}

// The bound on |cached - full| for a model whose only difference between the two paths is summation order: the
// GEMMs', and attention's in f32 (the forward sums in float through sgemm, the decode kernel in double; in f64 the
// decode kernel is attention_forward's arithmetic in the same order, bitwise at past 0). Every such sum here (a
// GEMM dot, a head's q·k of head-size terms, P·V over at most T keys) has at most 4C terms, and
// each dot of at most 4C terms is within 4C·u of Σ|a·b| either way, over L blocks, times the gain G of what
// follows it (LayerNorm's 1/σ of a residual stream of σ ≥ 0.02 at GPT-2's init: G ≤ 100), relative to the
// logits' scale.
double reordering_bound(const nn::GPTConfig& config, double unit_roundoff, double logit_scale) {
    constexpr double gain = 100.0;
    return (config.n_layer + 1) * 4.0 * config.n_embd * unit_roundoff * gain * logit_scale;
}

// Prefill of `prefill` positions, then one position at a time, compared with the full forward everywhere.
void check_cached_against_full(const nn::GPT& model, const std::vector<int32_t>& ids, int batch, int prefill,
                               double unit_roundoff) {
    const nn::GPTConfig& config = model.config();
    const int time = static_cast<int>(ids.size()) / batch;
    const Tensor tokens = Tensor::from_vector<int32_t>(ids, {batch, time}, Device::cpu);
    std::vector<double> full;
    {
        const NoGradGuard no_grad;
        full = as_doubles(model.forward(tokens)); // (B,T,V)
    }
    double logit_scale = 0.0;
    for (double value : full) logit_scale = std::max(logit_scale, std::fabs(value));
    const double bound = reordering_bound(config, unit_roundoff, logit_scale);

    nn::KVCache cache(model, batch);
    const int V = config.vocab_size;
    double max_error = 0.0;
    for (int start = 0; start < time;) {
        const int count = start == 0 ? prefill : 1;
        std::vector<int32_t> step;
        for (int b = 0; b < batch; ++b)
            for (int t = start; t < start + count; ++t) step.push_back(ids[static_cast<size_t>(b * time + t)]);
        const Tensor step_tokens = Tensor::from_vector<int32_t>(step, {batch, count}, Device::cpu);
        const std::vector<double> cached = as_doubles(nn::forward_cached(model, step_tokens, cache));
        ASSERT_EQ(cache.length(), start + count);
        for (int b = 0; b < batch; ++b)
            for (int t = 0; t < count; ++t)
                for (int v = 0; v < V; ++v) {
                    const double expected = full[(static_cast<size_t>(b) * time + start + t) * V + v];
                    const double actual = cached[(static_cast<size_t>(b) * count + t) * V + v];
                    max_error = std::max(max_error, std::fabs(actual - expected));
                    ASSERT_LE(std::fabs(actual - expected), bound)
                        << "batch " << b << " position " << start + t << " token " << v;
                }
        start += count;
    }
    std::printf("cached vs full logits: max |error| %.3g (bound %.3g, logits up to %.3g)\n", max_error, bound,
                logit_scale);
}

TEST_F(Generation, CachedLogitsEqualFullForwardFloat64) {
    const nn::GPTConfig config{37, 24, 3, 2, 16, 0.0f};
    const nn::GPT model(config, 5, Device::cpu, DType::f64);
    check_cached_against_full(model, random_ids(2 * 20, 37), 2, 7, 0x1.0p-53);
    EXPECT_TRUE(current_tape().empty()); // inference records nothing
}

TEST_F(Generation, CachedLogitsEqualFullForwardFloat32PaddedVocabulary) {
    const nn::GPTConfig config{200, 16, 2, 4, 32, 0.0f}; // 200 -> 256 padded rows in wte
    const nn::GPT model(config, 8, Device::cpu, DType::f32);
    check_cached_against_full(model, random_ids(3 * 16, 200), 3, 1, 0x1.0p-24);
}

// Dropout is identity at inference, whatever the module's training flag.
TEST_F(Generation, CachedLogitsIgnoreDropout) {
    const nn::GPTConfig config{30, 12, 2, 2, 16, 0.5f};
    nn::GPT model(config, 3, Device::cpu, DType::f64);
    const std::vector<int32_t> ids = random_ids(12, 30);
    model.train(false);
    std::vector<double> full;
    {
        const NoGradGuard no_grad;
        full = as_doubles(model.forward(Tensor::from_vector<int32_t>(ids, {1, 12}, Device::cpu)));
    }
    model.train(true);
    nn::KVCache cache(model, 1);
    const std::vector<double> cached =
        as_doubles(nn::forward_cached(model, Tensor::from_vector<int32_t>(ids, {1, 12}, Device::cpu), cache));
    double logit_scale = 0.0;
    for (double value : full) logit_scale = std::max(logit_scale, std::fabs(value));
    const double bound = reordering_bound(config, 0x1.0p-53, logit_scale);
    for (size_t index = 0; index < full.size(); ++index) ASSERT_NEAR(cached[index], full[index], bound) << index;
}

// The sampler's prefill: CachedLogits::last makes the newest position's logits alone, (B,1,V), the same as the
// last row of every position's (a GEMM's rows are independent), and fills the cache for every position.
TEST_F(Generation, LastPositionLogitsAreTheLastRowOfAll) {
    const nn::GPTConfig config{30, 12, 2, 2, 16, 0.0f};
    nn::GPT model(config, 3, Device::cpu, DType::f64);
    const std::vector<int32_t> ids = random_ids(2 * 9, 30);
    const Tensor tokens = Tensor::from_vector<int32_t>(ids, {2, 9}, Device::cpu);
    nn::KVCache every(model, 2), newest(model, 2);
    const Tensor all = nn::forward_cached(model, tokens, every);
    const Tensor last = nn::forward_cached(model, tokens, newest, nn::CachedLogits::last);
    ASSERT_EQ(last.shape(), (Shape{2, 1, 30}));
    EXPECT_EQ(as_doubles(last), as_doubles(slice(all, 1, 8, 9)));
    EXPECT_EQ(newest.length(), 9);
    EXPECT_EQ(as_doubles(newest.keys[1]), as_doubles(every.keys[1]));
    const Tensor next = Tensor::from_vector<int32_t>({4, 5}, {2, 1}, Device::cpu);
    EXPECT_EQ(as_doubles(nn::forward_cached(model, next, newest, nn::CachedLogits::last)),
              as_doubles(nn::forward_cached(model, next, every)));
}

// With past 0 the decode op is attention() itself, bitwise (same arithmetic in the same order).
TEST_F(Generation, DecodeAtPastZeroIsAttentionBitwise) {
    const int B = 2, T = 9, C = 12, NH = 3;
    std::normal_distribution<double> normal;
    std::vector<double> values(static_cast<size_t>(B * T * 3 * C));
    for (double& value : values) value = normal(generator);
    const Tensor qkv = Tensor::from_vector<double>(values, {B, T, 3 * C}, Device::cpu);
    const Tensor keys = Tensor::zeros({B, NH, T + 2, C / NH}, DType::f64, Device::cpu);
    const Tensor cached_values = Tensor::zeros({B, NH, T + 2, C / NH}, DType::f64, Device::cpu);
    const NoGradGuard no_grad;
    EXPECT_EQ(attention_decode(qkv, keys, cached_values, 0, NH).to_vector<double>(),
              attention(qkv, NH).to_vector<double>());
}

int argmax(const std::vector<double>& row) {
    return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin()); // first of equal maxima
}

TEST_F(Generation, GreedyEqualsArgmaxOfFullForwards) {
    const nn::GPTConfig config{41, 20, 2, 2, 16, 0.0f};
    const nn::GPT model(config, 13, Device::cpu, DType::f64);
    const std::vector<int32_t> prompt = random_ids(4, 41);
    nn::SamplingOptions greedy;
    greedy.temperature = 0.0;
    const std::vector<int32_t> generated = nn::generate(model, prompt, 16, greedy);

    std::vector<int32_t> expected = prompt;
    const NoGradGuard no_grad;
    while (expected.size() < prompt.size() + 16) {
        const int length = static_cast<int>(expected.size());
        const std::vector<double> logits =
            as_doubles(model.forward(Tensor::from_vector<int32_t>(expected, {1, length}, Device::cpu)));
        expected.push_back(argmax(std::vector<double>(logits.end() - 41, logits.end())));
    }
    EXPECT_EQ(generated, expected);
}

TEST_F(Generation, SeedReproducesAndTopKOneIsGreedy) {
    const nn::GPTConfig config{41, 32, 2, 2, 16, 0.0f};
    const nn::GPT model(config, 17, Device::cpu, DType::f32);
    const std::vector<int32_t> prompt = random_ids(2, 41);
    nn::SamplingOptions sampling;
    sampling.temperature = 1.5;
    sampling.seed = 99;
    const std::vector<int32_t> first = nn::generate(model, prompt, 30, sampling);
    EXPECT_EQ(nn::generate(model, prompt, 30, sampling), first);
    sampling.seed = 100;
    EXPECT_NE(nn::generate(model, prompt, 30, sampling), first); // 30 draws from ~uniform over 41: never equal

    nn::SamplingOptions greedy;
    greedy.temperature = 0.0;
    nn::SamplingOptions top_one = sampling;
    top_one.top_k = 1;
    EXPECT_EQ(nn::generate(model, prompt, 30, top_one), nn::generate(model, prompt, 30, greedy));
}

// sample_token against the distribution it should draw from: exp(l/τ) normalised over the top k.
TEST_F(Generation, SampleTokenFollowsTheTemperedTopK) {
    const std::vector<double> logits{std::log(0.1), std::log(0.4), std::log(0.2), std::log(0.3), std::log(0.05)};
    nn::SamplingOptions options;
    options.temperature = 0.5; // probabilities ∝ p², over the top 3 (ids 1, 3, 2)
    options.top_k = 3;
    const double total = 0.16 + 0.09 + 0.04;
    const std::vector<double> expected{0.0, 0.16 / total, 0.04 / total, 0.09 / total, 0.0};
    std::mt19937_64 draws(7);
    constexpr int count = 40000;
    std::vector<int> seen(5, 0);
    for (int draw = 0; draw < count; ++draw) ++seen[static_cast<size_t>(nn::sample_token(logits, options, draws))];
    for (size_t id = 0; id < 5; ++id) {
        // Five standard deviations of a binomial count: a correct sampler fails this about once in 10^6 runs.
        const double sigma = std::sqrt(count * expected[id] * (1.0 - expected[id]));
        EXPECT_NEAR(seen[id], count * expected[id], 5.0 * sigma + 1e-9) << "token " << id;
    }
    options.temperature = 0.0;
    EXPECT_EQ(nn::sample_token(logits, options, draws), 1);
    EXPECT_EQ(nn::sample_token({2.0, 5.0, 5.0}, options, draws), 1); // ties: the lower id
    // A diverged model's logits are refused by name (NaN would break the candidates' ordering).
    expect_error([&] { nn::sample_token({1.0, std::nan(""), 0.0}, options, draws); }, {"sample_token", "token 1"});
    expect_error([&] { nn::sample_token({INFINITY, 0.0, 1.0}, options, draws); }, {"sample_token", "token 0"});
}

TEST_F(Generation, BadInputsNameTheirCause) {
    const nn::GPTConfig config{20, 8, 1, 2, 8, 0.0f};
    const nn::GPT model(config, 1);
    nn::SamplingOptions options;
    expect_error([&] { nn::generate(model, {1, 2, 3}, 6, options); }, {"max_seq_len", "8"});
    expect_error([&] { nn::generate(model, {}, 2, options); }, {"prompt", "empty"});
    expect_error([&] { nn::generate(model, {1, 20}, 2, options); }, {"prompt token 20", "vocabulary"});
    options.temperature = -0.5;
    expect_error([&] { nn::generate(model, {1}, 2, options); }, {"temperature", "-0.5"});
    options.temperature = 1.0;
    options.top_k = 21;
    expect_error([&] { nn::generate(model, {1}, 2, options); }, {"top_k", "21", "vocabulary 20"});

    nn::KVCache cache(model, 1);
    nn::forward_cached(model, Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {1, 6}, Device::cpu), cache);
    const Tensor three = Tensor::from_vector<int32_t>({1, 2, 3}, {1, 3}, Device::cpu);
    expect_error([&] { nn::forward_cached(model, three, cache); },
                 {"positions [6,9)", "max_seq_len is 8"});
    EXPECT_EQ(cache.length(), 6); // unchanged by the refused call
    expect_error([&] { nn::KVCache too_long(model, 1, 9); }, {"capacity 9", "max_seq_len 8"});

    // The op has no backward: grad mode with an input that requires grad is refused before any write.
    Tensor qkv = Tensor::zeros({1, 2, 24}, DType::f32, Device::cpu);
    qkv.set_requires_grad(true);
    const Tensor keys = Tensor::zeros({1, 2, 8, 4}, DType::f32, Device::cpu);
    expect_error([&] { attention_decode(qkv, keys, keys.clone(), 0, 2); }, {"attention_decode", "inference only"});
    expect_error([&] { attention_decode(qkv.detach(), keys, keys.clone(), 7, 2); },
                 {"attention_decode", "positions [7,9)", "8 positions"});
    expect_error([&] { attention_decode(qkv.detach(), keys, keys.clone(), 0, 3); }, {"attention_decode", "3 heads"});
    // A position near INT_MAX must not wrap past the bounds check.
    expect_error([&] { attention_decode(qkv.detach(), keys, keys.clone(), 2147483647, 2); },
                 {"attention_decode", "positions [2147483647,2147483649)"});
    const Tensor tokens = Tensor::zeros({1, 2}, DType::i32, Device::cpu);
    const Tensor table = Tensor::zeros({5, 4}, DType::f32, Device::cpu);
    expect_error([&] { embedding_at(tokens, table, table, 2147483647); },
                 {"embedding_at", "positions [2147483647,2147483649)"});
}

} // namespace
} // namespace engine::testing
