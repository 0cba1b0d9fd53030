// CUDA vs CPU for the pointwise and reduction kernels: embedding, bias, GELU, residual, dropout, sums,
// elementwise helpers and the optimizer updates. Sizes are deliberately not multiples of any block size.
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

constexpr int B = 3, T = 37, C = 48, V = 301;
constexpr int64_t N = int64_t(B) * T * C + 5; // flat kernels: an odd count
constexpr Tolerance exact{0.0, 0.0};
constexpr Tolerance pointwise{1e-6, 1e-5};

using PointwiseKernelTest = CudaKernelTest;

TEST_F(PointwiseKernelTest, EmbeddingForward) {
    const auto tokens = random_ints(B * T, 0, V - 1);
    const auto token_table = random_floats(size_t(V) * C), position_table = random_floats(size_t(T + 3) * C);
    std::vector<float> expected(size_t(B) * T * C);
    cpu::embedding_forward(expected.data(), tokens.data(), token_table.data(), position_table.data(), nullptr, B, T, C);
    DeviceBuffer<int32_t> tokens_device(tokens);
    DeviceBuffer<float> token_device(token_table), position_device(position_table), out(nan_filled(expected.size()));
    gpu::embedding_forward(out.get(), tokens_device.get(), token_device.get(), position_device.get(), nullptr, B, T, C,
                           stream);
    EXPECT_TRUE(all_close(out.to_host(), expected, exact, "embedding out"));

    // Packed documents: each row's positions restart every 1 + (b + document) % 6 tokens.
    std::vector<int32_t> positions(size_t(B) * T);
    for (int b = 0; b < B; ++b)
        for (int t = 0, document = 0, length = 1 + b % 6, position = 0; t < T; ++t) {
            if (position == length) position = 0, length = 1 + (b + ++document) % 6;
            positions[size_t(b) * T + t] = position++;
        }
    cpu::embedding_forward(expected.data(), tokens.data(), token_table.data(), position_table.data(), positions.data(),
                           B, T, C);
    DeviceBuffer<int32_t> positions_device(positions);
    gpu::embedding_forward(out.get(), tokens_device.get(), token_device.get(), position_device.get(),
                           positions_device.get(), B, T, C, stream);
    EXPECT_TRUE(all_close(out.to_host(), expected, exact, "embedding out, packed documents"));
}

// The backward passes (bias, embedding) are in test_reduction_kernels.cpp.
TEST_F(PointwiseKernelTest, BiasForward) {
    const int rows = B * T, columns = 3 * C + 1;
    auto out = random_floats(size_t(rows) * columns);
    const auto bias = random_floats(columns);
    DeviceBuffer<float> out_device(out), bias_device(bias);
    cpu::bias_add_forward(out.data(), bias.data(), rows, columns);
    gpu::bias_add_forward(out_device.get(), bias_device.get(), rows, columns, stream);
    EXPECT_TRUE(all_close(out_device.to_host(), out, pointwise, "bias out"));
}

TEST_F(PointwiseKernelTest, GeluForwardAndBackward) {
    const auto inp = random_floats(N, -4.0f, 4.0f), dout = random_floats(N);
    std::vector<float> expected(N);
    auto dinp = random_floats(N);
    DeviceBuffer<float> inp_device(inp), dout_device(dout), out(nan_filled(N)), dinp_device(dinp);
    cpu::gelu_forward(expected.data(), inp.data(), N);
    cpu::gelu_backward(dinp.data(), dout.data(), inp.data(), N, true);
    gpu::gelu_forward(out.get(), inp_device.get(), N, stream);
    gpu::gelu_backward(dinp_device.get(), dout_device.get(), inp_device.get(), N, true, stream);
    EXPECT_TRUE(all_close(out.to_host(), expected, pointwise, "gelu out"));
    EXPECT_TRUE(all_close(dinp_device.to_host(), dinp, pointwise, "gelu dinp"));

    // The write form (a fresh gradient buffer) reads nothing of dinp, NaN there included, and gives the bits the
    // addition into zeros gives, on both twins.
    std::vector<float> written = nan_filled(N), into_zeros(N, 0.0f);
    cpu::gelu_backward(written.data(), dout.data(), inp.data(), N, false);
    cpu::gelu_backward(into_zeros.data(), dout.data(), inp.data(), N, true);
    EXPECT_TRUE(all_close(written, into_zeros, exact, "gelu dinp written (cpu)"));
    DeviceBuffer<float> written_device(nan_filled(N)), zeros_device(std::vector<float>(N, 0.0f));
    gpu::gelu_backward(written_device.get(), dout_device.get(), inp_device.get(), N, false, stream);
    gpu::gelu_backward(zeros_device.get(), dout_device.get(), inp_device.get(), N, true, stream);
    EXPECT_TRUE(all_close(written_device.to_host(), zeros_device.to_host(), exact, "gelu dinp written (cuda)"));
    EXPECT_TRUE(all_close(written_device.to_host(), written, pointwise, "gelu dinp written, cuda vs cpu"));
}

