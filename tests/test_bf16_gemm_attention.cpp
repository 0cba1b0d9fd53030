// bf16 GEMM, attention and cross-entropy on the CPU: each bf16 kernel against its f32 twin on the SAME bf16-rounded
// inputs, within bounds derived from bf16's unit roundoff u = 2^-8 and the op's length (derivations next to each
// test); then the ops' dtypes (bf16 activations and activation gradients, f32 parameter gradients, f32 loss).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/autograd.h"
#include "base/bfloat16.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tests/attention_bf16_bounds.h"

namespace engine {
namespace {

namespace cpu = kernels::cpu;
using test::AttentionShape;
const double u = std::ldexp(1.0, -8); // bf16 unit roundoff: |round(x) - x| <= u·|x| (8-bit significand)

struct Inputs {
    std::vector<bfloat16> bf16;
    std::vector<float> f32; // the same values, widened (exact)
};
Inputs random_inputs(std::mt19937& generator, size_t count, float range = 1.0f) {
    std::uniform_real_distribution<float> distribution(-range, range);
    Inputs inputs;
    for (size_t i = 0; i < count; ++i) {
        inputs.bf16.push_back(to_bfloat16(distribution(generator)));
        inputs.f32.push_back(to_float(inputs.bf16.back()));
    }
    return inputs;
}

// GEMM, bf16 c: both kernels run the same f32 sgemm on the same (exactly widened) operands, so the only
// difference is the bf16 kernel's one rounding on store, at most half an ulp of the f32 result, and
// rounding to nearest even makes it exactly to_bfloat16(f32 result): a bound of 0.5 ulp with no fp32 slack.
// With beta = 1 the old bf16 c enters the f32 sum before that one rounding (c = round(ab + c)), not after.
// f32 c (parameter gradients): bitwise the f32 GEMM's.
TEST(Bf16Gemm, MatchesF32GemmRoundedOnceOnStore) {
    std::mt19937 generator(11);
    const int m = 7, n = 13, k = 37;
    for (const bool transpose_a : {false, true}) {
        for (const bool transpose_b : {false, true}) {
            for (const float beta : {0.0f, 1.0f}) {
                const Inputs a = random_inputs(generator, size_t(m) * k), b = random_inputs(generator, size_t(k) * n);
                const Inputs c0 = random_inputs(generator, size_t(m) * n);
                std::vector<float> reference = c0.f32;
                cpu::gemm(reference.data(), a.f32.data(), b.f32.data(), m, n, k, transpose_a, transpose_b, 0.5f, beta);
                std::vector<bfloat16> c = c0.bf16;
                cpu::gemm(c.data(), a.bf16.data(), b.bf16.data(), m, n, k, transpose_a, transpose_b, 0.5f, beta);
                std::vector<float> wide = c0.f32;
                cpu::gemm(wide.data(), a.bf16.data(), b.bf16.data(), m, n, k, transpose_a, transpose_b, 0.5f, beta);
                for (size_t i = 0; i < c.size(); ++i) {
                    const std::string where = "element " + std::to_string(i) + " ta=" + std::to_string(transpose_a) +
                                              " tb=" + std::to_string(transpose_b) + " beta=" + std::to_string(beta);
                    EXPECT_LE(std::fabs(to_float(c[i]) - reference[i]), 0.5 * bfloat16_ulp(reference[i])) << where;
                    EXPECT_EQ(c[i].bits, to_bfloat16(reference[i]).bits) << where;
                    EXPECT_EQ(wide[i], reference[i]) << where;
                }
            }
        }
    }
}

// gemm_bias in bf16: the f32 product plus the bias, rounded once (cuBLASLt's epilogue), so within 0.5 ulp of
// the f32 gemm + bias_add_forward; rounding twice (gemm, then the bias) could be off by a whole ulp.
TEST(Bf16Gemm, BiasEpilogueRoundsOnce) {
    std::mt19937 generator(12);
    const int m = 5, n = 9, k = 21;
    const Inputs a = random_inputs(generator, size_t(m) * k), b = random_inputs(generator, size_t(k) * n);
    const Inputs bias = random_inputs(generator, size_t(n));
    std::vector<float> reference(size_t(m) * n);
    cpu::gemm_bias(reference.data(), a.f32.data(), b.f32.data(), bias.f32.data(), m, n, k, false, false);
    std::vector<bfloat16> c(size_t(m) * n);
    cpu::gemm_bias(c.data(), a.bf16.data(), b.bf16.data(), bias.bf16.data(), m, n, k, false, false);
    for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].bits, to_bfloat16(reference[i]).bits) << "element " << i;
}

