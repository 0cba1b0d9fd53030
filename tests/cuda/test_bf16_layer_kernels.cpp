// CUDA bf16 layer kernels against their CPU bf16 twins on the same inputs: bitwise where the order of
// operations is the same (the elementwise kernels but GELU, the embedding), within derived bounds where it is not
// (GELU's tanh, layernorm's float warp sums against the CPU's double ones, the parameter-gradient column sums). Shapes are
// small (the emulator runs each launch under several schedules) and odd, with pointers one element past an
// aligned address for the scalar paths.
#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "base/bfloat16.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

constexpr double float_epsilon = 1.0 / 16777216.0; // 2^-24, f32's unit roundoff

class Bf16LayerKernelTest : public CudaKernelTest {
public:
    std::vector<bfloat16> random_bf16(size_t count, float low = -1.0f, float high = 1.0f) {
        std::vector<bfloat16> values(count);
        const auto floats = random_floats(count, low, high);
        for (size_t i = 0; i < count; ++i) values[i] = to_bfloat16(floats[i]);
        return values;
    }
};

std::vector<float> widened(const std::vector<bfloat16>& values) {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = to_float(values[i]);
    return out;
}

// The bits of a bf16 buffer read back after `offset` leading elements.
template <typename T>
std::vector<T> read_back(const DeviceBuffer<T>& buffer, int offset) {
    std::vector<T> values = buffer.to_host();
    values.erase(values.begin(), values.begin() + offset);
    return values;
}
template <typename T>
std::vector<T> shifted(const std::vector<T>& values, int offset) {
    std::vector<T> result(size_t(offset), T{});
    result.insert(result.end(), values.begin(), values.end());
    return result;
}

