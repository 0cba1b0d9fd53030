// The bf16 layer kernels (embedding, layernorm, gelu, residual, dropout, first_columns, sum, bias) against
// their f32 twins on the same bf16-representable inputs, and the bf16 ops' gradient dtypes.
//
// The tolerance derivation shared by every test below. bf16 keeps 8 significant bits, so one round-to-
// nearest-even store of a value v errs by at most half a bf16 ulp: |rnd(v) - v| <= 0.5 ulp_bf16(v) <= u|v|,
// u = 2^-8. A bf16 kernel widens its (exactly representable) inputs to float and runs the f32 kernel's
// arithmetic in the f32 kernel's order (reductions in float or double in both), so before its one store its
// value IS the f32 kernel's, bit for bit. Hence, elementwise:
//   - an activation (or activation gradient) stored in bf16: |bf16 - f32| <= 0.5 ulp_bf16(f32), whatever the
//     op's length, because no intermediate is rounded to bf16;
//   - a statistic or parameter gradient kept in f32 (layernorm mean/rstd, dweight, dbias, embedding tables):
//     equal to the f32 kernel's (bound 0).
// Where the op's length does enter is the rounding of an INPUT: tests marked "rounded dout" feed the f32 kernel
// the unrounded f32 upstream gradient g and the bf16 kernel rnd(g), the precision a bf16 activation gradient
// really has. A parameter gradient sum_n a_n g_n then moves by at most sum_n |a_n| |g_n - rnd(g_n)| <=
// u sum_n |a_n g_n| (first order; a_n is exact in both), plus the two f32 accumulations' own error, each
// <= gamma_N sum_n |a_n g_n| with gamma_N ~ N 2^-24, so the bound is (u + 2 N 2^-24 (1 + u)) sum_n |a_n g_n|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "base/bfloat16.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"

namespace engine {
namespace {

namespace cpu = kernels::cpu;

constexpr double unit_roundoff = 1.0 / 256.0;       // u = 2^-8, bf16
constexpr double float_epsilon = 1.0 / 16777216.0;  // 2^-24, f32's unit roundoff

std::vector<bfloat16> to_bf16(const std::vector<float>& values) {
    std::vector<bfloat16> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = to_bfloat16(values[i]);
    return out;
}
std::vector<float> to_f32(const std::vector<bfloat16>& values) {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = to_float(values[i]);
    return out;
}

// Values in [low, high] rounded to bf16: `exact` (f32) and `bits` (bf16) hold the same numbers.
struct Bf16Values {
    std::vector<float> exact;
    std::vector<bfloat16> bits;
};

class Bf16LayerOps : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }

    std::vector<float> random_floats(size_t count, float low = -1.0f, float high = 1.0f) {
        std::uniform_real_distribution<float> distribution(low, high);
        std::vector<float> values(count);
        for (float& value : values) value = distribution(generator);
        return values;
    }
    Bf16Values random_bf16(size_t count, float low = -1.0f, float high = 1.0f) {
        Bf16Values values;
        values.bits = to_bf16(random_floats(count, low, high));
        values.exact = to_f32(values.bits);
        return values;
    }

    std::mt19937 generator{20261201};
};

