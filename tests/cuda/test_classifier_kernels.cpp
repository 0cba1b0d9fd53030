// CUDA vs CPU for the fused classifier (cross_entropy_fused_forward, cross_entropy_fused_rescale), the
// padded vocabulary's first_columns, and the ops on the device: a vocabulary that is no multiple of the
// block (1000 + 3, like GPT-2's 50257), padded rows (the 128-bit path), ignored rows, the rescale's early exit;
// and the streaming LM head (linear_cross_entropy) against the CPU and against the whole logits.
#include "engine/engine.h"
#include "nn/gpt.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using ClassifierKernelTest = CudaKernelTest;

constexpr int ignore_index = -100;

// Rows with ignore_index at both ends and in the middle; the padding starts as NaN on both sides, so an
// unwritten padded element fails the comparison.
void check_fused_forward(ClassifierKernelTest& test, int N, int V, int padded_V) {
    auto logits = nan_filled(size_t(N) * padded_V);
    const auto values = test.random_floats(size_t(N) * V, -8.0f, 8.0f);
    for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) logits[size_t(n) * padded_V + v] = values[size_t(n) * V + v];
    auto targets = test.random_ints(N, 0, V - 1);
    targets[0] = targets[N / 2] = targets[N - 1] = ignore_index;
    targets[1] = V - 1; // the last class, in the tail beyond the last full block of columns
    const float dloss = 1.0f / 4093.0f; // a trainer-like 1 / num_items_in_batch
    DeviceBuffer<float> logits_device(logits), losses_device(nan_filled(N));
    DeviceBuffer<int32_t> targets_device(targets);
    std::vector<float> losses(N);
    cpu::cross_entropy_fused_forward(losses.data(), logits.data(), targets.data(), dloss, N, V, padded_V, ignore_index);
    gpu::cross_entropy_fused_forward(losses_device.get(), logits_device.get(), targets_device.get(), dloss, N, V,
                                     padded_V, ignore_index, test.stream);
    const std::string size = " N=" + std::to_string(N) + " V=" + std::to_string(V) + " padded_V=" + std::to_string(padded_V);
    EXPECT_TRUE(all_close(losses_device.to_host(), losses, Tolerance{1e-5, 1e-5}, "fused losses" + size));
    // Gradients are about dloss · probability; atol is relative to dloss.
    EXPECT_TRUE(all_close(logits_device.to_host(), logits, Tolerance{2e-6 * dloss, 1e-5}, "fused dlogits" + size));
}

TEST_F(ClassifierKernelTest, FusedForwardVocabularyNotABlockMultiple) { check_fused_forward(*this, 9, 1003, 1003); }

// padded_V a multiple of 4 takes the 128-bit path; 1003 real columns leave 1 padded column per 1004-wide row.
TEST_F(ClassifierKernelTest, FusedForwardPaddedRowsTakeTheVectorPath) {
    check_fused_forward(*this, 7, 1003, 1004);
    check_fused_forward(*this, 5, 1000, 1024); // every column of a chunk real, then whole padded chunks
}

// The fused gradient matches the plain backward's for the same dloss (CPU twin of each compared too).
TEST_F(ClassifierKernelTest, FusedGradientMatchesPlainBackward) {
    constexpr int N = 6, V = 1003;
    const auto logits = random_floats(size_t(N) * V, -8.0f, 8.0f);
    auto targets = random_ints(N, 0, V - 1);
    targets[3] = ignore_index;
    const float dloss = 0.125f;
    DeviceBuffer<float> fused_device(logits), plain_device(std::vector<float>(size_t(N) * V, 0.0f)), losses(N);
    DeviceBuffer<float> logits_device(logits), dlosses_device(std::vector<float>(N, dloss));
    DeviceBuffer<int32_t> targets_device(targets);
    gpu::cross_entropy_fused_forward(losses.get(), fused_device.get(), targets_device.get(), dloss, N, V, V,
                                     ignore_index, stream);
    gpu::cross_entropy_backward(plain_device.get(), dlosses_device.get(), logits_device.get(), targets_device.get(), N,
                                V, ignore_index, stream);
    EXPECT_TRUE(all_close(fused_device.to_host(), plain_device.to_host(), Tolerance{1e-8, 1e-5}, "fused vs plain"));
}

TEST_F(ClassifierKernelTest, RescaleMultipliesOnlyWhenTheRatioIsNotOne) {
    constexpr int64_t count = 3 * 1003;
    const auto gradient = random_floats(count);
    for (const float dout : {0.5f, 0.37f}) {
        auto expected = gradient;
        DeviceBuffer<float> gradient_device(gradient), dout_device(std::vector<float>{dout});
        cpu::cross_entropy_fused_rescale(expected.data(), &dout, 0.5f, count);
        gpu::cross_entropy_fused_rescale(gradient_device.get(), dout_device.get(), 0.5f, count, stream);
        EXPECT_TRUE(all_close(gradient_device.to_host(), expected, Tolerance{0.0, 0.0},
                              "rescale dout=" + std::to_string(dout)));
        if (dout == 0.5f) EXPECT_EQ(expected, gradient); // ratio 1: untouched
    }
}