::testing::AssertionResult bitwise_equal(const std::vector<bfloat16>& actual, const std::vector<bfloat16>& expected,
                                         const std::string& what) {
    size_t differing = 0, first = 0;
    for (size_t i = 0; i < actual.size(); ++i)
        if (actual[i].bits != expected[i].bits && differing++ == 0) first = i;
    if (actual.size() == expected.size() && differing == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << differing << " of " << expected.size()
                                         << " elements differ; first [" << first << "] cuda "
                                         << to_float(actual[first]) << " cpu " << to_float(expected[first]);
}

// |cuda - cpu| <= ulps * ulp_bf16(cpu) + slack[i] elementwise (slack empty: none); prints the largest error.
::testing::AssertionResult within_ulps(const std::vector<bfloat16>& actual, const std::vector<bfloat16>& expected,
                                       double ulps, const std::vector<double>& slack, const std::string& what) {
    double worst = 0.0;
    size_t failures = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double e = to_float(expected[i]), error = std::fabs(double(to_float(actual[i])) - e);
        const double bound = ulps * bfloat16_ulp(e) + (slack.empty() ? 0.0 : slack[i]);
        worst = std::max(worst, error / bfloat16_ulp(e));
        failures += !(error <= bound);
    }
    std::cout << "[ measured ] " << what << ": max |cuda - cpu| " << worst << " bf16 ulp\n";
    if (failures == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << failures << " elements over the bound";
}

// |cuda - cpu| <= bound[i] elementwise for float results; prints the largest error / bound.
::testing::AssertionResult within_bounds(const std::vector<float>& actual, const std::vector<float>& expected,
                                         const std::vector<double>& bound, const std::string& what) {
    double worst = 0.0;
    size_t failures = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(double(actual[i]) - double(expected[i]));
        worst = std::max(worst, bound[i] > 0 ? error / bound[i] : error);
        failures += !(error <= bound[i]);
    }
    std::cout << "[ measured ] " << what << ": max error / bound " << worst << "\n";
    if (failures == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << failures << " elements over the bound";
}

constexpr int64_t N = 3 * 37 * 5 + 3; // flat kernels: odd, so the packed paths have a tail

TEST_F(Bf16LayerKernelTest, ResidualDropoutAndSumBitwiseAndGeluWithinOneUlpOfTheCpus) {
    for (const int offset : {0, 1}) { // 1: the scalar paths
        const auto a = random_bf16(N, -4.0f, 4.0f), b = random_bf16(N), dout = random_bf16(N);
        const auto start = random_bf16(N);
        std::vector<bfloat16> sum(N), da = start, db = start, gelu(N), dgelu = start, drop(N), ddrop = start,
                                      dsum = start;
        cpu::residual_forward(sum.data(), a.data(), b.data(), N);
        cpu::residual_backward(da.data(), db.data(), dout.data(), N);
        cpu::gelu_forward(gelu.data(), a.data(), N);
        cpu::gelu_backward(dgelu.data(), dout.data(), a.data(), N, true);
        cpu::dropout_forward(drop.data(), a.data(), 0.3f, 99, 17, N);
        cpu::dropout_backward(ddrop.data(), dout.data(), 0.3f, 99, 17, N);
        const float dloss = 0.7f;
        cpu::sum_backward(dsum.data(), &dloss, N, 0.25f);

        DeviceBuffer<bfloat16> a_d(shifted(a, offset)), b_d(shifted(b, offset)), dout_d(shifted(dout, offset));
        DeviceBuffer<bfloat16> sum_d(N + offset), da_d(shifted(start, offset)), db_d(shifted(start, offset));
        DeviceBuffer<bfloat16> gelu_d(N + offset), dgelu_d(shifted(start, offset)), drop_d(N + offset);
        DeviceBuffer<bfloat16> ddrop_d(shifted(start, offset)), dsum_d(shifted(start, offset));
        DeviceBuffer<float> dloss_d(std::vector<float>{dloss});
        gpu::residual_forward(sum_d.get() + offset, a_d.get() + offset, b_d.get() + offset, N, stream);
        gpu::residual_backward(da_d.get() + offset, db_d.get() + offset, dout_d.get() + offset, N, stream);
        gpu::gelu_forward(gelu_d.get() + offset, a_d.get() + offset, N, stream);
        gpu::gelu_backward(dgelu_d.get() + offset, dout_d.get() + offset, a_d.get() + offset, N, true, stream);
        gpu::dropout_forward(drop_d.get() + offset, a_d.get() + offset, 0.3f, 99, 17, N, stream);
        gpu::dropout_backward(ddrop_d.get() + offset, dout_d.get() + offset, 0.3f, 99, 17, N, stream);
        gpu::sum_backward(dsum_d.get() + offset, dloss_d.get(), N, 0.25f, stream);
        const std::string at = offset ? " (scalar path)" : " (packed path)";
        EXPECT_TRUE(bitwise_equal(read_back(sum_d, offset), sum, "residual out" + at));
        EXPECT_TRUE(bitwise_equal(read_back(da_d, offset), da, "residual da" + at));
        EXPECT_TRUE(bitwise_equal(read_back(db_d, offset), db, "residual db" + at));
        EXPECT_TRUE(bitwise_equal(read_back(drop_d, offset), drop, "dropout out" + at));
        EXPECT_TRUE(bitwise_equal(read_back(ddrop_d, offset), ddrop, "dropout dinp" + at));
        EXPECT_TRUE(bitwise_equal(read_back(dsum_d, offset), dsum, "sum dinp" + at));
        // GELU: the same float formula, but the CPU takes Highway's vector tanh (kernels/cpu/vector_math.h) and the
        // device tanhf (the host's libm on the emulated device); the two differ by a few f32 ulps, which can move
        // the one bf16 rounding by one ulp, never more.
        EXPECT_TRUE(within_ulps(read_back(gelu_d, offset), gelu, 1.0, {}, "gelu out" + at));
        EXPECT_TRUE(within_ulps(read_back(dgelu_d, offset), dgelu, 1.0, {}, "gelu dinp" + at));
    }
}

TEST_F(Bf16LayerKernelTest, ColumnsBiasForwardAndEmbeddingAreBitwiseTheCpus) {
    const int64_t rows = 23;
    const int columns = 13, count = 9;
    const auto x = random_bf16(size_t(rows) * columns), dcols = random_bf16(size_t(rows) * count);
    const auto dx_start = random_bf16(x.size());
    std::vector<bfloat16> cols(size_t(rows) * count), dx = dx_start;
    cpu::first_columns_forward(cols.data(), x.data(), rows, columns, count);
    cpu::first_columns_backward(dx.data(), dcols.data(), rows, columns, count);
    DeviceBuffer<bfloat16> x_d(x), dcols_d(dcols), cols_d(cols.size()), dx_d(dx_start);
    gpu::first_columns_forward(cols_d.get(), x_d.get(), rows, columns, count, stream);
    gpu::first_columns_backward(dx_d.get(), dcols_d.get(), rows, columns, count, stream);
    EXPECT_TRUE(bitwise_equal(cols_d.to_host(), cols, "first_columns out"));
    EXPECT_TRUE(bitwise_equal(dx_d.to_host(), dx, "first_columns dinp"));

    const int OC = 3 * 4 + 1;
    auto out = random_bf16(size_t(rows) * OC);
    const auto bias = random_bf16(OC);
    DeviceBuffer<bfloat16> out_d(out), bias_d(bias);
    cpu::bias_add_forward(out.data(), bias.data(), int(rows), OC);
    gpu::bias_add_forward(out_d.get(), bias_d.get(), int(rows), OC, stream);
    EXPECT_TRUE(bitwise_equal(out_d.to_host(), out, "bias out"));

    // Embedding: the forward rounds once alike; backward adds each token's dout rows into the f32 tables in
    // ascending position order on both devices (kernels/cuda/cuda_kernels.h), so the tables agree to the bit.
    for (const int C : {16, 7}) { // 16: packed; 7: scalar
        const int B = 2, T = 5, V = 6;
        const auto tokens = random_ints(B * T, 0, V - 1);
        const auto token_table = random_bf16(size_t(V) * C), position_table = random_bf16(size_t(T + 1) * C);
        std::vector<bfloat16> emb(size_t(B) * T * C);
        cpu::embedding_forward(emb.data(), tokens.data(), token_table.data(), position_table.data(), nullptr, B, T, C);
        DeviceBuffer<int32_t> tokens_d(tokens);
        DeviceBuffer<bfloat16> token_d(token_table), position_d(position_table), emb_d(emb.size());
        gpu::embedding_forward(emb_d.get(), tokens_d.get(), token_d.get(), position_d.get(), nullptr, B, T, C, stream);
        EXPECT_TRUE(bitwise_equal(emb_d.to_host(), emb, "embedding out C=" + std::to_string(C)));

        const auto dout = random_bf16(emb.size());
        auto dtoken = random_floats(size_t(V) * C), dposition = random_floats(size_t(T + 1) * C);
        DeviceBuffer<float> dtoken_d(dtoken), dposition_d(dposition);
        DeviceBuffer<bfloat16> dout_d(dout);
        cpu::embedding_backward(dtoken.data(), dposition.data(), dout.data(), tokens.data(), nullptr, B, T, C);
        const gpu::TokenGroups groups = gpu::group_positions_by_token(tokens.data(), B * T);
        DeviceBuffer<int32_t> groups_d(groups.packed);
        gpu::embedding_backward(dtoken_d.get(), dposition_d.get(), dout_d.get(), groups_d.get(), groups.distinct,
                                nullptr, 0, B, T, C, stream);
        EXPECT_TRUE(all_close(dtoken_d.to_host(), dtoken, Tolerance{0.0, 0.0}, "dtoken_table"));
        EXPECT_TRUE(all_close(dposition_d.to_host(), dposition, Tolerance{0.0, 0.0}, "dposition_table"));
    }
}

// Sums whose order differs: the CPU adds each column in order (bias: in double; layernorm: in float), the GPU in
// row chunks and then the chunk partials, all in float. Each of the <= N + 16 float additions of either order
// errs by <= 2^-24 times the running sum's size, bounded by sum_n |term|: the two results differ by at most
// 2 (N + 16) 2^-24 sum_n |term_n|, plus 2^-24 |start| for the += into a non-zero start.
TEST_F(Bf16LayerKernelTest, BiasBackwardAndSumForwardWithinTheReorderingBound) {
    for (const int offset : {0, 1}) {
        const int rows = 41, OC = 20;
        const auto dout = random_bf16(size_t(rows) * OC);
        auto dbias = random_floats(OC);
        DeviceBuffer<float> dbias_d(dbias);
        DeviceBuffer<bfloat16> dout_d(shifted(dout, offset));
        DeviceBuffer<float> partials(nan_filled(size_t(gpu::bias_backward_workspace_count(rows, OC))));
        std::vector<double> bound(OC);
        for (int o = 0; o < OC; ++o) {
            double magnitude = 0.0;
            for (int n = 0; n < rows; ++n) magnitude += std::fabs(to_float(dout[size_t(n) * OC + o]));
            bound[o] = 2.0 * (rows + 16) * float_epsilon * magnitude + float_epsilon * std::fabs(dbias[o]);
        }
        cpu::bias_backward(dbias.data(), dout.data(), rows, OC);
        gpu::bias_backward(dbias_d.get(), partials.get(), dout_d.get() + offset, rows, OC, stream);
        EXPECT_TRUE(within_bounds(dbias_d.to_host(), dbias, bound, "bias dbias" + std::string(offset ? " scalar" : "")));
    }
    // sum: both add the exact (widened) values in double, in different orders, and round once to float: the
    // double sums differ by <= 2 N 2^-53 sum|x|, far below the final rounding, so within one f32 ulp.
    const auto x = random_bf16(N);
    float expected = 0.0f;
    cpu::sum_forward(&expected, x.data(), N, 0.5f);
    DeviceBuffer<bfloat16> x_d(x);
    DeviceBuffer<double> partials(size_t(gpu::reduction_workspace_count(N)));
    DeviceBuffer<float> out_d(1);
    gpu::sum_forward(out_d.get(), partials.get(), x_d.get(), N, 0.5f, stream);
    const float actual = out_d.to_host()[0];
    EXPECT_LE(std::fabs(double(actual) - expected), std::ldexp(std::fabs(double(expected)), -23));
    std::cout << "[ measured ] sum of bf16: |cuda - cpu| " << std::fabs(double(actual) - expected) << "\n";
}

// Layernorm. Forward: the CPU's statistics are double sums rounded to float, the GPU's float warp sums: each
// differs by <= (C + 2) 2^-24 of sum|x|/C (mean) and of the variance (rstd, relative, halved by the sqrt,
// plus rsqrtf's few ulp). Given the two kernels' own mean and rstd (both read back), the outputs' pre-rounding
// values differ by delta = |w| |(x - m1) r1 - (x - m2) r2| plus the float evaluation (<= 4 2^-24 (|norm w| + |b|)),
// so after one rounding each: |cuda - cpu| <= 1 ulp_bf16 + delta. Backward (the same mean and rstd given to
// both): dinp's two row means are double sums on the CPU, float warp sums on the GPU, differing by <=
// (C + 2) 2^-24 sum|term|/C; dx moves by rstd (|d mean(dnorm)| + |norm| |d mean(dnorm norm)|) + float slack,
// then one rounding each: 1 ulp + that. dweight/dbias: the reordering bound of the test above.
TEST_F(Bf16LayerKernelTest, LayernormWithinOneUlpPlusTheStatisticsBound) {
    for (const auto [rows, C] : {std::pair{9, 64}, std::pair{5, 37}}) {
        const std::string shape = " N=" + std::to_string(rows) + " C=" + std::to_string(C);
        const auto x = random_bf16(size_t(rows) * C, 1.0f, 3.0f), w = random_bf16(C, 0.5f, 1.5f);
        const auto b = random_bf16(C), dout = random_bf16(x.size()), dx_start = random_bf16(x.size(), -0.01f, 0.01f);
        std::vector<bfloat16> out(x.size());
        std::vector<float> mean(rows), rstd(rows);
        cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C);
        DeviceBuffer<bfloat16> x_d(x), w_d(w), b_d(b), out_d(x.size()), dout_d(dout), dx_d(dx_start);
        DeviceBuffer<float> mean_d(nan_filled(size_t(rows))), rstd_d(nan_filled(size_t(rows)));
        gpu::layernorm_forward(out_d.get(), mean_d.get(), rstd_d.get(), x_d.get(), w_d.get(), b_d.get(), rows, C,
                               stream);
        const auto gpu_mean = mean_d.to_host(), gpu_rstd = rstd_d.to_host();
        std::vector<double> mean_bound(rows), rstd_bound(rows), out_slack(x.size());
        for (int n = 0; n < rows; ++n) {
            double magnitude = 0.0;
            for (int c = 0; c < C; ++c) magnitude += std::fabs(to_float(x[size_t(n) * C + c]));
            mean_bound[n] = (C + 2) * float_epsilon * magnitude / C;
            rstd_bound[n] = (C + 8) * float_epsilon * rstd[n];
            for (int c = 0; c < C; ++c) {
                const double xv = to_float(x[size_t(n) * C + c]), wv = std::fabs(to_float(w[c]));
                const double norm = (xv - mean[n]) * rstd[n];
                out_slack[size_t(n) * C + c] =
                    wv * std::fabs((xv - mean[n]) * rstd[n] - (xv - gpu_mean[n]) * gpu_rstd[n]) +
                    4 * float_epsilon * (std::fabs(norm) * wv + std::fabs(to_float(b[c])));
            }
        }
        EXPECT_TRUE(within_bounds(gpu_mean, mean, mean_bound, "layernorm mean" + shape));
        EXPECT_TRUE(within_bounds(gpu_rstd, rstd, rstd_bound, "layernorm rstd" + shape));
        EXPECT_TRUE(within_ulps(out_d.to_host(), out, 1.0, out_slack, "layernorm out" + shape));

        auto dweight = random_floats(C), dbias = random_floats(C);
        std::vector<bfloat16> dx = dx_start;
        DeviceBuffer<float> dweight_d(dweight), dbias_d(dbias), cpu_mean_d(mean), cpu_rstd_d(rstd);
        DeviceBuffer<float> partials(nan_filled(size_t(gpu::layernorm_backward_workspace_count(rows, C))));
        std::vector<double> dx_slack(x.size()), dweight_bound(C), dbias_bound(C);
        for (int c = 0; c < C; ++c) {
            dweight_bound[c] = float_epsilon * std::fabs(dweight[c]);
            dbias_bound[c] = float_epsilon * std::fabs(dbias[c]);
        }
        for (int n = 0; n < rows; ++n) {
            double dnorm_magnitude = 0.0, product_magnitude = 0.0;
            for (int c = 0; c < C; ++c) {
                const size_t i = size_t(n) * C + c;
                const double norm = (double(to_float(x[i])) - mean[n]) * rstd[n], g = to_float(dout[i]);
                const double dnorm = double(to_float(w[c])) * g;
                dnorm_magnitude += std::fabs(dnorm);
                product_magnitude += std::fabs(dnorm * norm);
                dweight_bound[c] += 2.0 * (rows + 16) * float_epsilon * std::fabs(norm * g);
                dbias_bound[c] += 2.0 * (rows + 16) * float_epsilon * std::fabs(g);
            }
            const double mean_error = (C + 2) * float_epsilon * dnorm_magnitude / C;
            const double product_error = (C + 2) * float_epsilon * product_magnitude / C;
            for (int c = 0; c < C; ++c) {
                const size_t i = size_t(n) * C + c;
                const double norm = std::fabs((double(to_float(x[i])) - mean[n]) * rstd[n]);
                const double dnorm = std::fabs(double(to_float(w[c])) * to_float(dout[i]));
                dx_slack[i] = rstd[n] * (mean_error + norm * product_error) +
                              6 * float_epsilon * rstd[n] * (dnorm + dnorm_magnitude / C + norm * product_magnitude / C);
            }
        }
        cpu::layernorm_backward(dx.data(), dweight.data(), dbias.data(), dout.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), rows, C);
        gpu::layernorm_backward(dx_d.get(), dweight_d.get(), dbias_d.get(), partials.get(), dout_d.get(), x_d.get(),
                                w_d.get(), cpu_mean_d.get(), cpu_rstd_d.get(), rows, C, stream);
        EXPECT_TRUE(within_ulps(dx_d.to_host(), dx, 1.0, dx_slack, "layernorm dinp" + shape));
        EXPECT_TRUE(within_bounds(dweight_d.to_host(), dweight, dweight_bound, "layernorm dweight" + shape));
        EXPECT_TRUE(within_bounds(dbias_d.to_host(), dbias, dbias_bound, "layernorm dbias" + shape));
    }
}