// T = 80 > attention_bf16_key_tile, so the online softmax rescales across key tiles; then grouped-query shapes
// (NH=4, KVH=2 and NH=6, KVH=1), whose dK/dV sum several query heads in f32 before their one rounding.
constexpr AttentionShape attention_shapes[] = {{2, 80, 32, 2}, {2, 80, 64, 4, 2}, {1, 70, 96, 6, 1}};

// Forward, bf16 against the f32 kernel (double inside) on the same qkv. Per output o_id = sum_j p_ij v_jd:
// - P rounded to bf16: each p̃_j = p_j(1 + d_j), |d_j| <= u, so |Δo_id| <= u · sum_j p_ij |v_jd| (the running-max
//   rescaling multiplies p̃ by exact-ish f32 factors and does not change the relative bound);
// - the output rounded once: 0.5 ulp(o_id);
// - f32 arithmetic (scores over hs terms, the exponentials, T-term sums): relative (hs + T + 8)·2^-24 of the same
//   sum_j p_ij |v_jd|, a slack far below u.
// logsumexp stays f32 from f32 sums of the UNROUNDED probabilities: (hs + T + 8)·2^-24·(1 + |lse|).
TEST(Bf16Attention, ForwardWithinTheRoundingOfP) {
    for (const AttentionShape& attention_shape : attention_shapes) {
        std::mt19937 generator(21);
        const int B = attention_shape.B, T = attention_shape.T, C = attention_shape.C, NH = attention_shape.NH;
        const int KVH = attention_shape.kv_heads(), hs = C / NH;
        const Inputs qkv = random_inputs(generator, size_t(B) * T * attention_shape.qkv_width(), 2.0f);
        std::vector<float> out_reference(size_t(B) * T * C), lse_reference(size_t(B) * NH * T);
        cpu::attention_forward(out_reference.data(), lse_reference.data(), qkv.f32.data(), nullptr, B, T, C, NH, KVH);
        std::vector<bfloat16> out(size_t(B) * T * C);
        std::vector<float> lse(size_t(B) * NH * T);
        cpu::attention_forward(out.data(), lse.data(), qkv.bf16.data(), nullptr, B, T, C, NH, KVH);
        const std::vector<double> weighted = test::attention_bounds(qkv.f32, {}, {}, {}, attention_shape).forward;
        const double f32_slack = (hs + T + 8) * std::ldexp(1.0, -24);
        double worst = 0.0; // the largest error as a fraction of its bound, printed for the record
        for (int b = 0; b < B; ++b) {
            for (int h = 0; h < NH; ++h) {
                for (int i = 0; i < T; ++i) {
                    for (int d = 0; d < hs; ++d) {
                        const size_t index = (size_t(b) * T + i) * C + h * hs + d;
                        const double half_ulp = 0.5 * std::max(bfloat16_ulp(out_reference[index]), bfloat16_ulp(to_float(out[index])));
                        const double bound = (u + f32_slack) * weighted[index] + half_ulp;
                        const double error = std::fabs(double(to_float(out[index])) - out_reference[index]);
                        EXPECT_LE(error, bound) << "out b=" << b << " h=" << h << " t=" << i << " d=" << d;
                        worst = std::max(worst, error / bound);
                    }
                    const size_t row = (size_t(b) * NH + h) * T + i;
                    EXPECT_LE(std::fabs(lse[row] - lse_reference[row]), f32_slack * (1.0 + std::fabs(lse_reference[row])));
                }
            }
        }
        std::cout << "[ measured ] forward NH=" << NH << " KVH=" << KVH << ": largest error / bound = " << worst << "\n";
    }
}