// |actual - expected| <= ulps * ulp_bf16(expected) on every element; reports the largest error in bf16 ulps.
::testing::AssertionResult within_bf16_ulps(const std::vector<bfloat16>& actual, const std::vector<float>& expected,
                                            double ulps, const std::string& what) {
    if (actual.size() != expected.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
    double worst = 0.0;
    size_t failures = 0;
    std::ostringstream first;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(double(to_float(actual[i])) - double(expected[i]));
        const double in_ulps = error / bfloat16_ulp(expected[i]);
        worst = std::max(worst, in_ulps);
        if (!(in_ulps <= ulps)) {
            if (failures++ < 5) first << "\n  [" << i << "] bf16 " << to_float(actual[i]) << " f32 " << expected[i];
        }
    }
    const std::string summary = what + ": max error " + std::to_string(worst) + " bf16 ulp (bound " +
                                std::to_string(ulps) + ")";
    std::cout << "[ measured ] " << summary << "\n";
    if (failures == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << summary << ", " << failures << " failures:" << first.str();
}

// |actual - expected| <= bound[i] on every element (a per-element bound derived by the caller).
::testing::AssertionResult within_bounds(const std::vector<float>& actual, const std::vector<float>& expected,
                                         const std::vector<double>& bound, const std::string& what) {
    double worst_ratio = 0.0;
    size_t failures = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(double(actual[i]) - double(expected[i]));
        worst_ratio = std::max(worst_ratio, bound[i] > 0 ? error / bound[i] : (error > 0 ? INFINITY : 0.0));
        failures += !(error <= bound[i]);
    }
    std::cout << "[ measured ] " << what << ": max error / bound " << worst_ratio << "\n";
    if (failures == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << failures << " elements over the bound (worst ratio "
                                         << worst_ratio << ")";
}

// ---- elementwise: one rounding of the f32 kernel's value, 0.5 ulp ----

TEST_F(Bf16LayerOps, ResidualMatchesF32WithinHalfUlp) {
    const int64_t N = 1001;
    const auto a = random_bf16(N), b = random_bf16(N), dout = random_bf16(N), start = random_bf16(N);
    std::vector<float> out32(N), da32 = start.exact, db32 = start.exact;
    std::vector<bfloat16> out16(N), da16 = start.bits, db16 = start.bits;
    cpu::residual_forward(out32.data(), a.exact.data(), b.exact.data(), N);
    cpu::residual_forward(out16.data(), a.bits.data(), b.bits.data(), N);
    cpu::residual_backward(da32.data(), db32.data(), dout.exact.data(), N);
    cpu::residual_backward(da16.data(), db16.data(), dout.bits.data(), N);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "residual out"));
    EXPECT_TRUE(within_bf16_ulps(da16, da32, 0.5, "residual da"));
    EXPECT_TRUE(within_bf16_ulps(db16, db32, 0.5, "residual db"));
}

TEST_F(Bf16LayerOps, GeluMatchesF32WithinHalfUlp) {
    const int64_t N = 1001;
    const auto x = random_bf16(N, -5.0f, 5.0f), dout = random_bf16(N), start = random_bf16(N);
    std::vector<float> out32(N), dinp32 = start.exact;
    std::vector<bfloat16> out16(N), dinp16 = start.bits;
    cpu::gelu_forward(out32.data(), x.exact.data(), N);
    cpu::gelu_forward(out16.data(), x.bits.data(), N);
    cpu::gelu_backward(dinp32.data(), dout.exact.data(), x.exact.data(), N, true);
    cpu::gelu_backward(dinp16.data(), dout.bits.data(), x.bits.data(), N, true);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "gelu out"));
    EXPECT_TRUE(within_bf16_ulps(dinp16, dinp32, 0.5, "gelu dinp"));
}

TEST_F(Bf16LayerOps, DropoutKeepsTheSameMaskAndMatchesF32WithinHalfUlp) {
    const int64_t N = 1001;
    const float p = 0.25f;
    const auto x = random_bf16(N, 0.5f, 1.5f), dout = random_bf16(N, 0.5f, 1.5f), start = random_bf16(N);
    std::vector<float> out32(N), dinp32 = start.exact;
    std::vector<bfloat16> out16(N), dinp16 = start.bits;
    cpu::dropout_forward(out32.data(), x.exact.data(), p, 7, 1234, N);
    cpu::dropout_forward(out16.data(), x.bits.data(), p, 7, 1234, N);
    cpu::dropout_backward(dinp32.data(), dout.exact.data(), p, 7, 1234, N);
    cpu::dropout_backward(dinp16.data(), dout.bits.data(), p, 7, 1234, N);
    int dropped = 0;
    for (int64_t i = 0; i < N; ++i) { // inputs are nonzero, so zero marks a dropped element in both
        ASSERT_EQ(out32[i] == 0.0f, to_float(out16[i]) == 0.0f) << "mask differs at " << i;
        dropped += out32[i] == 0.0f;
    }
    EXPECT_GT(dropped, N / 8);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "dropout out"));
    EXPECT_TRUE(within_bf16_ulps(dinp16, dinp32, 0.5, "dropout dinp"));
}

