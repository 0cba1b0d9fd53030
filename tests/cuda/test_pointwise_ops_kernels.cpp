// CUDA vs CPU for the pointwise ops' kernels (kernels/cuda/unary.cu, broadcast.cu): every unary function, every
// binary one over broadcast layouts that take each backward path (thread per element, warp per row sum), in
// f32 and bf16, and the ops with backward on the device against the CPU.
#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/common/broadcast_layout.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/adamw_list.h"
#include "tests/bf16_vectors.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;
using kernels::BinaryFunction;
using kernels::UnaryFunction;

constexpr int64_t N = 3 * 37 * 48 + 5; // not a multiple of any block or pack
// CUDA's single-precision expf, tanhf and logf are within 2 ulp (CUDA C++ Programming Guide, "Mathematical
// Functions"); silu composes an exp, a division and a product: at most 8 ulp = 8·2^-24 ≈ 4.8e-7 relative. The
// backward adds one product and one sum to it. The emulator runs the host's libm, so there both are exact.
constexpr Tolerance unary_f32{1e-7, 1e-6};
// bf16 stores round once; an f32 difference of a few ulp can move that rounding by one bf16 ulp (2^-7 at most,
// relative to the value).
constexpr Tolerance one_bf16_ulp{1e-6, 0.0078125};

const UnaryFunction unary_functions[] = {UnaryFunction::relu, UnaryFunction::silu,    UnaryFunction::tanh,
                                         UnaryFunction::sigmoid, UnaryFunction::exp, UnaryFunction::log};
const char* unary_name(UnaryFunction function) {
    const char* names[] = {"relu", "silu", "tanh", "sigmoid", "exp", "log"};
    return names[static_cast<int>(function)];
}

using PointwiseOpsKernelTest = CudaKernelTest;

TEST_F(PointwiseOpsKernelTest, UnaryForwardAndBackwardF32) {
    for (const UnaryFunction function : unary_functions) {
        SCOPED_TRACE(unary_name(function));
        const bool positive = function == UnaryFunction::log;
        const auto inp = random_floats(N, positive ? 0.01f : -6.0f, 6.0f), dout = random_floats(N);
        auto dinp = random_floats(N);
        std::vector<float> out(N);
        cpu::unary_forward(out.data(), inp.data(), N, function);
        const auto& saved = kernels::unary_backward_reads_output(function) ? out : inp;
        DeviceBuffer<float> inp_device(inp), saved_device(saved), dout_device(dout), out_device(nan_filled(N)),
            dinp_device(dinp);
        cpu::unary_backward(dinp.data(), dout.data(), saved.data(), N, function);
        gpu::unary_forward(out_device.get(), inp_device.get(), N, function, stream);
        gpu::unary_backward(dinp_device.get(), dout_device.get(), saved_device.get(), N, function, stream);
        EXPECT_TRUE(all_close(out_device.to_host(), out, unary_f32, "out"));
        EXPECT_TRUE(all_close(dinp_device.to_host(), dinp, unary_f32, "dinp"));
    }
}

TEST_F(PointwiseOpsKernelTest, UnaryForwardAndBackwardBf16) {
    for (const UnaryFunction function : unary_functions) {
        SCOPED_TRACE(unary_name(function));
        const bool positive = function == UnaryFunction::log;
        const auto inp = rounded(random_floats(N, positive ? 0.01f : -6.0f, 6.0f)), dout = rounded(random_floats(N));
        auto dinp = rounded(random_floats(N));
        std::vector<bfloat16> out(N);
        cpu::unary_forward(out.data(), inp.data(), N, function);
        const auto& saved = kernels::unary_backward_reads_output(function) ? out : inp;
        DeviceBuffer<bfloat16> inp_device(inp), saved_device(saved), dout_device(dout), out_device(N), dinp_device(dinp);
        cpu::unary_backward(dinp.data(), dout.data(), saved.data(), N, function);
        gpu::unary_forward(out_device.get(), inp_device.get(), N, function, stream);
        gpu::unary_backward(dinp_device.get(), dout_device.get(), saved_device.get(), N, function, stream);
        EXPECT_TRUE(all_close(widened(out_device.to_host()), widened(out), one_bf16_ulp, "out"));
        EXPECT_TRUE(all_close(widened(dinp_device.to_host()), widened(dinp), one_bf16_ulp, "dinp"));
    }
}