// Backward, bf16 against the f32 kernel (double inside) on the same qkv, dout, out and logsumexp (the bf16
// forward's, widened). dV_j = sum_i p_ij dout_i, dK_j = sum_i dS_ij q_i, dQ_i = sum_j dS_ij k_j with
// dS_ij = scale·p_ij (dP_ij - D_i). The bf16 kernel rounds p and dS before the products (relative u each) and
// each sum once on store, so per element:
//   |ΔdV_jd| <= u·sum_i p_ij |dout_id|,  |ΔdK_jd| <= u·sum_i |dS_ij||q_id|,  |ΔdQ_id| <= u·sum_j |dS_ij||k_jd|,
// plus 0.5 ulp of the result and the f32 slack: dP and D are f32 sums of hs terms, whose absolute error
// (hs + 4)·2^-24·(sum|dout||v| + sum|dout||out|) passes into dS times scale·p, added here as a relative
// (hs + T + 8)·2^-24 of the same weighted sums, plus an absolute 2^-20 for the cancellation in dP - D.
TEST(Bf16Attention, BackwardWithinTheRoundingOfPAndDs) {
    for (const AttentionShape& attention_shape : attention_shapes) {
        std::mt19937 generator(22);
        const int B = attention_shape.B, T = attention_shape.T, C = attention_shape.C, NH = attention_shape.NH;
        const int KVH = attention_shape.kv_heads(), hs = C / NH;
        const Inputs qkv = random_inputs(generator, size_t(B) * T * attention_shape.qkv_width(), 2.0f);
        const Inputs dout = random_inputs(generator, size_t(B) * T * C);
        std::vector<bfloat16> out(size_t(B) * T * C);
        std::vector<float> lse(size_t(B) * NH * T), out_wide(out.size());
        cpu::attention_forward(out.data(), lse.data(), qkv.bf16.data(), nullptr, B, T, C, NH, KVH);
        for (size_t i = 0; i < out.size(); ++i) out_wide[i] = to_float(out[i]);
        std::vector<float> dqkv_reference(qkv.f32.size(), 0.0f);
        cpu::attention_backward(dqkv_reference.data(), dout.f32.data(), qkv.f32.data(), out_wide.data(), lse.data(),
                                nullptr, B, T, C, NH, KVH);
        std::vector<bfloat16> dqkv(qkv.bf16.size(), bfloat16{0});
        cpu::attention_backward(dqkv.data(), dout.bf16.data(), qkv.bf16.data(), out.data(), lse.data(), nullptr, B, T,
                                C, NH, KVH);

        const std::vector<double> weighted =
            test::attention_bounds(qkv.f32, dout.f32, out_wide, lse, attention_shape).backward; // (B,T,qkv width)
        const double f32_slack = (hs + T + 8) * std::ldexp(1.0, -24);
        double worst = 0.0;
        for (size_t index = 0; index < dqkv.size(); ++index) {
            const double half_ulp = 0.5 * std::max(bfloat16_ulp(dqkv_reference[index]), bfloat16_ulp(to_float(dqkv[index])));
            const double bound = (u + f32_slack) * weighted[index] + half_ulp +
                                 std::ldexp(1.0, -20);
            const double error = std::fabs(double(to_float(dqkv[index])) - dqkv_reference[index]);
            EXPECT_LE(error, bound) << "dqkv element " << index;
            worst = std::max(worst, error / bound);
        }
        std::cout << "[ measured ] backward NH=" << NH << " KVH=" << KVH << ": largest error / bound = " << worst << "\n";
    }
}

