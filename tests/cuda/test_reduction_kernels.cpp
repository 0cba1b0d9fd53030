// CUDA vs CPU for the deterministic parallel reductions (layernorm's dweight/dbias, bias's dbias, the embedding
// tables) and for the 128-bit paths of the elementwise kernels. Row counts and widths break every tile
// (N = 1, 17, 1000, 4099; C = 3, 768, 770), += outputs start non-zero, each reduction runs twice and must
// agree to the bit, and pointers one float past an aligned address take the scalar paths.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using ReductionKernelTest = CudaKernelTest;

constexpr Tolerance exact{0.0, 0.0};
constexpr Tolerance pointwise{1e-6, 1e-5};

struct Shape {
    int N, C;
};
// Every N with a vector width (768), a width that is not a multiple of 4 (770) and a tiny one (3). At N = 4099
// the chunk count sits at its cap (row_chunk_count); layernorm, whose emulated run is the slowest, takes the
// widest shape only for bias.
constexpr Shape layernorm_shapes[] = {{1, 768}, {17, 770}, {17, 3}, {1000, 768}, {1000, 770}, {4099, 3}};
constexpr Shape bias_shapes[] = {{1, 768}, {17, 770}, {17, 3}, {1000, 768}, {1000, 770}, {4099, 3}, {4099, 768}};

std::string describe(const char* what, int N, int C, int offset = 0) {
    return std::string(what) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
           (offset != 0 ? " offset by one float" : "");
}

// `values` on the device `offset` floats past a 16-byte aligned allocation: offset 1 forces the scalar paths.
std::vector<float> shifted(const std::vector<float>& values, int offset) {
    std::vector<float> result(offset, 0.0f);
    result.insert(result.end(), values.begin(), values.end());
    return result;
}
DeviceBuffer<float> placed(const std::vector<float>& values, int offset) {
    return DeviceBuffer<float>(shifted(values, offset));
}
std::vector<float> read_back(const DeviceBuffer<float>& buffer, int offset) {
    std::vector<float> values = buffer.to_host();
    values.erase(values.begin(), values.begin() + offset);
    return values;
}

// The twins' float sums of N terms differ in order: the CPU adds row by row, the GPU in row chunks and then
// chunk partials. Each rounding errs by at most half an ulp of the running sum, |sum| <= N * max|term|
// (terms here at most ~4 in size), so a worst-case bound is N * 2^-24 * N * 4; random signs make the
// real error about sqrt(N) times smaller. atol 4e-6 * N (1.6e-2 at N = 4099, sums of size ~ sqrt(N) * 0.6 =
// 38 there) covers that with margin while an indexing error (a missing or doubled row) moves a sum by O(1).
Tolerance column_sum_tolerance(int N) { return Tolerance{4e-6 * N, 1e-5}; }

// The column sums are no longer bitwise the CPU's, so their errors are printed for the record.
void expect_close_and_report(const std::vector<float>& actual, const std::vector<float>& expected,
                             Tolerance tolerance, const std::string& what) {
    const ::testing::AssertionResult result = all_close(actual, expected, tolerance, what);
    EXPECT_TRUE(result);
    if (result) std::cout << "[ accuracy ] " << result.message() << "\n";
}