TEST_F(PointwiseKernelTest, ResidualForwardAndBackward) {
    const auto a = random_floats(N), b = random_floats(N), dout = random_floats(N);
    auto da = random_floats(N), db = random_floats(N);
    std::vector<float> expected(N);
    DeviceBuffer<float> a_device(a), b_device(b), dout_device(dout), out(nan_filled(N)), da_device(da), db_device(db);
    cpu::residual_forward(expected.data(), a.data(), b.data(), N);
    cpu::residual_backward(da.data(), db.data(), dout.data(), N);
    cpu::residual_backward(da.data(), static_cast<float*>(nullptr), dout.data(), N); // one side absent
    gpu::residual_forward(out.get(), a_device.get(), b_device.get(), N, stream);
    gpu::residual_backward(da_device.get(), db_device.get(), dout_device.get(), N, stream);
    gpu::residual_backward(da_device.get(), nullptr, dout_device.get(), N, stream);
    EXPECT_TRUE(all_close(out.to_host(), expected, exact, "residual out"));
    EXPECT_TRUE(all_close(da_device.to_host(), da, exact, "residual da"));
    EXPECT_TRUE(all_close(db_device.to_host(), db, exact, "residual db"));
}

TEST_F(PointwiseKernelTest, DropoutMasksAreBitIdenticalToCpu) {
    for (const float p : {0.0f, 0.1f, 0.5f}) {
        const auto inp = random_floats(N), dout = random_floats(N);
        auto dinp = random_floats(N);
        const uint64_t rng_seed = generator(), offset = generator() % 100000;
        std::vector<float> expected(N);
        DeviceBuffer<float> inp_device(inp), dout_device(dout), out(nan_filled(N)), dinp_device(dinp);
        cpu::dropout_forward(expected.data(), inp.data(), p, rng_seed, offset, N);
        cpu::dropout_backward(dinp.data(), dout.data(), p, rng_seed, offset, N);
        gpu::dropout_forward(out.get(), inp_device.get(), p, rng_seed, offset, N, stream);
        gpu::dropout_backward(dinp_device.get(), dout_device.get(), p, rng_seed, offset, N, stream);
        const auto actual = out.to_host();
        int64_t mask_differences = 0;
        for (int64_t i = 0; i < N; ++i) mask_differences += (actual[i] == 0.0f) != (expected[i] == 0.0f);
        EXPECT_EQ(mask_differences, 0) << "p=" << p;
        EXPECT_TRUE(all_close(actual, expected, pointwise, "dropout out p=" + std::to_string(p)));
        EXPECT_TRUE(all_close(dinp_device.to_host(), dinp, pointwise, "dropout dinp p=" + std::to_string(p)));
    }
}

// The small odd N, and N = 300,001: more than the 1,024 partials x 256 threads one pass covers, so every
// partial block loops grid-stride and the partial count sits at its cap.
// Both twins accumulate in double and round once, float(double(scale) * sum): they differ only by the
// order of the double additions (relative ~1e-16 * sqrt(N) of sum|x|), which moves the float result by at
// most one ulp, rarely: rtol 1e-6 is ~8 float ulps with atol 0. sum_of_squares stays double; its terms
// are all positive, so any order is within N * 2^-53 ~ 3.3e-11 relative: rtol 1e-10, atol 0.
TEST_F(PointwiseKernelTest, SumForwardBackwardAndSumOfSquares) {
    for (const int64_t count : {N, int64_t(300001)}) {
        const std::string what = " N=" + std::to_string(count);
        const auto inp = random_floats(count);
        const std::vector<float> dout = {0.75f};
        auto dinp = random_floats(count);
        // The device copy is taken before the CPU twin accumulates into dinp: both must start from the same
        // gradient (the first run on the emulated device caught this test adding the gradient twice).
        DeviceBuffer<float> inp_device(inp), dout_device(dout), sum(nan_filled(1)), dinp_device(dinp);
        const float scale = 1.0f / 3.0f;
        float expected_sum = 0.0f;
        double expected_squares = 0.0;
        cpu::sum_forward(&expected_sum, inp.data(), count, scale);
        cpu::sum_backward(dinp.data(), dout.data(), count, scale);
        cpu::sum_of_squares(&expected_squares, inp.data(), count);
        DeviceBuffer<double> squares(std::vector<double>{std::numeric_limits<double>::quiet_NaN()});
        DeviceBuffer<double> partials(static_cast<size_t>(gpu::reduction_workspace_count(count)));
        DeviceBuffer<double> chunks(static_cast<size_t>(gpu::sum_of_squares_workspace_count(&count, 1)));
        gpu::sum_forward(sum.get(), partials.get(), inp_device.get(), count, scale, stream);
        gpu::sum_backward(dinp_device.get(), dout_device.get(), count, scale, stream);
        gpu::sum_of_squares(squares.get(), chunks.get(), inp_device.get(), count, stream);
        EXPECT_TRUE(all_close(sum.to_host(), std::vector<float>{expected_sum}, Tolerance{0.0, 1e-6}, "sum" + what));
        EXPECT_TRUE(all_close(dinp_device.to_host(), dinp, pointwise, "sum dinp" + what));
        // The CPU's association (kernels/common/sum_of_squares_order.h): the same bits.
        EXPECT_EQ(squares.to_host()[0], expected_squares) << "sum_of_squares" << what;
        // Deterministic: a second run gives the same bits.
        const auto first = squares.to_host();
        gpu::sum_of_squares(squares.get(), chunks.get(), inp_device.get(), count, stream);
        EXPECT_EQ(std::memcmp(first.data(), squares.to_host().data(), sizeof(double)), 0) << what;
    }
}