TEST_F(Bf16LayerOps, FirstColumnsCopiesExactlyAndAddsWithinHalfUlp) {
    const int64_t rows = 13;
    const int columns = 11, count = 7;
    const auto x = random_bf16(size_t(rows) * columns), dout = random_bf16(size_t(rows) * count);
    const auto start = random_bf16(size_t(rows) * columns);
    std::vector<float> out32(size_t(rows) * count), dinp32 = start.exact;
    std::vector<bfloat16> out16(out32.size()), dinp16 = start.bits;
    cpu::first_columns_forward(out32.data(), x.exact.data(), rows, columns, count);
    cpu::first_columns_forward(out16.data(), x.bits.data(), rows, columns, count);
    cpu::first_columns_backward(dinp32.data(), dout.exact.data(), rows, columns, count);
    cpu::first_columns_backward(dinp16.data(), dout.bits.data(), rows, columns, count);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.0, "first_columns out (a copy)"));
    EXPECT_TRUE(within_bf16_ulps(dinp16, dinp32, 0.5, "first_columns dinp"));
}

// sum: double accumulation of the same values and an f32 result, so forward equals the f32 kernel's exactly;
// the bf16 input gradient rounds once.
TEST_F(Bf16LayerOps, SumIsF32AndExactAndItsGradientRoundsOnce) {
    const int64_t N = 777;
    const auto x = random_bf16(N), start = random_bf16(N);
    float sum32 = 0.0f, sum16 = 0.0f;
    cpu::sum_forward(&sum32, x.exact.data(), N, 0.5f);
    cpu::sum_forward(&sum16, x.bits.data(), N, 0.5f);
    EXPECT_EQ(sum16, sum32);
    const float dout = 0.3f;
    std::vector<float> dinp32 = start.exact;
    std::vector<bfloat16> dinp16 = start.bits;
    cpu::sum_backward(dinp32.data(), &dout, N, 0.5f);
    cpu::sum_backward(dinp16.data(), &dout, N, 0.5f);
    EXPECT_TRUE(within_bf16_ulps(dinp16, dinp32, 0.5, "sum dinp"));
}

// bias: the forward rounds once; dbias sums bf16 dout in double into f32: equal to the f32 kernel on the same
// values, and within the rounded-dout bound (a_n = 1) of the f32 kernel on unrounded dout.
TEST_F(Bf16LayerOps, BiasForwardRoundsOnceAndDbiasIsF32) {
    const int N = 37, OC = 19;
    const auto out_start = random_bf16(size_t(N) * OC), bias = random_bf16(OC);
    std::vector<float> out32 = out_start.exact;
    std::vector<bfloat16> out16 = out_start.bits;
    cpu::bias_add_forward(out32.data(), bias.exact.data(), N, OC);
    cpu::bias_add_forward(out16.data(), bias.bits.data(), N, OC);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "bias out"));

    const auto dout_unrounded = random_floats(size_t(N) * OC);
    const auto dout = to_bf16(dout_unrounded);
    const auto dbias_start = random_floats(OC);
    std::vector<float> same32 = dbias_start, rounded32 = dbias_start, dbias16 = dbias_start;
    cpu::bias_backward(same32.data(), to_f32(dout).data(), N, OC);
    cpu::bias_backward(rounded32.data(), dout_unrounded.data(), N, OC);
    cpu::bias_backward(dbias16.data(), dout.data(), N, OC);
    EXPECT_EQ(dbias16, same32);
    std::vector<double> bound(OC, 0.0);
    for (int o = 0; o < OC; ++o) {
        double magnitude = 0.0;
        for (int n = 0; n < N; ++n) magnitude += std::fabs(dout_unrounded[size_t(n) * OC + o]);
        bound[o] = (unit_roundoff + 2.0 * N * float_epsilon) * magnitude + float_epsilon * std::fabs(rounded32[o]);
    }
    EXPECT_TRUE(within_bounds(dbias16, rounded32, bound, "dbias vs f32 on unrounded dout"));
}