TEST_F(ReductionKernelTest, LayernormMatchesCpuAndIsBitwiseReproducible) {
    for (const auto [N, C] : layernorm_shapes) {
        for (const int offset : {0, 1}) {
            if (offset == 1 && (C % 4 != 0 || N > 17)) continue; // already scalar, or covered by C = 770
            const auto inp = random_floats(size_t(N) * C, 2.0f, 4.0f); // a large mean exercises the centring
            const auto weight = random_floats(C), bias = random_floats(C), dout = random_floats(size_t(N) * C);
            const auto dinp_start = random_floats(size_t(N) * C, -0.01f, 0.01f);
            const auto dweight_start = random_floats(C, -0.01f, 0.01f), dbias_start = random_floats(C, -0.01f, 0.01f);
            std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
            auto dinp = dinp_start, dweight = dweight_start, dbias = dbias_start;
            cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
            cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                                    mean.data(), rstd.data(), N, C);
            auto inp_device = placed(inp, offset), weight_device = placed(weight, offset);
            auto bias_device = placed(bias, offset), dout_device = placed(dout, offset);
            auto out_device = placed(nan_filled(out.size()), offset);
            DeviceBuffer<float> mean_device(nan_filled(N)), rstd_device(nan_filled(N));
            DeviceBuffer<float> partials(nan_filled(size_t(gpu::layernorm_backward_workspace_count(N, C))));
            gpu::layernorm_forward(out_device.get() + offset, mean_device.get(), rstd_device.get(),
                                   inp_device.get() + offset, weight_device.get() + offset,
                                   bias_device.get() + offset, N, C, stream);
            std::vector<std::vector<float>> runs;
            for (int run = 0; run < 2; ++run) {
                auto dinp_device = placed(dinp_start, offset);
                DeviceBuffer<float> dweight_device(dweight_start), dbias_device(dbias_start);
                gpu::layernorm_backward(dinp_device.get() + offset, dweight_device.get(), dbias_device.get(),
                                        partials.get(), dout_device.get() + offset, inp_device.get() + offset,
                                        weight_device.get() + offset, mean_device.get(), rstd_device.get(), N, C,
                                        stream);
                runs.push_back(read_back(dinp_device, offset));
                runs.push_back(dweight_device.to_host());
                runs.push_back(dbias_device.to_host());
            }
            const std::string size = describe("layernorm", N, C, offset);
            // Three values U(2,4) now and then lie close together: rstd nears its cap 1/sqrt(eps) = 316, and
            // the float mean's rounding (an ulp of 4, 4.8e-7) reaches out and dinp multiplied by up to 316.
            const double amplified = C < 32 ? 316.0 : 1.0;
            EXPECT_TRUE(
                all_close(read_back(out_device, offset), out, Tolerance{1e-5 * amplified, 1e-4}, size + " out"));
            EXPECT_TRUE(all_close(mean_device.to_host(), mean, Tolerance{1e-5, 1e-5}, size + " mean"));
            EXPECT_TRUE(all_close(rstd_device.to_host(), rstd, Tolerance{1e-5, 1e-4}, size + " rstd"));
            EXPECT_TRUE(all_close(runs[0], dinp, Tolerance{1e-4 * amplified, 1e-3}, size + " dinp"));
            expect_close_and_report(runs[1], dweight, column_sum_tolerance(N), size + " dweight");
            expect_close_and_report(runs[2], dbias, column_sum_tolerance(N), size + " dbias");
            for (int output = 0; output < 3; ++output)
                EXPECT_EQ(runs[output], runs[output + 3]) << size << ": two runs differ in output " << output;
        }
    }
}

// Past C = 6,144 one warp's column sums (8C bytes) exceed the default 48 KiB of dynamic shared memory: the
// launcher opts in to more (up to sm_90's 227 KiB, C = 29,056) and refuses wider rows before launching.
TEST_F(ReductionKernelTest, LayernormBackwardWideRowsOptInToMoreSharedMemory) {
    constexpr int N = 5, C = 6148;
    const auto inp = random_floats(size_t(N) * C), weight = random_floats(C), dout = random_floats(size_t(N) * C);
    std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
    auto dinp = random_floats(size_t(N) * C, -0.01f, 0.01f), dweight = random_floats(C, -0.01f, 0.01f);
    auto dbias = random_floats(C, -0.01f, 0.01f);
    DeviceBuffer<float> inp_device(inp), weight_device(weight), dout_device(dout), dinp_device(dinp);
    DeviceBuffer<float> dweight_device(dweight), dbias_device(dbias);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), weight.data(), N, C);
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                            mean.data(), rstd.data(), N, C);
    DeviceBuffer<float> mean_device(mean), rstd_device(rstd);
    DeviceBuffer<float> partials(nan_filled(size_t(gpu::layernorm_backward_workspace_count(N, C))));
    gpu::layernorm_backward(dinp_device.get(), dweight_device.get(), dbias_device.get(), partials.get(),
                            dout_device.get(), inp_device.get(), weight_device.get(), mean_device.get(),
                            rstd_device.get(), N, C, stream);
    EXPECT_TRUE(all_close(dinp_device.to_host(), dinp, Tolerance{1e-4, 1e-3}, describe("layernorm dinp", N, C)));
    expect_close_and_report(dweight_device.to_host(), dweight, column_sum_tolerance(N), describe("dweight", N, C));
    expect_close_and_report(dbias_device.to_host(), dbias, column_sum_tolerance(N), describe("dbias", N, C));
    constexpr int too_wide = 29057;
    // The typed first null picks the f32 overload (a bf16 one exists too).
    EXPECT_THROW(gpu::layernorm_backward(static_cast<float*>(nullptr), nullptr, nullptr, nullptr, nullptr, nullptr,
                                         nullptr, nullptr, nullptr, 1, too_wide, stream),
                 engine::EngineError);
}