struct Layouts {
    std::vector<int64_t> a, b;
};
// Equal shapes (the packed path), a bias (thread path, long reduction), a row scale (warp path), a column
// scale, alternating broadcast of both, and rows longer than a warp's stride.
const Layouts layouts[] = {
    {{5, 37, 3}, {5, 37, 3}}, {{7, 33, 65}, {65}}, {{7, 33, 1}, {7, 33, 65}}, {{7, 1, 65}, {7, 33, 65}},
    {{3, 1, 9, 1}, {1, 5, 1, 70}}, {{2, 1}, {2, 1000}},
};
const BinaryFunction binary_functions[] = {BinaryFunction::add, BinaryFunction::subtract, BinaryFunction::multiply,
                                           BinaryFunction::divide};

std::vector<float> absolute(std::vector<float> values) {
    for (float& value : values) value = std::fabs(value);
    return values;
}

// The forward is one IEEE operation per element on both devices: bitwise. The backward sums each operand
// element's R = reduced_count terms (each the same f32 product on both devices): the CPU in double, rounded
// once; the device in f32 (sequentially or by lanes and a tree). Their difference is at most
// R·2^-24·Σ|term| from the device's sum, plus the rounding of the final += (2^-24·(|old| + Σ|term|)) on each.
// Σ|term| is the CPU kernel run on |dout|, |a|, |b|.
TEST_F(PointwiseOpsKernelTest, BinaryForwardBitwiseAndBackwardWithinTheSummationBound) {
    for (const Layouts& shapes : layouts) {
        bool compatible = false;
        const auto out_shape = kernels::broadcast_shape(shapes.a, shapes.b, compatible);
        ASSERT_TRUE(compatible);
        kernels::BroadcastLayout layout;
        ASSERT_TRUE(kernels::make_broadcast_layout(layout, out_shape, shapes.a, shapes.b));
        int64_t a_count = 1, b_count = 1;
        for (int64_t extent : shapes.a) a_count *= extent;
        for (int64_t extent : shapes.b) b_count *= extent;
        for (const BinaryFunction function : binary_functions) {
            SCOPED_TRACE("function " + std::to_string(int(function)) + ", layout of rank " + std::to_string(layout.rank));
            const auto a = random_floats(a_count);
            auto b = random_floats(b_count);
            if (function == BinaryFunction::divide)
                for (float& value : b) value = value < 0 ? value - 0.5f : value + 0.5f;
            const auto dout = random_floats(layout.count);
            std::vector<float> out(layout.count);
            cpu::binary_forward(out.data(), a.data(), b.data(), layout, function);
            DeviceBuffer<float> a_device(a), b_device(b), dout_device(dout), out_device(nan_filled(layout.count));
            gpu::binary_forward(out_device.get(), a_device.get(), b_device.get(), layout, function, stream);
            EXPECT_TRUE(all_close(out_device.to_host(), out, Tolerance{0.0, 0.0}, "out"));
            for (int which = 0; which < 2; ++which) {
                const kernels::GradientLayout gradient = kernels::make_gradient_layout(layout, which);
                const int64_t count = which == 0 ? a_count : b_count;
                auto doperand = random_floats(count);
                const auto before = doperand;
                DeviceBuffer<float> doperand_device(doperand);
                cpu::binary_backward(doperand.data(), dout.data(), a.data(), b.data(), gradient, function);
                gpu::binary_backward(doperand_device.get(), dout_device.get(), a_device.get(), b_device.get(), gradient,
                                     function, stream);
                std::vector<float> magnitude(count, 0.0f);
                const auto abs_a = absolute(a), abs_b = absolute(b), abs_dout = absolute(dout);
                cpu::binary_backward(magnitude.data(), abs_dout.data(), abs_a.data(), abs_b.data(), gradient, function);
                const auto actual = doperand_device.to_host();
                const double unit = std::ldexp(1.0, -24);
                for (int64_t j = 0; j < count; ++j) {
                    const double terms = std::fabs(magnitude[j]);
                    const double bound = double(gradient.reduced_count) * unit * terms +
                                         2.0 * unit * (std::fabs(before[j]) + terms);
                    ASSERT_LE(std::fabs(double(actual[j]) - doperand[j]), bound)
                        << "operand " << which << " element " << j << " of " << count << ", R " << gradient.reduced_count;
                }
            }
        }
    }
}

