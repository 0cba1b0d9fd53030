// CUDA vs CPU for the tensor-core attention kernels (kernels/cuda/attention_*.cu against
// kernels/cpu/attention_{forward,backward}.cpp): forward out and logsumexp, backward dqkv accumulated onto non-zero contents,
// in 3xTF32 (fp32-accurate) and TF32 mode, at sequence lengths and head sizes chosen to break tile
// assumptions: T = 1, 17 and 1000 (not multiples of the 128-row blocks or the 64- and 32-row tiles), head
// sizes 64, 128 and 256 (each a compiled maximum width; 256 also the 4-warp blocks and 32-row key tiles),
// 80, 24 and 50 (run-time widths below the compiled maximum; 50 also the scalar, non-float4 path).
#include <cstring>
#include <iostream>

#include "engine/cuda/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using AttentionKernelTest = CudaKernelTest;

struct Shape {
    int B, T, C, NH;
    std::string describe() const {
        return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " head_size=" + std::to_string(C / NH) +
               " NH=" + std::to_string(NH);
    }
};

struct Tolerances {
    Tolerance out, logsumexp, dqkv;
};

// 3xTF32 keeps about 22 of float's 24 significant bits per operand, so the kernels match fp32 loops: the
// bounds the naive kernels met before (fp32 accumulation in a different order than the CPU's double).
constexpr Tolerances fp32_tolerances{{1e-5, 1e-4}, {1e-5, 1e-5}, {5e-5, 5e-4}};

// TF32 keeps 11 significant bits: the kernels round each operand with a relative error uniform in +-u,
// u = 2^-11 ~ 4.9e-4 (rms u/sqrt(3)). Inputs are U(-1,1), so |q_i k_i| has rms 1/3 and a score q.k/sqrt(d)
// carries an error of rms u * sqrt(2/27) ~ 1.3e-4 whatever d; the largest of ~10^5 scores stays within 5 rms,
// 7e-4. That shifts each probability by the same relative amount and logsumexp by at most as much: atol
// 2e-3. out = sum_j P_ij v_j (|v| <= 1) adds P.V's own rounding, at most 2u relative, averaged over keys:
// atol 2e-3. The gradients sum dS q, dS k and P dout over up to T terms with the same relative errors and
// reach ~10 at T = 1000 (dv of key 0 sums every row's probability): atol 5e-3 and rtol 1e-2 (4u ~ 2e-3,
// 5x to spare). Measured maxima: 3e-4 (out), 2e-4 (logsumexp), 7e-4 (dqkv).
constexpr Tolerances tf32_tolerances{{2e-3, 1e-2}, {2e-3, 1e-3}, {5e-3, 1e-2}};

constexpr float accumulator_start = 0.01f;

struct Results {
    std::vector<float> out, logsumexp, dqkv;
};

// Runs the CUDA forward then backward (dqkv starting from `dqkv_start`) and copies the results back.
Results run_cuda(const Shape& shape, bool tf32, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const std::vector<float>& dqkv_start, cudaStream_t stream) {
    const auto [B, T, C, NH] = shape;
    DeviceBuffer<float> qkv_device(qkv), dout_device(dout), dqkv_device(dqkv_start);
    DeviceBuffer<float> out_device(nan_filled(size_t(B) * T * C));
    DeviceBuffer<float> logsumexp_device(nan_filled(size_t(B) * NH * T)), row_dot_workspace(size_t(B) * NH * T);
    gpu::attention_forward(out_device.get(), logsumexp_device.get(), qkv_device.get(), B, T, C, NH, tf32, stream);
    gpu::attention_backward(dqkv_device.get(), row_dot_workspace.get(), dout_device.get(), qkv_device.get(),
                            out_device.get(), logsumexp_device.get(), B, T, C, NH, tf32, stream);
    return Results{out_device.to_host(), logsumexp_device.to_host(), dqkv_device.to_host()};
}

void report(const ::testing::AssertionResult& result) {
    EXPECT_TRUE(result);
    if (result) std::cout << "[ accuracy ] " << result.message() << "\n";
}

void check_attention(AttentionKernelTest& test, const Shape& shape, bool tf32) {
    const auto [B, T, C, NH] = shape;
    const size_t tokens = size_t(B) * T;
    const auto qkv = test.random_floats(tokens * 3 * C), dout = test.random_floats(tokens * C);
    const auto dqkv_start = test.random_floats(tokens * 3 * C, -accumulator_start, accumulator_start);
    const Results cuda = run_cuda(shape, tf32, qkv, dout, dqkv_start, test.stream);

    std::vector<float> out(tokens * C), logsumexp(size_t(B) * NH * T), dqkv = dqkv_start;
    cpu::attention_forward(out.data(), logsumexp.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), B, T, C, NH);

    const Tolerances& tolerances = tf32 ? tf32_tolerances : fp32_tolerances;
    const std::string what = shape.describe() + (tf32 ? " tf32" : " fp32");
    report(all_close(cuda.out, out, tolerances.out, "attention out" + what));
    report(all_close(cuda.logsumexp, logsumexp, tolerances.logsumexp, "attention logsumexp" + what));
    report(all_close(cuda.dqkv, dqkv, tolerances.dqkv, "attention dqkv" + what));
}