TEST_F(ReductionKernelTest, BiasBackwardMatchesCpuAndIsBitwiseReproducible) {
    for (const auto [N, OC] : bias_shapes) {
        for (const int offset : {0, 1}) {
            if (offset == 1 && OC % 4 != 0) continue;
            const auto dout = random_floats(size_t(N) * OC), dbias_start = random_floats(OC);
            auto dbias = dbias_start;
            cpu::bias_backward(dbias.data(), dout.data(), N, OC);
            auto dout_device = placed(dout, offset);
            DeviceBuffer<float> partials(nan_filled(size_t(gpu::bias_backward_workspace_count(N, OC))));
            std::vector<std::vector<float>> runs;
            for (int run = 0; run < 2; ++run) {
                DeviceBuffer<float> dbias_device(dbias_start);
                gpu::bias_backward(dbias_device.get(), partials.get(), dout_device.get() + offset, N, OC, stream);
                runs.push_back(dbias_device.to_host());
            }
            const std::string size = describe("dbias", N, OC, offset);
            // The CPU sums each column in double; the GPU's float chunk sums err as in column_sum_tolerance.
            expect_close_and_report(runs[0], dbias, column_sum_tolerance(N), size);
            EXPECT_EQ(runs[0], runs[1]) << size << ": two runs differ";
        }
    }
}

// Token layouts: all positions on one token (the worst case for a scatter), all distinct, and random ids with
// repeats. Both twins add a token's positions in ascending order from the table's value, so the GPU result is
// the CPU's to the bit, and so is a second run.
TEST_F(ReductionKernelTest, EmbeddingBackwardIsBitwiseTheCpuTwin) {
    constexpr int V = 301;
    struct EmbeddingShape {
        int B, T, C;
    };
    for (const auto [B, T, C] : {EmbeddingShape{1, 1, 3}, EmbeddingShape{3, 37, 768}, EmbeddingShape{2, 50, 770},
                                 EmbeddingShape{4, 64, 20}}) {
        const int count = B * T;
        for (const char* layout : {"repeated", "distinct", "random"}) {
            std::vector<int32_t> tokens(count, 7);
            if (std::string(layout) == "distinct") {
                for (int position = 0; position < count; ++position) tokens[position] = (position * 37 + 5) % V;
            } else if (std::string(layout) == "random") {
                tokens = random_ints(count, 0, V - 1);
            }
            // Packed documents (positions restarting every 1 + (b + document) % 5 tokens) sum the position rows by
            // position, in ascending (b, t) order, as the CPU's loop.
            std::vector<int32_t> positions(static_cast<size_t>(count));
            for (int b = 0; b < B; ++b)
                for (int t = 0, document = 0, length = 1 + b % 5, position = 0; t < T; ++t) {
                    if (position == length) position = 0, length = 1 + (b + ++document) % 5;
                    positions[size_t(b) * T + t] = position++;
                }
            const gpu::TokenGroups position_groups = gpu::group_positions_by_token(positions.data(), count);
            DeviceBuffer<int32_t> position_groups_device(position_groups.packed);
            for (const int offset : {0, 1})
                for (const bool documents : {false, true}) {
                    if (offset == 1 && C % 4 != 0) continue;
                    const auto dout = random_floats(size_t(count) * C);
                    const auto token_start = random_floats(size_t(V) * C);
                    const auto position_start = random_floats(size_t(T + 3) * C);
                    auto dtoken = token_start, dposition = position_start;
                    cpu::embedding_backward(dtoken.data(), dposition.data(), dout.data(), tokens.data(),
                                            documents ? positions.data() : nullptr, B, T, C);
                    const gpu::TokenGroups groups = gpu::group_positions_by_token(tokens.data(), count);
                    DeviceBuffer<int32_t> groups_device(groups.packed);
                    auto dout_device = placed(dout, offset);
                    const std::string size =
                        describe(layout, B * T, C, offset) + (documents ? " packed documents" : "");
                    for (int run = 0; run < 2; ++run) {
                        auto dtoken_device = placed(token_start, offset),
                             dposition_device = placed(position_start, offset);
                        gpu::embedding_backward(dtoken_device.get() + offset, dposition_device.get() + offset,
                                                dout_device.get() + offset, groups_device.get(), groups.distinct,
                                                documents ? position_groups_device.get() : nullptr,
                                                documents ? position_groups.distinct : 0, B, T, C, stream);
                        EXPECT_TRUE(all_close(read_back(dtoken_device, offset), dtoken, exact,
                                              size + " dtoken_table run " + std::to_string(run)));
                        EXPECT_TRUE(all_close(read_back(dposition_device, offset), dposition, exact,
                                              size + " dposition_table run " + std::to_string(run)));
                    }
                }
        }
    }
}