// The op on the device against the op on the CPU: the gradient reaching the LM head's inputs, with an
// unexpected upstream gradient (rescale) and the expected one (hand-over only).
TEST_F(ClassifierKernelTest, InPlaceOpOnDeviceMatchesCpu) {
    constexpr int B = 2, T = 5, C = 8, V = 1003;
    const auto x_values = random_floats(size_t(B) * T * C), w_values = random_floats(size_t(V) * C);
    auto labels = random_ints(B * T, 0, V - 1);
    labels[4] = ignore_index;
    for (const double upstream : {1.0 / 9.0, 0.3}) {
        std::vector<std::vector<float>> dx, dw;
        for (const Device device : {Device::cpu, Device::cuda}) {
            current_tape().clear();
            Tensor x = Tensor::from_vector(x_values, {B, T, C}, Device::cpu).to(device, MemoryCategory::parameters);
            Tensor w = Tensor::from_vector(w_values, {V, C}, Device::cpu).to(device, MemoryCategory::parameters);
            x.set_requires_grad(true);
            w.set_requires_grad(true);
            const Tensor targets = Tensor::from_vector(labels, {B, T}, Device::cpu).to_keeping_host_copy(device);
            Tensor loss;
            {
                const Tensor logits = matmul(x, w, true);
                loss = multiply(cross_entropy_in_place(logits, targets, Reduction::sum, 1.0 / 9.0), upstream);
            }
            backward(loss);
            dx.push_back(x.grad().to_vector<float>());
            dw.push_back(w.grad().to_vector<float>());
        }
        const std::string what = " upstream " + std::to_string(upstream);
        EXPECT_TRUE(all_close(dx[1], dx[0], Tolerance{1e-6, 1e-4}, "dx" + what));
        EXPECT_TRUE(all_close(dw[1], dw[0], Tolerance{1e-6, 1e-4}, "dw" + what));
    }
}

// The padded vocabulary's column copy and its backward (+= into the first count columns only).
TEST_F(ClassifierKernelTest, FirstColumnsForwardAndBackward) {
    constexpr int64_t N = 37;
    constexpr int columns = 1024, count = 1003;
    const auto input = random_floats(size_t(N) * columns), dout = random_floats(size_t(N) * count);
    auto dinput = random_floats(size_t(N) * columns, -0.01f, 0.01f);
    std::vector<float> out(size_t(N) * count);
    DeviceBuffer<float> input_device(input), out_device(nan_filled(out.size())), dout_device(dout);
    DeviceBuffer<float> dinput_device(dinput);
    cpu::first_columns_forward(out.data(), input.data(), N, columns, count);
    cpu::first_columns_backward(dinput.data(), dout.data(), N, columns, count);
    gpu::first_columns_forward(out_device.get(), input_device.get(), N, columns, count, stream);
    gpu::first_columns_backward(dinput_device.get(), dout_device.get(), N, columns, count, stream);
    EXPECT_TRUE(all_close(out_device.to_host(), out, Tolerance{0.0, 0.0}, "first_columns out"));
    EXPECT_TRUE(all_close(dinput_device.to_host(), dinput, Tolerance{0.0, 0.0}, "first_columns dinput"));
}

// A padded GPT on the device: the trainer's loss path (padded logits, fused loss with vocabulary V) gives the
// CPU's gradients, and the padding rows of wte's gradient stay zero.
TEST_F(ClassifierKernelTest, PaddedGptLossPathMatchesCpu) {
    const nn::GPTConfig config{1003, 8, 1, 2, 16, 0.0f}; // Vp = 1024: the 128-bit path
    const auto token_values = random_ints(2 * 8, 0, 1002);
    auto label_values = random_ints(2 * 8, 0, 1002);
    label_values[5] = ignore_index;
    std::vector<std::vector<float>> gradients;
    for (const Device device : {Device::cpu, Device::cuda}) {
        current_tape().clear();
        nn::GPT model(config, 21, device, DType::f32);
        const Tensor tokens = Tensor::from_vector(token_values, {2, 8}, Device::cpu).to_keeping_host_copy(device);
        const Tensor targets = Tensor::from_vector(label_values, {2, 8}, Device::cpu).to_keeping_host_copy(device);
        Tensor loss;
        {
            const Tensor logits = model.forward_padded(tokens); // (2,8,1024)
            loss = multiply(cross_entropy_in_place(logits, targets, Reduction::sum, 1.0 / 15.0, ignore_index, 1003),
                            1.0 / 15.0);
        }
        backward(loss);
        gradients.push_back(model.wte.padded_weight.grad().to_vector<float>());
    }
    const std::vector<float> padding(gradients[1].begin() + 1003 * 16, gradients[1].end());
    EXPECT_EQ(padding, std::vector<float>(padding.size(), 0.0f));
    EXPECT_TRUE(all_close(gradients[1], gradients[0], Tolerance{1e-6, 1e-4}, "padded wte gradient"));
}