// embedding: out rounds once; the f32 table gradients add the same (or rounded) dout values in the same order.
TEST_F(Bf16LayerOps, EmbeddingMatchesF32) {
    const int B = 3, T = 5, C = 8, V = 7, max_T = 6;
    std::uniform_int_distribution<int32_t> token(0, V - 1);
    std::vector<int32_t> tokens(B * T);
    for (int32_t& id : tokens) id = token(generator);
    tokens[1] = tokens[4] = tokens[9]; // repeated tokens accumulate several rows
    const auto token_table = random_bf16(size_t(V) * C), position_table = random_bf16(size_t(max_T) * C);
    std::vector<float> out32(size_t(B) * T * C);
    std::vector<bfloat16> out16(out32.size());
    cpu::embedding_forward(out32.data(), tokens.data(), token_table.exact.data(), position_table.exact.data(), nullptr,
                           B, T, C);
    cpu::embedding_forward(out16.data(), tokens.data(), token_table.bits.data(), position_table.bits.data(), nullptr, B,
                           T, C);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "embedding out"));

    const auto dout_unrounded = random_floats(out32.size());
    const auto dout = to_bf16(dout_unrounded);
    std::vector<float> dtoken32(size_t(V) * C), dposition32(size_t(max_T) * C), dtoken16 = dtoken32,
                                                dposition16 = dposition32, dtoken_rounded = dtoken32,
                                                dposition_rounded = dposition32;
    cpu::embedding_backward(dtoken32.data(), dposition32.data(), to_f32(dout).data(), tokens.data(), nullptr, B, T, C);
    cpu::embedding_backward(dtoken_rounded.data(), dposition_rounded.data(), dout_unrounded.data(), tokens.data(),
                            nullptr, B, T, C);
    cpu::embedding_backward(dtoken16.data(), dposition16.data(), dout.data(), tokens.data(), nullptr, B, T, C);
    EXPECT_EQ(dtoken16, dtoken32);
    EXPECT_EQ(dposition16, dposition32);
    // Rounded dout (a_n = 1): a token row sums at most B*T rows, a position row B.
    std::vector<double> token_bound(dtoken16.size(), 0.0), position_bound(dposition16.size(), 0.0);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c) {
                const double magnitude = std::fabs(dout_unrounded[(size_t(b) * T + t) * C + c]);
                token_bound[size_t(tokens[b * T + t]) * C + c] += (unit_roundoff + 2.0 * B * T * float_epsilon) * magnitude;
                position_bound[size_t(t) * C + c] += (unit_roundoff + 2.0 * B * float_epsilon) * magnitude;
            }
    EXPECT_TRUE(within_bounds(dtoken16, dtoken_rounded, token_bound, "dtoken_table vs f32 on unrounded dout"));
    EXPECT_TRUE(within_bounds(dposition16, dposition_rounded, position_bound, "dposition_table vs f32 on unrounded dout"));
}

// layernorm: statistics in double from the same values, so mean/rstd and the pre-rounding outputs are the f32
// kernel's; dweight/dbias are f32 sums of the same products.
TEST_F(Bf16LayerOps, LayernormMatchesF32) {
    const int N = 29, C = 40;
    const auto x = random_bf16(size_t(N) * C, -2.0f, 3.0f), weight = random_bf16(C, 0.5f, 1.5f);
    const auto bias = random_bf16(C);
    std::vector<float> out32(size_t(N) * C), mean32(N), rstd32(N), mean16(N), rstd16(N);
    std::vector<bfloat16> out16(out32.size());
    cpu::layernorm_forward(out32.data(), mean32.data(), rstd32.data(), x.exact.data(), weight.exact.data(),
                           bias.exact.data(), N, C);
    cpu::layernorm_forward(out16.data(), mean16.data(), rstd16.data(), x.bits.data(), weight.bits.data(),
                           bias.bits.data(), N, C);
    EXPECT_TRUE(within_bf16_ulps(out16, out32, 0.5, "layernorm out"));
    EXPECT_EQ(mean16, mean32);
    EXPECT_EQ(rstd16, rstd32);

    const auto dout_unrounded = random_floats(out32.size());
    const auto dout = to_bf16(dout_unrounded);
    const auto dinp_start = random_bf16(out32.size());
    std::vector<float> dinp32 = dinp_start.exact, dweight32(C), dbias32(C), dweight16(C), dbias16(C);
    std::vector<float> dinp_rounded = dinp_start.exact, dweight_rounded(C), dbias_rounded(C);
    std::vector<bfloat16> dinp16 = dinp_start.bits;
    cpu::layernorm_backward(dinp32.data(), dweight32.data(), dbias32.data(), to_f32(dout).data(), x.exact.data(),
                            weight.exact.data(), mean32.data(), rstd32.data(), N, C);
    cpu::layernorm_backward(dinp16.data(), dweight16.data(), dbias16.data(), dout.data(), x.bits.data(),
                            weight.bits.data(), mean16.data(), rstd16.data(), N, C);
    cpu::layernorm_backward(dinp_rounded.data(), dweight_rounded.data(), dbias_rounded.data(), dout_unrounded.data(),
                            x.exact.data(), weight.exact.data(), mean32.data(), rstd32.data(), N, C);
    EXPECT_TRUE(within_bf16_ulps(dinp16, dinp32, 0.5, "layernorm dinp"));
    EXPECT_EQ(dweight16, dweight32);
    EXPECT_EQ(dbias16, dbias32);
    // Rounded dout: dweight_c = sum_n norm_nc g_nc (a_n = norm, computed alike), dbias_c = sum_n g_nc (a_n = 1).
    std::vector<double> weight_bound(C, 0.0), bias_bound(C, 0.0);
    const double per_term = unit_roundoff + 2.0 * N * float_epsilon * (1.0 + unit_roundoff);
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            const double g = std::fabs(dout_unrounded[size_t(n) * C + c]);
            const double norm = std::fabs((double(x.exact[size_t(n) * C + c]) - mean32[n]) * rstd32[n]);
            weight_bound[c] += per_term * norm * g;
            bias_bound[c] += per_term * g;
        }
    EXPECT_TRUE(within_bounds(dweight16, dweight_rounded, weight_bound, "dweight vs f32 on unrounded dout"));
    EXPECT_TRUE(within_bounds(dbias16, dbias_rounded, bias_bound, "dbias vs f32 on unrounded dout"));
}