TEST_F(ReductionKernelTest, TokenGroupsListPositionsInAscendingOrderPerToken) {
    const std::vector<int32_t> tokens = {5, 2, 5, 0, 2, 5};
    const gpu::TokenGroups groups = gpu::group_positions_by_token(tokens.data(), int(tokens.size()));
    EXPECT_EQ(groups.count, 6);
    EXPECT_EQ(groups.distinct, 3);
    // positions by token | distinct tokens | group starts
    EXPECT_EQ(groups.packed, (std::vector<int32_t>{3, 1, 4, 0, 2, 5, 0, 2, 5, 0, 1, 3, 6}));
}

// Each elementwise kernel on the same values at an aligned address (128-bit path) and one float past it
// (scalar path): the per-element arithmetic is the same, so the results must be equal to the bit, tails
// included, and both within the usual tolerance of the CPU twin.
constexpr int64_t elementwise_count = 4099 * 3; // not a multiple of 4: the vector path has a tail

template <typename Launch>
std::vector<std::vector<float>> on_both_paths(const std::vector<std::vector<float>>& inputs, Launch launch) {
    std::vector<std::vector<float>> results[2];
    for (const int offset : {0, 1}) {
        std::vector<std::unique_ptr<DeviceBuffer<float>>> owned;
        std::vector<float*> pointers;
        for (const auto& values : inputs) {
            owned.push_back(std::make_unique<DeviceBuffer<float>>(shifted(values, offset)));
            pointers.push_back(owned.back()->get() + offset);
        }
        launch(pointers);
        for (const auto& buffer : owned) results[offset].push_back(read_back(*buffer, offset));
    }
    for (size_t index = 0; index < inputs.size(); ++index)
        EXPECT_EQ(results[0][index], results[1][index]) << "buffer " << index << ": vector and scalar paths differ";
    return results[1];
}

TEST_F(ReductionKernelTest, ElementwiseVectorAndScalarPathsAreBitwiseEqual) {
    constexpr int64_t n = elementwise_count;
    const auto x = random_floats(n, -4.0f, 4.0f), y = random_floats(n), z = random_floats(n);
    {
        auto expected_y = y, expected_x = x;
        std::vector<float> expected_fill(n);
        cpu::fill(expected_fill.data(), 2.5f, n);
        cpu::axpy(expected_y.data(), x.data(), 0.3f, n);
        cpu::scale(expected_x.data(), -1.75f, n);
        const auto results = on_both_paths({x, y, nan_filled(n)}, [&](const std::vector<float*>& p) {
            gpu::axpy(p[1], p[0], 0.3f, n, stream);
            gpu::scale(p[0], -1.75f, n, stream);
            gpu::fill(p[2], 2.5f, n, stream);
        });
        EXPECT_TRUE(all_close(results[0], expected_x, pointwise, "scale"));
        EXPECT_TRUE(all_close(results[1], expected_y, pointwise, "axpy"));
        EXPECT_TRUE(all_close(results[2], expected_fill, exact, "fill"));
    }
    {
        std::vector<float> expected_out(n), expected_sum(n);
        auto expected_dinp = z, expected_da = y, expected_db = z;
        cpu::gelu_forward(expected_out.data(), x.data(), n);
        cpu::gelu_backward(expected_dinp.data(), y.data(), x.data(), n, true);
        cpu::residual_forward(expected_sum.data(), x.data(), y.data(), n);
        cpu::residual_backward(expected_da.data(), expected_db.data(), x.data(), n);
        const auto results = on_both_paths({x, y, z, nan_filled(n), nan_filled(n), y, z},
                                           [&](const std::vector<float*>& p) {
                                               gpu::gelu_forward(p[3], p[0], n, stream);
                                               gpu::gelu_backward(p[2], p[1], p[0], n, true, stream);
                                               gpu::residual_forward(p[4], p[0], p[1], n, stream);
                                               gpu::residual_backward(p[5], p[6], p[0], n, stream);
                                           });
        EXPECT_TRUE(all_close(results[3], expected_out, pointwise, "gelu out"));
        EXPECT_TRUE(all_close(results[2], expected_dinp, pointwise, "gelu dinp"));
        EXPECT_TRUE(all_close(results[4], expected_sum, exact, "residual out"));
        EXPECT_TRUE(all_close(results[5], expected_da, exact, "residual da"));
        EXPECT_TRUE(all_close(results[6], expected_db, exact, "residual db"));
    }
    {
        auto param = y, m = random_floats(n, -0.1f, 0.1f), v = random_floats(n, 0.0f, 0.01f), buffer = z;
        const auto start_m = m, start_v = v, start_param = param;
        auto sgd_param = y;
        cpu::adamw_update(param.data(), x.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f,
                          0.142625f, 0.5f);
        cpu::sgd_update(sgd_param.data(), x.data(), buffer.data(), n, 0.01f, 0.9f, 1e-4f, 0.8f);
        const auto results = on_both_paths({start_param, x, start_m, start_v, y, z}, [&](const std::vector<float*>& p) {
            gpu::adamw_update(p[0], p[1], p[2], p[3], n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.142625f, 0.5f,
                              stream);
            gpu::sgd_update(p[4], p[1], p[5], n, 0.01f, 0.9f, 1e-4f, 0.8f, stream);
        });
        EXPECT_TRUE(all_close(results[0], param, pointwise, "adamw param"));
        EXPECT_TRUE(all_close(results[2], m, pointwise, "adamw m"));
        EXPECT_TRUE(all_close(results[3], v, pointwise, "adamw v"));
        EXPECT_TRUE(all_close(results[4], sgd_param, pointwise, "sgd param"));
        EXPECT_TRUE(all_close(results[5], buffer, pointwise, "sgd momentum buffer"));
    }
}