// The streaming LM head (linear_cross_entropy) on the device: chunks of 5 of 33 rows (the last shorter), a
// vocabulary of 1003 padded to 1024 zero rows, ignored rows, f32 and bf16. Against the CPU's same op within the
// GEMMs' rounding; one chunk of every row bitwise the device's fused classifier over matmul's whole logits;
// chunked runs repeat bitwise; an upstream gradient other than the promised one is corrected.
TEST_F(ClassifierKernelTest, StreamingHeadOnDeviceMatchesCpuAndTheWholeLogits) {
    constexpr int B = 3, T = 11, C = 24, V = 1003, padded_V = 1024;
    const auto x_values = random_floats(size_t(B) * T * C);
    auto w_values = random_floats(size_t(padded_V) * C);
    std::fill(w_values.begin() + size_t(V) * C, w_values.end(), 0.0f);
    auto labels = random_ints(B * T, 0, V - 1);
    labels[0] = labels[17] = labels[B * T - 1] = ignore_index;
    struct Result {
        std::vector<float> loss, dx, dw;
    };
    for (const DType dtype : {DType::f32, DType::bf16}) {
        const auto run = [&](Device device, int chunk, double upstream) {
            current_tape().clear();
            const auto leaf = [&](const std::vector<float>& values, const engine::Shape& shape) {
                Tensor converted = cast(Tensor::from_vector(values, shape, Device::cpu), dtype).to(device, MemoryCategory::parameters);
                converted.set_requires_grad(true);
                return converted;
            };
            Tensor x = leaf(x_values, {B, T, C}), w = leaf(w_values, {padded_V, C});
            const Tensor targets = Tensor::from_vector(labels, {B, T}, Device::cpu).to_keeping_host_copy(device);
            const double factor = 1.0 / 29.0;
            Tensor loss;
            {
                const Tensor head = chunk == 0 ? cross_entropy_in_place(matmul(x, w, true), targets, Reduction::sum,
                                                                        factor, ignore_index, V)
                                               : linear_cross_entropy(x, w, targets, Reduction::sum, chunk, factor,
                                                                      ignore_index, V);
                loss = multiply(head, upstream);
            }
            Result result{cast(loss, DType::f32).to_vector<float>(), {}, {}};
            backward(loss);
            result.dx = cast(x.grad(), DType::f32).to_vector<float>();
            result.dw = cast(w.grad(), DType::f32).to_vector<float>();
            return result;
        };
        const double factor = 1.0 / 29.0;
        const std::string what = std::string(" ") + dtype_name(dtype);
        const Result whole = run(Device::cuda, 0, factor), one_chunk = run(Device::cuda, B * T, factor);
        EXPECT_EQ(one_chunk.loss, whole.loss) << what;
        EXPECT_EQ(one_chunk.dx, whole.dx) << what;
        EXPECT_EQ(one_chunk.dw, whole.dw) << what;
        const Result device = run(Device::cuda, 5, factor), host = run(Device::cpu, 5, factor);
        // bf16: the logits and d(logits) are rounded to 8 bits on each side, at different points of the GEMMs.
        const Tolerance tolerance = dtype == DType::bf16 ? Tolerance{2e-3, 2e-2} : Tolerance{1e-6, 1e-4};
        EXPECT_TRUE(all_close(device.loss, host.loss, tolerance, "loss" + what));
        EXPECT_TRUE(all_close(device.dx, host.dx, tolerance, "dx" + what));
        EXPECT_TRUE(all_close(device.dw, host.dw, tolerance, "dw" + what));
        const Result again = run(Device::cuda, 5, factor);
        EXPECT_EQ(again.dw, device.dw) << what;
        EXPECT_EQ(again.dx, device.dx) << what;
        const Result corrected = run(Device::cuda, 5, 0.3), expected = run(Device::cuda, 0, 0.3);
        EXPECT_TRUE(all_close(corrected.dx, expected.dx, tolerance, "dx, upstream 0.3" + what));
        EXPECT_TRUE(all_close(corrected.dw, expected.dw, tolerance, "dw, upstream 0.3" + what));
    }
}

} // namespace
} // namespace engine::test