TEST_F(PointwiseOpsKernelTest, BinaryBf16MatchesTheCpuWithinOneUlp) {
    for (const Layouts& shapes : layouts) {
        bool compatible = false;
        const auto out_shape = kernels::broadcast_shape(shapes.a, shapes.b, compatible);
        kernels::BroadcastLayout layout;
        ASSERT_TRUE(kernels::make_broadcast_layout(layout, out_shape, shapes.a, shapes.b));
        int64_t a_count = 1, b_count = 1;
        for (int64_t extent : shapes.a) a_count *= extent;
        for (int64_t extent : shapes.b) b_count *= extent;
        const auto a = rounded(random_floats(a_count)), b = rounded(random_floats(b_count, 0.5f, 1.5f));
        const auto dout = rounded(random_floats(layout.count));
        for (const BinaryFunction function : binary_functions) {
            std::vector<bfloat16> out(layout.count);
            cpu::binary_forward(out.data(), a.data(), b.data(), layout, function);
            DeviceBuffer<bfloat16> a_device(a), b_device(b), dout_device(dout), out_device(layout.count);
            gpu::binary_forward(out_device.get(), a_device.get(), b_device.get(), layout, function, stream);
            EXPECT_TRUE(all_close(widened(out_device.to_host()), widened(out), Tolerance{0.0, 0.0}, "bf16 out"));
            // Only short sums here (R <= 70 of terms below 4 in size): the f32 sums differ by < 2^-15, far
            // below the bf16 ulp of the result, so at most the final rounding flips.
            for (int which = 0; which < 2; ++which) {
                const kernels::GradientLayout gradient = kernels::make_gradient_layout(layout, which);
                if (gradient.reduced_count > 100) continue;
                const int64_t count = which == 0 ? a_count : b_count;
                auto doperand = rounded(random_floats(count));
                DeviceBuffer<bfloat16> doperand_device(doperand);
                cpu::binary_backward(doperand.data(), dout.data(), a.data(), b.data(), gradient, function);
                gpu::binary_backward(doperand_device.get(), dout_device.get(), a_device.get(), b_device.get(), gradient,
                                     function, stream);
                EXPECT_TRUE(all_close(widened(doperand_device.to_host()), widened(doperand), Tolerance{1e-3, 0.0078125},
                                      "bf16 doperand"));
            }
        }
    }
}

// The multi-tensor AdamW with the step's epilogue on the device: bitwise the single-tensor kernel, the conversion
// kernel and a fill, range by range, on both pack paths and over two launches.
TEST_F(PointwiseOpsKernelTest, AdamwListIsBitwiseThePerRangeKernels) {
    std::mt19937_64 generator(20261207);
    testing::expect_adamw_list_matches_per_range_updates(Device::cuda, DType::f32, generator);
}

// The ops end to end on the device: silu(x + bias) * scale / (1 + sigmoid(x)) - tanh(x) + log(exp(x)) and a
// relu, summed, backward; the gradients of x (B,T,C), bias (C) and scale (B,T,1) against the CPU's. Each is a
// short composition of the kernels above (each within 1e-6 relative), so 1e-5 relative to the gradient's
// largest element bounds them.
TEST_F(PointwiseOpsKernelTest, OpsWithBackwardOnTheDeviceMatchTheCpu) {
    const int64_t B = 3, T = 17, C = 40;
    const auto x_values = random_floats(size_t(B * T * C)), bias_values = random_floats(size_t(C));
    const auto scale_values = random_floats(size_t(B * T));
    struct Run {
        float loss;
        std::vector<float> dx, dbias, dscale;
    };
    auto run = [&](Device device) {
        Tensor x = Tensor::from_vector<float>(x_values, {B, T, C}, Device::cpu).to(device);
        Tensor bias = Tensor::from_vector<float>(bias_values, {C}, Device::cpu).to(device);
        Tensor scale = Tensor::from_vector<float>(scale_values, {B, T, 1}, Device::cpu).to(device);
        for (Tensor* leaf : {&x, &bias, &scale}) leaf->set_requires_grad(true);
        const Tensor one = Tensor::full({1}, 1.0, DType::f32, device);
        Tensor y = div(mul(silu(add(x, bias)), scale), add(one, sigmoid(x)));
        y = add(sub(y, engine::tanh(x)), add(engine::log(engine::exp(x)), relu(x)));
        const Tensor loss = sum(y);
        backward(loss);
        return Run{loss.to(Device::cpu).to_vector<float>()[0], x.grad().to(Device::cpu).to_vector<float>(),
                   bias.grad().to(Device::cpu).to_vector<float>(), scale.grad().to(Device::cpu).to_vector<float>()};
    };
    const Run on_cpu = run(Device::cpu), on_cuda = run(Device::cuda);
    EXPECT_NEAR(on_cuda.loss, on_cpu.loss, 1e-5 * std::fabs(on_cpu.loss) + 1e-5);
    auto check = [](const std::vector<float>& actual, const std::vector<float>& expected, const char* what) {
        double largest = 0.0;
        for (float value : expected) largest = std::max(largest, double(std::fabs(value)));
        EXPECT_TRUE(all_close(actual, expected, Tolerance{1e-5 * largest, 0.0}, what));
    };
    check(on_cuda.dx, on_cpu.dx, "dx");
    check(on_cuda.dbias, on_cpu.dbias, "dbias");
    check(on_cuda.dscale, on_cpu.dscale, "dscale");
}

} // namespace
} // namespace engine::test