// The batch-invariant mode's fold and rounding: bitwise the CPU's (the sum is exact, the largest |g| a max), with a NaN
// and an infinity in their own slots.
TEST_F(ReductionKernelTest, FixedPointFoldAndRound) {
    const int64_t n = elementwise_count * 7 + 5;
    std::vector<double> sum(static_cast<size_t>(n));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = std::ldexp(double(int64_t(i % 1000) - 500), -30);
    auto first = random_floats(static_cast<size_t>(n)), second = random_floats(static_cast<size_t>(n), -3.0f, 3.0f);
    second[17] = std::numeric_limits<float>::infinity();
    first[23] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint32_t> largest = {0u, 0u};
    auto expected_sum = sum;
    auto first_copy = first, second_copy = second;
    cpu::fixed_point_fold(expected_sum.data(), &largest[0], first_copy.data(), 40, n);
    cpu::fixed_point_fold(expected_sum.data(), &largest[1], second_copy.data(), 40, n);
    std::vector<float> expected_rounded(static_cast<size_t>(n));
    cpu::fixed_point_round(expected_rounded.data(), expected_sum.data(), n);
    DeviceBuffer<double> sum_device(sum);
    DeviceBuffer<uint32_t> largest_device(std::vector<uint32_t>{0u, 0u});
    DeviceBuffer<float> first_device(first), second_device(second), rounded(nan_filled(static_cast<size_t>(n)));
    gpu::fixed_point_fold(sum_device.get(), largest_device.get(), first_device.get(), 40, n, stream);
    gpu::fixed_point_fold(sum_device.get(), largest_device.get() + 1, second_device.get(), 40, n, stream);
    gpu::fixed_point_round(rounded.get(), sum_device.get(), n, stream);
    const std::vector<double> sums = sum_device.to_host(); // bit for bit (a NaN is not == itself)
    EXPECT_EQ(std::memcmp(sums.data(), expected_sum.data(), sums.size() * sizeof(double)), 0) << "the sums";
    EXPECT_TRUE(std::isnan(sums[23]) && std::isinf(sums[17]));
    EXPECT_EQ(largest_device.to_host(), largest); // the NaN's bits in slot 0, the infinity's in slot 1
    const std::vector<float> rounded_host = rounded.to_host();
    EXPECT_EQ(std::memcmp(rounded_host.data(), expected_rounded.data(), rounded_host.size() * sizeof(float)), 0)
        << "rounded gradient";
    EXPECT_TRUE(all_close(first_device.to_host(), std::vector<float>(static_cast<size_t>(n), 0.0f), exact, "zeroed"));
}

} // namespace
} // namespace engine::test