// ---- the ops: bf16 activations and activation gradients, f32 statistics and parameter gradients ----

Tensor bf16_leaf(const Bf16Values& values, const Shape& shape) {
    Tensor leaf = Tensor::from_vector<bfloat16>(values.bits, shape, Device::cpu);
    leaf.set_requires_grad(true);
    return leaf;
}
Tensor f32_leaf(const Bf16Values& values, const Shape& shape) {
    Tensor leaf = Tensor::from_vector<float>(values.exact, shape, Device::cpu);
    leaf.set_requires_grad(true);
    return leaf;
}

// A bf16 leaf's gradient buffer is f32 holding the once-rounded bf16 gradient (its backward's bf16 workspace,
// added exactly), or, for parameter gradients, the f32 sum itself.
TEST_F(Bf16LayerOps, LayernormOpDtypesAndGradients) {
    const int rows = 6, C = 16;
    const auto x = random_bf16(size_t(rows) * C, -2.0f, 2.0f), w = random_bf16(C, 0.5f, 1.5f), b = random_bf16(C);
    Tensor x16 = bf16_leaf(x, {2, 3, C}), w16 = bf16_leaf(w, {C}), b16 = bf16_leaf(b, {C});
    Tensor x32 = f32_leaf(x, {2, 3, C}), w32 = f32_leaf(w, {C}), b32 = f32_leaf(b, {C});
    Tensor out16 = layernorm(x16, w16, b16);
    EXPECT_EQ(out16.dtype(), DType::bf16);
    Tensor loss16 = sum(gelu(out16)); // gelu gives layernorm a non-uniform dout
    EXPECT_EQ(loss16.dtype(), DType::f32);
    backward(loss16);
    Tensor loss32 = sum(gelu(layernorm(x32, w32, b32)));
    backward(loss32);
    for (const Tensor* leaf : {&x16, &w16, &b16}) EXPECT_EQ(leaf->grad().dtype(), DType::f32);
    // The loss: f32 sums of the same values, but gelu's bf16 outputs are each rounded once: |error| <=
    // sum_i 0.5 ulp_bf16(gelu_i) <= u sum_i |gelu_i|.
    double magnitude = 0.0;
    {
        NoGradGuard no_grad;
        for (float value : gelu(layernorm(x32, w32, b32)).to_vector<float>()) magnitude += std::fabs(value);
    }
    EXPECT_LE(std::fabs(loss16.item() - loss32.item()), unit_roundoff * magnitude + 1e-6);
    std::cout << "[ measured ] layernorm+gelu+sum loss: |bf16 - f32| " << std::fabs(loss16.item() - loss32.item())
              << " (bound " << unit_roundoff * magnitude << ")\n";
    // Parameter gradients through gelu: layernorm's dout is g = rnd(gelu'(y16)) with y16 = rnd(y), y the f32
    // layernorm output, against gelu'(y). |gelu''| <= sqrt(2/pi) < 0.8 and |gelu'| < 1.13, so (first order)
    // |dg| <= 0.8 |y16 - y| + 0.5 ulp(g) <= u (0.8 |y| + 1.13). dbias_c = sum_n g_nc moves by <= u sum_n
    // (0.8|y_nc| + 1.13), dweight_c = sum_n norm_nc g_nc by <= u sum_n |norm_nc| (0.8|y_nc| + 1.13), with
    // norm = (y - b)/w; 1e-6 covers the f32 sums (6 terms of size ~1).
    std::vector<float> y;
    {
        NoGradGuard no_grad;
        y = layernorm(x32, w32, b32).to_vector<float>();
    }
    const auto gw16 = w16.grad().to_vector<float>(), gw32 = w32.grad().to_vector<float>();
    const auto gb16 = b16.grad().to_vector<float>(), gb32 = b32.grad().to_vector<float>();
    std::vector<double> weight_bound(C, 1e-6), bias_bound(C, 1e-6);
    for (int n = 0; n < rows; ++n)
        for (int c = 0; c < C; ++c) {
            const double y_nc = y[size_t(n) * C + c], change = unit_roundoff * (0.8 * std::fabs(y_nc) + 1.13);
            bias_bound[c] += change;
            weight_bound[c] += change * std::fabs((y_nc - b.exact[c]) / w.exact[c]);
        }
    EXPECT_TRUE(within_bounds(gb16, gb32, bias_bound, "layernorm op dbias (through gelu)"));
    EXPECT_TRUE(within_bounds(gw16, gw32, weight_bound, "layernorm op dweight (through gelu)"));
    // dinput: f32 grad buffer of the bf16 leaf, holding bf16-rounded values.
    for (float value : x16.grad().to_vector<float>()) EXPECT_EQ(to_float(to_bfloat16(value)), value);
}