// Cross-entropy: both kernels compute the row statistics in double from the same (widened) logits, so the f32
// losses are bitwise equal (token-exact), and the bf16 gradient is the f32 gradient rounded once: 0.5 ulp,
// exactly to_bfloat16 of it. Padded columns and ignored rows are exact zeros.
TEST(Bf16CrossEntropy, FusedLossExactGradientRoundedOnce) {
    std::mt19937 generator(31);
    const int N = 6, V = 45, padded_V = 48, ignore_index = -100;
    const Inputs logits = random_inputs(generator, size_t(N) * padded_V, 4.0f);
    const std::vector<int32_t> targets = {3, 0, ignore_index, 44, 17, 9};
    std::vector<float> reference = logits.f32, reference_losses(N);
    cpu::cross_entropy_fused_forward(reference_losses.data(), reference.data(), targets.data(), 0.25f, N, V, padded_V,
                                     ignore_index);
    std::vector<bfloat16> gradient = logits.bf16;
    std::vector<float> losses(N);
    cpu::cross_entropy_fused_forward(losses.data(), gradient.data(), targets.data(), 0.25f, N, V, padded_V,
                                     ignore_index);
    for (int n = 0; n < N; ++n) EXPECT_EQ(losses[n], reference_losses[n]) << "row " << n;
    for (size_t i = 0; i < gradient.size(); ++i) EXPECT_EQ(gradient[i].bits, to_bfloat16(reference[i]).bits) << i;

    // The unfused pair: the same losses, and dlogits += g rounded once per store.
    std::vector<float> plain_losses(N), dlosses(N, 0.25f);
    std::vector<bfloat16> contiguous(size_t(N) * V), dlogits(size_t(N) * V, bfloat16{0});
    for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) contiguous[size_t(n) * V + v] = logits.bf16[size_t(n) * padded_V + v];
    cpu::cross_entropy_forward(plain_losses.data(), contiguous.data(), targets.data(), N, V, ignore_index);
    cpu::cross_entropy_backward(dlogits.data(), dlosses.data(), contiguous.data(), targets.data(), N, V, ignore_index);
    for (int n = 0; n < N; ++n) {
        EXPECT_EQ(plain_losses[n], reference_losses[n]) << "row " << n;
        for (int v = 0; v < V; ++v)
            EXPECT_EQ(dlogits[size_t(n) * V + v].bits, to_bfloat16(reference[size_t(n) * padded_V + v]).bits);
    }
}

Tensor bf16_tensor(const Inputs& inputs, const Shape& shape) {
    return Tensor::from_vector<bfloat16>(inputs.bf16, shape, Device::cpu);
}

// cross_entropy_in_place on bf16 logits (the fused classifier): an f32 loss equal to the f32 kernel's on the same
// logits (token-exact: both compute in double), and the logits' gradient the f32 kernel's rounded once to bf16
// (then held in the f32 buffer of the bf16 leaf, exactly).
TEST(Bf16Ops, FusedCrossEntropyOpLossAndGradient) {
    std::mt19937 generator(43);
    const int N = 4, V = 9;
    const Inputs values = random_inputs(generator, size_t(N) * V, 3.0f);
    const std::vector<int32_t> labels = {1, 8, 0, 4};
    Tensor logits = bf16_tensor(values, {N, V});
    logits.set_requires_grad(true);
    const Tensor loss = cross_entropy_in_place(logits, Tensor::from_vector<int32_t>(labels, {N}, Device::cpu),
                                               Reduction::mean);
    EXPECT_EQ(loss.dtype(), DType::f32);
    backward(loss);
    std::vector<float> reference = values.f32, losses(N);
    cpu::cross_entropy_fused_forward(losses.data(), reference.data(), labels.data(), 1.0f / N, N, V, V, -100);
    float expected_loss = 0.0f;
    for (const float value : losses) expected_loss += value;
    EXPECT_NEAR(loss.to_vector<float>()[0], expected_loss / N, 1e-6f);
    ASSERT_EQ(logits.grad().dtype(), DType::f32);
    const std::vector<float> gradient = logits.grad().to_vector<float>();
    for (size_t i = 0; i < gradient.size(); ++i) EXPECT_EQ(gradient[i], to_float(to_bfloat16(reference[i]))) << i;
}

