// The Highway SIMD loops (kernels/cpu/vector_math.h: GELU, cross-entropy, Philox draws) and the vectorised gradient-norm sum against float64
// references, at every tail length a vector can leave and at a GPT-2 vocabulary row, with bounds derived from the
// operations each loop performs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_math.h"

namespace engine::test {
namespace {

namespace simd = engine::kernels::cpu::simd;

constexpr double unit_roundoff = 0x1p-24;  // f32
constexpr double double_roundoff = 0x1p-53;
// Highway's f32 tanh is documented to within 4 ulp; an ulp of t is at most 2u|t|.
constexpr double tanh_relative_error = 8 * unit_roundoff;
constexpr double sqrt_2_over_pi = 0.7978845608028654, cubic = 0.044715;

// Runs body(target name) once for each instruction set compiled into vector_math.cpp that this CPU can run
// (here AVX3, AVX2, SSE4, SSSE3 and the scalar fallback), with the dispatcher held to it, then restores it.
template <typename Body>
void for_each_target(Body&& body) {
    const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
    ASSERT_FALSE(targets.empty());
    for (const int64_t target : targets) {
        hwy::SetSupportedTargetsForTest(target);
        const std::string name = hwy::TargetName(target);
        ASSERT_EQ(std::string(simd::dispatched_target()), name) << "the dispatcher did not switch target";
        body(name);
    }
    hwy::SetSupportedTargetsForTest(0);
}

std::vector<float> gelu_inputs() {
    std::vector<float> x{0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 30.0f, -30.0f, 1e4f, -1e4f};
    std::mt19937 generator(5);
    std::uniform_real_distribution<float> wide(-8.0f, 8.0f);
    while (x.size() < 4099) x.push_back(wide(generator)); // 4099: an odd tail on every vector width
    return x;
}

// f32 error terms of the shared start: arg = s * fma(a x x, x, x) and t = tanh(arg). Returns |error of t|.
double tanh_error_bound(double x, double t) {
    const double x3 = cubic * std::fabs(x) * x * x;
    const double inner_error = unit_roundoff * (std::fabs(x) + x3) + 2 * unit_roundoff * x3;
    const double argument = sqrt_2_over_pi * std::fabs(x + cubic * x * x * x);
    const double argument_error = sqrt_2_over_pi * inner_error + unit_roundoff * argument;
    return (1 - t * t) * argument_error + tanh_relative_error * std::fabs(t);
}

double tanh_f64(double x) { return std::tanh(sqrt_2_over_pi * (x + cubic * x * x * x)); }

TEST(VectorMath, GeluForwardWithinItsF32ErrorBound) {
    for_each_target([&](const std::string& target) {
        SCOPED_TRACE("SIMD target " + target);
        const std::vector<float> x = gelu_inputs();
        for (const size_t count : {size_t(1), size_t(7), size_t(15), size_t(17), x.size()}) {
            std::vector<float> out(count, -7.0f);
            simd::gelu_forward(out.data(), x.data(), int64_t(count));
            double worst_ratio = 0;
            for (size_t i = 0; i < count; ++i) {
                const double xi = x[i], t = tanh_f64(xi), exact = 0.5 * xi * (1 + t);
                // value = (0.5 x) * (1 + t): t's error scaled by 0.5|x|, then two roundings.
                const double bound = 0.5 * std::fabs(xi) * (tanh_error_bound(xi, t) + unit_roundoff * std::fabs(1 + t)) +
                                     unit_roundoff * std::fabs(exact) + 1e-45;
                const double error = std::fabs(double(out[i]) - exact);
                ASSERT_LE(error, bound) << "gelu_forward x=" << xi << " count " << count;
                worst_ratio = std::max(worst_ratio, error / bound);
            }
            if (count == x.size()) std::cout << "[ measured ] " << target << " gelu_forward: worst error / bound " << worst_ratio << "\n";
        }
    });
}

TEST(VectorMath, GeluBackwardWithinItsF32ErrorBound) {
    for_each_target([&](const std::string& target) {
        SCOPED_TRACE("SIMD target " + target);
        const std::vector<float> x = gelu_inputs();
        std::mt19937 generator(6);
        std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
        std::vector<float> dout(x.size()), start(x.size());
        for (size_t i = 0; i < x.size(); ++i) dout[i] = unit(generator), start[i] = unit(generator);
        for (const size_t count : {size_t(1), size_t(9), size_t(31), x.size()}) {
            std::vector<float> dinp(start.begin(), start.begin() + count);
            simd::gelu_backward(dinp.data(), dout.data(), x.data(), int64_t(count), true);
            double worst_ratio = 0;
            for (size_t i = 0; i < count; ++i) {
                const double xi = x[i], t = tanh_f64(xi);
                const double tail = 0.5 * xi * (1 - t * t) * sqrt_2_over_pi * (1 + 3 * cubic * xi * xi);
                const double slope = 0.5 * (1 + t) + tail;
                const double exact = start[i] + slope * dout[i];
                // t's error enters 0.5(1+t) directly and the tail through (1-t^2) (derivative 2|t|); each of the ~8
                // products and sums after it rounds once; the final fma rounds once more.
                const double t_error = tanh_error_bound(xi, t);
                const double slope_bound = 0.5 * t_error + std::fabs(tail) * (2 * std::fabs(t) * t_error / std::max(1 - t * t, 1e-30)) +
                                           8 * unit_roundoff * (0.5 * std::fabs(1 + t) + std::fabs(tail));
                const double bound = std::fabs(dout[i]) * std::min(slope_bound, 2.0) + unit_roundoff * std::fabs(exact) + 1e-45;
                const double error = std::fabs(double(dinp[i]) - exact);
                ASSERT_LE(error, bound) << "gelu_backward x=" << xi << " count " << count;
                worst_ratio = std::max(worst_ratio, error / bound);
            }
            if (count == x.size()) std::cout << "[ measured ] " << target << " gelu_backward: worst error / bound " << worst_ratio << "\n";
            // The write form reads nothing of dinp (NaN there) and gives the bits of the addition into zeros.
            std::vector<float> written(count, std::numeric_limits<float>::quiet_NaN()), into_zeros(count, 0.0f);
            simd::gelu_backward(written.data(), dout.data(), x.data(), int64_t(count), false);
            simd::gelu_backward(into_zeros.data(), dout.data(), x.data(), int64_t(count), true);
            for (size_t i = 0; i < count; ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(written[i]), std::bit_cast<uint32_t>(into_zeros[i])) << "element " << i;
        }
    });
}

std::vector<float> logit_row(int64_t count, uint32_t seed) {
    std::mt19937 generator(seed);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> row(static_cast<size_t>(count));
    for (float& value : row) value = normal(generator);
    return row;
}

TEST(VectorMath, RowMaxAndExpSumAtEveryTailLength) {
    for_each_target([&](const std::string& target) {
        SCOPED_TRACE("SIMD target " + target);
        for (int64_t count = 1; count <= 70; ++count) {
            const std::vector<float> row = logit_row(count, uint32_t(count));
            const float expected_max = *std::max_element(row.begin(), row.end());
            ASSERT_EQ(simd::row_max(row.data(), count), expected_max) << "row_max count " << count; // max is exact
            double sum = 0;
            for (float value : row) sum += std::exp(double(value) - expected_max);
            // Each term within a few f64 ulps (Highway's f64 exp and libm's), each sum rounds once: count + 4 ulps.
            EXPECT_LE(std::fabs(simd::exp_sum(row.data(), expected_max, count) - sum), (count + 4) * 2 * double_roundoff * sum)
                << "exp_sum count " << count;
        }
    });
}

// The gradient in f64 then one rounding, as the scalar loop computed it with libm's exp: the f64 values differ by
// a few f64 ulps, so the rounded f32 results agree to within one f32 ulp (almost always exactly).
TEST(VectorMath, CrossEntropyGradientWithinOneUlpOfTheF64Formula) {
    for_each_target([&](const std::string& target) {
        SCOPED_TRACE("SIMD target " + target);
        int64_t differing = 0, total = 0;
        for (const int64_t count : {int64_t(1), int64_t(2), int64_t(13), int64_t(16), int64_t(37), int64_t(50257)}) {
            const std::vector<float> row = logit_row(count, uint32_t(100 + count));
            const double max_logit = *std::max_element(row.begin(), row.end());
            double sum = 0;
            for (float value : row) sum += std::exp(double(value) - max_logit);
            const double logsumexp = max_logit + std::log(sum), dloss = 0.37;
            for (const int64_t target : {int64_t(0), count - 1, count / 2, int64_t(-100)}) {
                for (const bool accumulate : {true, false}) {
                    std::vector<float> start = logit_row(count, 7), out = accumulate ? start : row;
                    // Not accumulating: in place over the logits, as the fused kernel calls it.
                    simd::softmax_cross_entropy_gradient(out.data(), accumulate ? row.data() : out.data(), logsumexp,
                                                         target, dloss, count, accumulate);
                    for (int64_t v = 0; v < count; ++v) {
                        const float gradient =
                            static_cast<float>((std::exp(double(row[v]) - logsumexp) - (v == target ? 1.0 : 0.0)) * dloss);
                        const float expected = accumulate ? start[v] + gradient : gradient;
                        const float ulp = std::nextafter(std::fabs(expected), INFINITY) - std::fabs(expected);
                        ASSERT_LE(std::fabs(out[v] - expected), ulp)
                            << "count " << count << " target " << target << " v " << v << " accumulate " << accumulate;
                        differing += out[v] != expected;
                        ++total;
                    }
                }
            }
        }
        std::cout << "[ measured ] " << target << " cross-entropy gradient: " << differing << " of " << total
                  << " elements differ from the libm f64 formula (by one ulp)\n";
    });
}

// Non-finite logits through the f32 kernels give what the scalar f64 formula gives (NaN where it gives NaN): a NaN
// anywhere in a row, +inf, a row of -inf, and -inf beside finite logits (exp gives 0 there, no NaN).
TEST(VectorMath, CrossEntropyKeepsNonFiniteLogitsAsTheScalarFormula) {
    constexpr int V = 37;
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<std::vector<float>> rows;
    for (const int position : {0, 5, 36}) {
        for (const float special : {nan, inf}) {
            rows.push_back(logit_row(V, 9));
            rows.back()[position] = special;
        }
    }
    rows.push_back(std::vector<float>(V, -inf));
    rows.push_back(logit_row(V, 10));
    rows.back()[3] = rows.back()[20] = -inf;
    const int N = int(rows.size());
    std::vector<float> logits, dlosses(N, 0.5f);
    for (const auto& row : rows) logits.insert(logits.end(), row.begin(), row.end());
    const std::vector<int32_t> targets(N, 4);
    std::vector<float> losses(N), dlogits(logits.size(), 0.0f);
    engine::kernels::cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V, -100);
    engine::kernels::cpu::cross_entropy_backward(dlogits.data(), dlosses.data(), logits.data(), targets.data(), N, V, -100);
    const std::vector<double> logits64(logits.begin(), logits.end()), dlosses64(dlosses.begin(), dlosses.end());
    std::vector<double> losses64(N), dlogits64(logits.size(), 0.0);
    engine::kernels::cpu::cross_entropy_forward(losses64.data(), logits64.data(), targets.data(), N, V, -100);
    engine::kernels::cpu::cross_entropy_backward(dlogits64.data(), dlosses64.data(), logits64.data(), targets.data(), N,
                                                 V, -100);
    for (int n = 0; n < N; ++n) {
        EXPECT_EQ(std::isnan(losses[n]), std::isnan(losses64[n])) << "loss of row " << n;
        if (!std::isnan(losses64[n])) EXPECT_NEAR(losses[n], losses64[n], 1e-5 * std::fabs(losses64[n])) << "row " << n;
        for (int v = 0; v < V; ++v) {
            const size_t i = size_t(n) * V + v;
            EXPECT_EQ(std::isnan(dlogits[i]), std::isnan(dlogits64[i])) << "dlogits row " << n << " column " << v;
            if (!std::isnan(dlogits64[i])) EXPECT_NEAR(dlogits[i], dlogits64[i], 1e-6) << "row " << n << " column " << v;
        }
    }
    EXPECT_TRUE(std::isnan(losses[0])) << "a NaN logit must give a NaN loss";
}

// The vector Philox draws are the scalar generator's bits, for keys and counters whose high words are zero, all
// ones, or cross 2^32 and 2^64 inside the run (the counter's two 32-bit words and its wrap), at every tail length.
TEST(VectorMath, PhiloxDrawsAreTheScalarGeneratorsBits) {
    for_each_target([&](const std::string& target) {
        SCOPED_TRACE("SIMD target " + target);
        for (const uint64_t seed : {uint64_t(0), uint64_t(99), ~uint64_t(0), uint64_t(0x0123456789ABCDEF)}) {
            for (const uint64_t offset : {uint64_t(0), uint64_t(17), uint64_t(0xFFFFFFF0u), ~uint64_t(0) - 40}) {
                for (const int64_t count : {int64_t(1), int64_t(5), int64_t(16), int64_t(33), int64_t(1000)}) {
                    std::vector<uint32_t> draws(static_cast<size_t>(count));
                    simd::philox_draws(draws.data(), seed, offset, 3, count);
                    for (int64_t j = 0; j < count; ++j) {
                        ASSERT_EQ(draws[j], engine::kernels::philox4x32_10(offset + 3 + uint64_t(j), seed).value[0] >> 8)
                            << "seed " << seed << " offset " << offset << " element " << j << " of " << count;
                    }
                }
            }
        }
    });
}

// The gradient norm's sum of squares (kernels/cpu/reduce.cpp: eight f64 chains per fixed chunk, chunk sums in
// order) against a long double sum: each of the N products and sums rounds once in f64, so the error is at most
// about N u_64 of the sum; measured, it is far below.
TEST(VectorMath, SumOfSquaresAgainstLongDouble) {
    for (const int64_t count : {int64_t(1), int64_t(9), int64_t(65537), int64_t(3) << 20}) {
        const std::vector<float> values = logit_row(count, uint32_t(count));
        long double exact = 0;
        for (float value : values) exact += static_cast<long double>(value) * value;
        double sum = 0;
        engine::kernels::cpu::sum_of_squares(&sum, values.data(), count);
        const double error = std::fabs(double(sum - exact)) / double(exact);
        EXPECT_LE(error, (count + 1) * 2 * double_roundoff) << "sum_of_squares count " << count;
        if (count > 65537) std::cout << "[ measured ] sum_of_squares of " << count << ": relative error " << error << "\n";
    }
}

} // namespace
} // namespace engine::test