TEST_F(Bf16LayerOps, OpsKeepBf16ActivationsAndF32ParameterGradients) {
    const int B = 2, T = 3, C = 8, V = 5;
    const auto tok = random_bf16(size_t(V) * C), pos = random_bf16(size_t(T) * C);
    Tensor token_table = bf16_leaf(tok, {V, C}), position_table = bf16_leaf(pos, {T, C});
    Tensor tokens = Tensor::from_vector<int32_t>({0, 1, 1, 4, 2, 0}, {B, T}, Device::cpu);
    Tensor h = embedding(tokens, token_table, position_table);
    EXPECT_EQ(h.dtype(), DType::bf16);
    Tensor residual = add(h, dropout(gelu(h), 0.1f, true));
    EXPECT_EQ(residual.dtype(), DType::bf16);
    Tensor columns = first_columns(residual, 5);
    EXPECT_EQ(columns.dtype(), DType::bf16);
    Tensor scaled = multiply(columns, 0.5);
    EXPECT_EQ(scaled.dtype(), DType::bf16);
    Tensor loss = sum(scaled);
    EXPECT_EQ(loss.dtype(), DType::f32);
    backward(loss);
    EXPECT_EQ(token_table.grad().dtype(), DType::f32);
    EXPECT_EQ(position_table.grad().dtype(), DType::f32);
    // Token 3 is unused: its row gets no gradient.
    const auto dtoken = token_table.grad().to_vector<float>();
    for (int c = 0; c < C; ++c) EXPECT_EQ(dtoken[size_t(3) * C + c], 0.0f);

    // Mixing dtypes in one op is refused with the op and the tensors named.
    const auto f = random_bf16(size_t(T) * C);
    Tensor f32 = Tensor::from_vector<float>(f.exact, {T, C}, Device::cpu);
    Tensor b16 = Tensor::from_vector<bfloat16>(f.bits, {T, C}, Device::cpu);
    EXPECT_THROW(add(f32, b16), EngineError);
}

} // namespace
} // namespace engine