// The ops dispatch bf16 to the CUDA kernels: embedding -> layernorm -> gelu -> add -> sum on the device gives
// the CPU's dtypes and, the kernels being held to the CPU's above, values within those kernels' bounds; here
// (a few rounding flips of layernorm's output at most, each <= 1 ulp, propagated through a sum of 32 terms of
// size ~1) the f32 loss within 32 ulp_bf16(1). A parameter gradient element sums B*T = 4 rows; one flip of a
// layernorm output (<= 2^-7 relative, values ~1) moves gelu's slope and so one row's term by <= 2^-7 * |xhat|
// (|xhat| <= 2 here), so 2^-5 covers one flip with room; without a flip the two differ by f32 reordering only
// (measured: 0 to 5e-7).
TEST_F(Bf16LayerKernelTest, OpsRunBf16OnTheDevice) {
    const int B = 2, T = 2, C = 8, V = 5;
    const auto tok = random_bf16(size_t(V) * C), pos = random_bf16(size_t(T) * C), w = random_bf16(C, 0.5f, 1.5f);
    const auto b = random_bf16(C);
    auto run = [&](Device device) {
        current_tape().clear();
        Tensor token_table = Tensor::from_vector<bfloat16>(tok, {V, C}, device);
        Tensor position_table = Tensor::from_vector<bfloat16>(pos, {T, C}, device);
        Tensor weight = Tensor::from_vector<bfloat16>(w, {C}, device), bias = Tensor::from_vector<bfloat16>(b, {C}, device);
        for (Tensor* leaf : {&token_table, &position_table, &weight, &bias}) leaf->set_requires_grad(true);
        Tensor tokens = Tensor::from_vector<int32_t>({0, 3, 3, 1}, {B, T}, device);
        Tensor h = embedding(tokens, token_table, position_table);
        Tensor loss = sum(add(h, gelu(layernorm(h, weight, bias))));
        EXPECT_EQ(h.dtype(), DType::bf16);
        EXPECT_EQ(loss.dtype(), DType::f32);
        backward(loss);
        std::vector<std::vector<float>> results{loss.to(Device::cpu).to_vector<float>()};
        for (Tensor* leaf : {&token_table, &position_table, &weight, &bias}) {
            EXPECT_EQ(leaf->grad().dtype(), DType::f32);
            results.push_back(leaf->grad().to(Device::cpu).to_vector<float>());
        }
        return results;
    };
    const auto on_device = run(Device::cuda), on_host = run(Device::cpu);
    EXPECT_LE(std::fabs(on_device[0][0] - on_host[0][0]), 32 * bfloat16_ulp(1.0));
    for (size_t i = 1; i < on_host.size(); ++i) {
        double worst = 0.0;
        for (size_t k = 0; k < on_host[i].size(); ++k) worst = std::max(worst, double(std::fabs(on_device[i][k] - on_host[i][k])));
        std::printf("[ parameter gradient %zu: max |device - host| %.3g ]\n", i, worst);
        EXPECT_TRUE(all_close(on_device[i], on_host[i], Tolerance{std::ldexp(1.0, -5), 0.0}, "parameter gradient " + std::to_string(i)));
    }
}

} // namespace
} // namespace engine::test