TEST_F(PointwiseKernelTest, FillScaleAxpy) {
    auto x = random_floats(N), y = random_floats(N);
    DeviceBuffer<float> x_device(x), y_device(y), filled(nan_filled(N));
    std::vector<float> expected_fill(N);
    cpu::fill(expected_fill.data(), 2.5f, N);
    cpu::scale(x.data(), -1.75f, N);
    cpu::axpy(y.data(), x.data(), 0.3f, N);
    gpu::fill(filled.get(), 2.5f, N, stream);
    gpu::scale(x_device.get(), -1.75f, N, stream);
    gpu::axpy(y_device.get(), x_device.get(), 0.3f, N, stream);
    EXPECT_TRUE(all_close(filled.to_host(), expected_fill, exact, "fill"));
    EXPECT_TRUE(all_close(x_device.to_host(), x, pointwise, "scale"));
    EXPECT_TRUE(all_close(y_device.to_host(), y, pointwise, "axpy"));
}

// Elementwise grids are capped at max_elementwise_blocks (kernels/cuda/grid.h); past 65,535 blocks of 256 every
// thread must loop grid-stride, or the tail stays unwritten. Both buffers start one float past an aligned
// address, so axpy takes its scalar path, one float per thread and step: the 128-bit path (4 per step) would
// need 4x the floats, and so 4x this test's emulated time, to pass the cap, and it runs the same loop
// (for_each_pack in kernels/cuda/packs.cuh).
TEST_F(PointwiseKernelTest, AxpyBeyondTheGridCapLoopsGridStride) {
    constexpr int64_t count = int64_t(kernels::cuda::max_elementwise_blocks) * 256 + 1001; // ~16.8M floats
    const auto x = random_floats(count + 1);
    auto y = random_floats(count + 1);
    DeviceBuffer<float> x_device(x), y_device(y);
    cpu::axpy(y.data() + 1, x.data() + 1, 0.3f, count);
    gpu::axpy(y_device.get() + 1, x_device.get() + 1, 0.3f, count, stream);
    EXPECT_TRUE(all_close(y_device.to_host(), y, pointwise, "axpy N=" + std::to_string(count)));
}

TEST_F(PointwiseKernelTest, AdamwUpdate) {
    auto param = random_floats(N), m = random_floats(N, -0.1f, 0.1f), v = random_floats(N, 0.0f, 0.01f);
    const auto grad = random_floats(N);
    DeviceBuffer<float> param_device(param), grad_device(grad), m_device(m), v_device(v);
    const float beta1 = 0.9f, beta2 = 0.95f, step = 3.0f;
    const float correction1 = 1.0f - std::pow(beta1, step), correction2 = 1.0f - std::pow(beta2, step);
    cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), N, 3e-4f, beta1, beta2, 1e-8f, 0.1f,
                      correction1, correction2, 0.5f);
    gpu::adamw_update(param_device.get(), grad_device.get(), m_device.get(), v_device.get(), N, 3e-4f, beta1, beta2,
                      1e-8f, 0.1f, correction1, correction2, 0.5f, stream);
    EXPECT_TRUE(all_close(param_device.to_host(), param, pointwise, "adamw param"));
    EXPECT_TRUE(all_close(m_device.to_host(), m, pointwise, "adamw m"));
    EXPECT_TRUE(all_close(v_device.to_host(), v, pointwise, "adamw v"));
}