void check_both_modes(AttentionKernelTest& test, const Shape& shape) {
    for (const bool tf32 : {false, true}) check_attention(test, shape, tf32);
}

// T = 1: a single row, one key, a tile that is almost all padding.
TEST_F(AttentionKernelTest, SingleToken) {
    check_both_modes(*this, Shape{2, 1, 128, 2});  // head size 64
    check_both_modes(*this, Shape{1, 1, 128, 1});  // 128
    check_both_modes(*this, Shape{2, 1, 240, 3});  // 80
}

// T = 17: one partial tile; every compiled and generic width, and the scalar path (head size 50).
TEST_F(AttentionKernelTest, PartialTileEveryHeadSize) {
    check_both_modes(*this, Shape{2, 17, 128, 2}); // 64
    check_both_modes(*this, Shape{1, 17, 256, 2}); // 128
    check_both_modes(*this, Shape{2, 17, 160, 2}); // 80
    check_both_modes(*this, Shape{2, 17, 72, 3});  // 24
    check_both_modes(*this, Shape{1, 17, 100, 2}); // 50: rows not 16-byte aligned, no float4
}

// Several tiles, the last one partial, and the largest head (32-row tiles, the most shared memory).
TEST_F(AttentionKernelTest, SeveralTiles) {
    check_both_modes(*this, Shape{2, 100, 160, 2}); // 80
    check_both_modes(*this, Shape{1, 70, 256, 1});  // 256
}

// T = 1000: 16 query tiles, diagonal and off-diagonal ones (B = NH = 1 keeps emulation to seconds).
TEST_F(AttentionKernelTest, LongSequenceHeadSize64) { check_both_modes(*this, Shape{1, 1000, 64, 1}); }
// Head size 128 over several tiles; T = 1000 here would take 25 s under every emulator schedule.
TEST_F(AttentionKernelTest, SeveralTilesHeadSize128) { check_both_modes(*this, Shape{1, 200, 128, 1}); }

// Two runs on the same inputs give the same bits (the emulator also replays each launch under five schedules).
TEST_F(AttentionKernelTest, Deterministic) {
    const Shape shape{2, 100, 160, 2};
    const size_t tokens = size_t(shape.B) * shape.T;
    const auto qkv = random_floats(tokens * 3 * shape.C), dout = random_floats(tokens * shape.C);
    const auto dqkv_start = random_floats(tokens * 3 * shape.C, -accumulator_start, accumulator_start);
    for (const bool tf32 : {false, true}) {
        const Results first = run_cuda(shape, tf32, qkv, dout, dqkv_start, stream);
        const Results second = run_cuda(shape, tf32, qkv, dout, dqkv_start, stream);
        const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same_bits(first.out, second.out)) << "out, tf32=" << tf32;
        EXPECT_TRUE(same_bits(first.logsumexp, second.logsumexp)) << "logsumexp, tf32=" << tf32;
        EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "dqkv, tf32=" << tf32;
    }
}

TEST_F(AttentionKernelTest, RejectsOversizedHeads) {
    const int C = 2 * (gpu::attention_max_head_size + 32);
    float* none = nullptr; // typed: the f32 and bf16 overloads both take pointers
    EXPECT_THROW(gpu::attention_forward(none, none, none, 1, 1, C, 2, false, stream), engine::EngineError);
    EXPECT_THROW(gpu::attention_backward(none, none, none, none, none, none, 1, 1, C, 2, true, stream),
                 engine::EngineError);
}

// Every head size up to the maximum fits sm_90's 227 KiB of shared memory per block.
TEST(AttentionSharedMemory, FitsSm90ForEveryHeadSize) {
    constexpr size_t sm90_limit = 227 * 1024;
    for (int head_size = 1; head_size <= gpu::attention_max_head_size; ++head_size) {
        EXPECT_LE(gpu::attention_forward_shared_bytes(head_size), sm90_limit) << "head size " << head_size;
        EXPECT_LE(gpu::attention_backward_shared_bytes(head_size), sm90_limit) << "head size " << head_size;
    }
    for (const int head_size : {64, 80, 128, 256}) {
        std::cout << "[ shared   ] head size " << head_size << ": forward "
                  << gpu::attention_forward_shared_bytes(head_size) << " bytes, backward "
                  << gpu::attention_backward_shared_bytes(head_size) << " bytes\n";
    }
}

} // namespace
} // namespace engine::test
