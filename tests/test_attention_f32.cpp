// The float32 CPU attention kernels (sgemm per block, float arithmetic) against the float64 instantiation, the
// specification, on the same inputs: forward out and logsumexp, backward dqkv added onto non-zero contents, with a
// tolerance derived from float32 rounding. Shapes cover one panel, several query panels, products cut into pieces
// along K, M and N (kernels/cpu/attention_panels.h), and grouped-query attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace {

namespace cpu = engine::kernels::cpu;

struct Shape {
    int B, T, C, NH, KVH;
    double amplitude; // qkv uniform in [-amplitude, amplitude]: 4 makes the softmax peaked
    int head_size() const { return C / NH; }
    int64_t row() const { return C + 2 * int64_t(KVH) * head_size(); }
    std::string describe() const {
        return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " NH=" + std::to_string(NH) + " KVH=" + std::to_string(KVH) + " amplitude=" + std::to_string(amplitude);
    }
};

std::vector<float> uniform(size_t count, unsigned seed, double bound) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<double> value(-bound, bound);
    std::vector<float> values(count);
    for (float& element : values) element = static_cast<float>(value(generator));
    return values;
}

double max_abs(const std::vector<double>& values) {
    double m = 0.0;
    for (double v : values) m = std::max(m, std::fabs(v));
    return m;
}

// Largest |scale·q·k| over the causal pairs, in double: how far exp's argument is from 0.
double max_scaled_score(const std::vector<double>& qkv, const Shape& s) {
    const int hs = s.head_size(), group = s.NH / s.KVH;
    const double scale = 1.0 / std::sqrt(double(hs));
    double m = 0.0;
    for (int b = 0; b < s.B; ++b)
        for (int h = 0; h < s.NH; ++h)
            for (int t = 0; t < s.T; ++t)
                for (int t2 = 0; t2 <= t; ++t2) {
                    const double* q = qkv.data() + (int64_t(b) * s.T + t) * s.row() + int64_t(h) * hs;
                    const double* k = qkv.data() + (int64_t(b) * s.T + t2) * s.row() + s.C + int64_t(h / group) * hs;
                    double dot = 0.0;
                    for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
                    m = std::max(m, std::fabs(dot * scale));
                }
    return m;
}

// Largest |f32 - f64| over a tensor.
template <typename F>
double max_error(const std::vector<float>& actual, const std::vector<F>& expected) {
    double m = 0.0;
    for (size_t i = 0; i < actual.size(); ++i) m = std::max(m, std::fabs(double(actual[i]) - double(expected[i])));
    return m;
}

// The bound. Every f32 output is at the end of a chain of at most 4 float sums, each of at most n = G·T + hs terms
// (score: hs products; P·V, dP and D: T and hs; dQ: T keys; dK and dV: the T queries of each of the G heads of a
// group). Rounding errors of a float sum of n terms grow like sqrt(n)·u·(size of the terms), u = 2^-24 (the
// random-walk estimate, Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 2.8; the worst case
// n·u is never approached by these independent roundings), and the largest of ~10^5 elements stays within ~8 times
// that: 4 sums · 8 = 32. A score's error is relative to the products it sums, and exp turns an absolute error of
// its argument into a relative error of P, so the scores' size (1 + max|scaled score|) multiplies the bound; the
// terms' size is the tensor's own largest magnitude (the reference's). So
//   |f32 - f64| <= 32 · u · sqrt(G·T + hs) · (1 + max|score|) · max|reference|.
double bound(const Shape& s, double max_score, double max_reference) {
    const double u = std::ldexp(1.0, -24);
    const double terms = double(s.NH / s.KVH) * s.T + s.head_size();
    return 32.0 * u * std::sqrt(terms) * (1.0 + max_score) * max_reference;
}

void check(const Shape& s) {
    const int64_t tokens = int64_t(s.B) * s.T;
    const std::vector<float> qkv = uniform(size_t(tokens * s.row()), 1, s.amplitude), dout = uniform(size_t(tokens * s.C), 2, 1.0);
    const std::vector<float> dqkv_start = uniform(size_t(tokens * s.row()), 3, 0.01); // dqkv is +=

    std::vector<float> out(size_t(tokens * s.C)), logsumexp(size_t(s.B) * s.NH * s.T), dqkv = dqkv_start;
    cpu::attention_forward<float>(out.data(), logsumexp.data(), qkv.data(), nullptr, s.B, s.T, s.C, s.NH, s.KVH);
    cpu::attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), nullptr, s.B,
                                   s.T, s.C, s.NH, s.KVH);

    // The specification on the same (exactly widened) inputs.
    const std::vector<double> qkv64(qkv.begin(), qkv.end()), dout64(dout.begin(), dout.end());
    std::vector<double> out64(out.size()), logsumexp64(logsumexp.size()), dqkv64(dqkv_start.begin(), dqkv_start.end());
    cpu::attention_forward<double>(out64.data(), logsumexp64.data(), qkv64.data(), nullptr, s.B, s.T, s.C, s.NH, s.KVH);
    cpu::attention_backward<double>(dqkv64.data(), dout64.data(), qkv64.data(), out64.data(), logsumexp64.data(),
                                    nullptr, s.B, s.T, s.C, s.NH, s.KVH);

    const double score = max_scaled_score(qkv64, s);
    const struct {
        const char* name;
        const std::vector<float>& actual;
        const std::vector<double>& expected;
    } tensors[] = {{"out", out, out64}, {"logsumexp", logsumexp, logsumexp64}, {"dqkv", dqkv, dqkv64}};
    for (const auto& tensor : tensors) {
        const double reference = max_abs(tensor.expected), error = max_error(tensor.actual, tensor.expected);
        const double limit = bound(s, score, reference);
        EXPECT_LE(error, limit) << tensor.name << " " << s.describe();
        std::printf("[ measured ] %s %s: max |f32 - f64| %.3g (%.3g of max |value| %.3g), bound %.3g\n", tensor.name,
                    s.describe().c_str(), error, error / reference, reference, limit);
    }
}

// One panel (T <= 32 rows), GQA groups of 2 and 4.
TEST(AttentionF32, MatchesFloat64OnePanel) {
    check({2, 17, 64, 4, 2, 1.0});
    check({1, 32, 128, 4, 1, 1.0});
}

// Several 32-row panels, at GPT-2's head size (64) and at the threads test's (32, T = 64).
TEST(AttentionF32, MatchesFloat64SeveralPanels) {
    check({2, 64, 128, 4, 2, 1.0});
    check({1, 200, 128, 2, 2, 1.0});
}

// T = 300: 64-row panels, P·V and dS·K cut along K (slices of 128 keys), S along N, dV and dK along M.
TEST(AttentionF32, MatchesFloat64ProductsInPieces) { check({1, 300, 32, 2, 1, 1.0}); }

// A peaked softmax (scores up to ~30): the bound grows with the scores, as the error of exp's argument does.
TEST(AttentionF32, MatchesFloat64PeakedSoftmax) { check({1, 96, 128, 2, 1, 4.0}); }

} // namespace