// The list twin: 140 tensors, 123 of them holding elements (two launches), sizes around the 4096-float tile and the packs of 4, some at unaligned
// addresses (the scalar path), some with working copies; the CUDA update within the single kernel's tolerance of
// the CPU's, the copies its own values rounded, every gradient zeroed. (Bitwise against the single kernel, the
// conversion and the fill: tests/adamw_list.h, on the device in test_pointwise_ops_kernels.cpp.)
TEST_F(PointwiseKernelTest, AdamwUpdateListMatchesTheCpuTwin) {
    const std::vector<int64_t> sizes = {1, 3, 4, 4097, 0, 8192, 130, 5};
    std::vector<std::vector<float>> hosts[4]; // parameter, gradient, first and second moments
    std::vector<std::unique_ptr<DeviceBuffer<float>>> devices[4];
    std::vector<std::unique_ptr<DeviceBuffer<bfloat16>>> copies;
    std::vector<kernels::AdamWTensor<float>> cpu_tensors, gpu_tensors;
    for (int index = 0; index < 140; ++index) {
        const int64_t count = sizes[index % sizes.size()], offset = index % 2; // odd tensors one float in
        const std::vector<float> values[4] = {random_floats(count + 1), random_floats(count + 1),
                                              random_floats(count + 1, -0.1f, 0.1f), random_floats(count + 1, 0.0f, 0.01f)};
        for (int stream_index = 0; stream_index < 4; ++stream_index) {
            hosts[stream_index].push_back(values[stream_index]);
            devices[stream_index].push_back(std::make_unique<DeviceBuffer<float>>(values[stream_index]));
        }
        copies.push_back(std::make_unique<DeviceBuffer<bfloat16>>(std::vector<bfloat16>(size_t(count + 1))));
        const float decay = index % 3 == 0 ? 0.1f : 0.0f;
        bfloat16* copy = index % 4 < 2 ? copies.back()->get() + offset : nullptr;
        cpu_tensors.push_back({hosts[0].back().data() + offset, hosts[1].back().data() + offset,
                               hosts[2].back().data() + offset, hosts[3].back().data() + offset, nullptr, count, decay});
        gpu_tensors.push_back({devices[0].back()->get() + offset, devices[1].back()->get() + offset,
                               devices[2].back()->get() + offset, devices[3].back()->get() + offset, copy, count, decay});
    }
    cpu::adamw_update_list(cpu_tensors.data(), int(cpu_tensors.size()), true, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.271f,
                           0.142625f, 0.5f);
    gpu::adamw_update_list(gpu_tensors.data(), int(gpu_tensors.size()), true, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.271f,
                           0.142625f, 0.5f, stream);
    for (size_t index = 0; index < gpu_tensors.size(); ++index) {
        const std::string where = "tensor " + std::to_string(index);
        const std::vector<float> parameter = devices[0][index]->to_host();
        EXPECT_TRUE(all_close(parameter, hosts[0][index], pointwise, "adamw list param, " + where));
        EXPECT_TRUE(all_close(devices[1][index]->to_host(), hosts[1][index], exact, "adamw list gradient, " + where));
        EXPECT_TRUE(all_close(devices[2][index]->to_host(), hosts[2][index], pointwise, "adamw list m, " + where));
        EXPECT_TRUE(all_close(devices[3][index]->to_host(), hosts[3][index], pointwise, "adamw list v, " + where));
        const std::vector<bfloat16> copy = copies[index]->to_host();
        const int64_t offset = int64_t(index % 2), count = gpu_tensors[index].count;
        for (int64_t element = 0; element < int64_t(copy.size()); ++element) {
            const bool written = gpu_tensors[index].working_copy != nullptr && element >= offset && element < offset + count;
            ASSERT_EQ(copy[size_t(element)].bits, written ? to_bfloat16(parameter[size_t(element)]).bits : 0)
                << where << ", copy element " << element;
        }
        for (int64_t element = offset; element < offset + count; ++element)
            ASSERT_EQ(hosts[1][index][size_t(element)], 0.0f) << where << ": the CPU twin zeroes the gradient too";
    }
}

TEST_F(PointwiseKernelTest, SgdUpdate) {
    auto param = random_floats(N), buffer = random_floats(N);
    const auto grad = random_floats(N);
    DeviceBuffer<float> param_device(param), grad_device(grad), buffer_device(buffer);
    cpu::sgd_update(param.data(), grad.data(), buffer.data(), N, 0.01f, 0.9f, 1e-4f, 0.8f);
    gpu::sgd_update(param_device.get(), grad_device.get(), buffer_device.get(), N, 0.01f, 0.9f, 1e-4f, 0.8f, stream);
    EXPECT_TRUE(all_close(param_device.to_host(), param, pointwise, "sgd param"));
    EXPECT_TRUE(all_close(buffer_device.to_host(), buffer, pointwise, "sgd momentum buffer"));
}

} // namespace
} // namespace engine::test