// The ops' dtypes: bf16 activations, f32 parameter gradients of bf16 leaves (weight, the matmul's b), an f32
// loss; and the gradients' values are the bf16 kernels' (the GEMM's f32 weight gradient exactly the f32 GEMM of
// the bf16 operands).
TEST(Bf16Ops, LinearMatmulAttentionCrossEntropyDtypes) {
    std::mt19937 generator(41);
    const int B = 2, T = 5, C = 8, V = 11;
    const Inputs x = random_inputs(generator, size_t(B) * T * C), w = random_inputs(generator, size_t(C) * 3 * C);
    const Inputs table = random_inputs(generator, size_t(V) * C);
    Tensor input = bf16_tensor(x, {B, T, C}), weight = bf16_tensor(w, {C, 3 * C}), tokens = bf16_tensor(table, {V, C});
    weight.set_requires_grad(true);
    tokens.set_requires_grad(true);
    const Tensor qkv = linear(input, weight); // (B,T,3C) bf16, no bias (the bf16 bias gradient is the bias branch's)
    const Tensor attended = attention(qkv, 2);
    const Tensor logits = matmul(attended, tokens, true); // (B,T,V), the tied head
    std::vector<int32_t> labels(size_t(B) * T);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % V);
    const Tensor loss = cross_entropy(logits, Tensor::from_vector<int32_t>(labels, {B, T}, Device::cpu));
    EXPECT_EQ(qkv.dtype(), DType::bf16);
    EXPECT_EQ(attended.dtype(), DType::bf16);
    EXPECT_EQ(logits.dtype(), DType::bf16);
    EXPECT_EQ(loss.dtype(), DType::f32);
    backward(loss);
    ASSERT_TRUE(weight.grad().defined() && tokens.grad().defined());
    EXPECT_EQ(weight.grad().dtype(), DType::f32);
    EXPECT_EQ(tokens.grad().dtype(), DType::f32);
    // The values are the kernels' (tested above); here the whole path ran: finite and not identically zero.
    bool any_nonzero = false;
    for (const float value : weight.grad().to_vector<float>()) {
        EXPECT_TRUE(std::isfinite(value));
        any_nonzero = any_nonzero || value != 0.0f;
    }
    EXPECT_TRUE(any_nonzero);
}

// linear in bf16: out = round(x·W) exactly as the kernel, and the f32 weight gradient accumulates across two
// backward passes in f32 (no bf16 rounding between micro-batches): after two identical passes it is exactly
// twice the f32 GEMM xᵀ·dout of the bf16 operands (doubling is exact in binary).
TEST(Bf16Ops, LinearWeightGradientAccumulatesInF32) {
    std::mt19937 generator(42);
    const int rows = 6, in = 10, out = 7;
    const Inputs x = random_inputs(generator, size_t(rows) * in), w = random_inputs(generator, size_t(in) * out);
    Tensor weight = bf16_tensor(w, {in, out});
    weight.set_requires_grad(true);
    for (int pass = 0; pass < 2; ++pass) {
        const Tensor y = linear(bf16_tensor(x, {rows, in}), weight);
        backward(sum(cast(y, DType::f32)));
    }
    std::vector<bfloat16> ones(size_t(rows) * out, to_bfloat16(1.0f));
    std::vector<float> expected(size_t(in) * out, 0.0f);
    cpu::gemm(expected.data(), x.bf16.data(), ones.data(), in, out, rows, true, false, 1.0f, 0.0f);
    const std::vector<float> gradient = weight.grad().to_vector<float>();
    for (size_t i = 0; i < gradient.size(); ++i) EXPECT_EQ(gradient[i], 2.0f * expected[i]) << "element " << i;
}

} // namespace
} // namespace engine
