// CUDA vs CPU for the tensor-core attention kernels (kernels/cuda/attention_*.cu against
// kernels/cpu/attention_{forward,backward}.cpp): forward out and logsumexp, backward dqkv accumulated onto non-zero contents,
// in 3xTF32 (fp32-accurate) and TF32 mode, at sequence lengths and head sizes chosen to break tile
// assumptions: T = 1, 17 and 1000 (not multiples of the 128-row blocks or the 64- and 32-row tiles), head
// sizes 64, 128 and 256 (each a compiled maximum width; 256 also the 4-warp blocks and 32-row key tiles),
// 80, 24 and 50 (run-time widths below the compiled maximum; 50 also the scalar, non-float4 path); then
// grouped-query attention (KVH < NH: the key/value pass sums several query heads per kv head) at the same.
#include <cstring>
#include <iostream>

#include "engine/cuda/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"
#include "tests/expect_error.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;
using engine::testing::expect_error;

using AttentionKernelTest = CudaKernelTest;

struct Shape {
    int B, T, C, NH, KVH = 0; // KVH 0: NH (multi-head)
    int kv_heads() const { return KVH == 0 ? NH : KVH; }
    size_t qkv_width() const { return size_t(C) + 2 * size_t(kv_heads()) * (C / NH); } // of each (B,T,.) row
    std::string describe() const {
        return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " head_size=" + std::to_string(C / NH) +
               " NH=" + std::to_string(NH) + " KVH=" + std::to_string(kv_heads());
    }
};

struct Tolerances {
    Tolerance out, logsumexp, dqkv;
};

// 3xTF32 keeps about 22 of float's 24 significant bits per operand, so the kernels match fp32 loops: the
// bounds the naive kernels met before against a CPU reference that accumulated in double; the CPU's f32 kernel now
// sums in float through sgemm (kernels/cpu/attention_panels.h), whose own error is of order 1e-7 to 1e-6 relative at
// such shapes (tests/test_attention_f32.cpp), two orders of magnitude inside these bounds.
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
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads();
    DeviceBuffer<float> qkv_device(qkv), dout_device(dout), dqkv_device(dqkv_start);
    DeviceBuffer<float> out_device(nan_filled(size_t(B) * T * C));
    DeviceBuffer<float> logsumexp_device(nan_filled(size_t(B) * NH * T)), row_dot_workspace(size_t(B) * NH * T);
    gpu::attention_forward(out_device.get(), logsumexp_device.get(), qkv_device.get(), B, T, C, NH, KVH, tf32,
                           stream);
    gpu::attention_backward(dqkv_device.get(), row_dot_workspace.get(), dout_device.get(), qkv_device.get(),
                            out_device.get(), logsumexp_device.get(), B, T, C, NH, KVH, tf32, stream);
    return Results{out_device.to_host(), logsumexp_device.to_host(), dqkv_device.to_host()};
}

void report(const ::testing::AssertionResult& result) {
    EXPECT_TRUE(result);
    if (result) std::cout << "[ accuracy ] " << result.message() << "\n";
}

void check_attention(AttentionKernelTest& test, const Shape& shape, bool tf32) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads();
    const size_t tokens = size_t(B) * T;
    const auto qkv = test.random_floats(tokens * shape.qkv_width()), dout = test.random_floats(tokens * C);
    const auto dqkv_start = test.random_floats(tokens * shape.qkv_width(), -accumulator_start, accumulator_start);
    const Results cuda = run_cuda(shape, tf32, qkv, dout, dqkv_start, test.stream);

    std::vector<float> out(tokens * C), logsumexp(size_t(B) * NH * T), dqkv = dqkv_start;
    cpu::attention_forward(out.data(), logsumexp.data(), qkv.data(), B, T, C, NH, KVH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), B, T, C, NH, KVH);

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

// Grouped-query attention. The CPU sums dK/dV of a kv head over its query heads term by term in f32 (query
// heads ascending, rounded per term), the kernels in f32 accumulators (query heads ascending): with G heads
// the sums have G times the terms, still well inside the fp32/tf32 bounds above (derived for T = 1000 terms).
// T = 17: one partial tile, head sizes 64 and 128, and 50 (the scalar path); G = 2, 3 and 6.
TEST_F(AttentionKernelTest, GroupedQueryPartialTile) {
    check_both_modes(*this, Shape{2, 17, 256, 4, 2}); // head size 64, G = 2
    check_both_modes(*this, Shape{1, 17, 256, 2, 1}); // 128, G = 2
    check_both_modes(*this, Shape{1, 17, 384, 6, 1}); // 64, G = 6: one kv head for all
    check_both_modes(*this, Shape{2, 17, 300, 6, 2}); // 50, G = 3: rows not 16-byte aligned, no float4
}

// Several tiles (T not a multiple of 32, 64 or 128), T = 1 and the widest head (two column passes per kv head).
TEST_F(AttentionKernelTest, GroupedQuerySeveralTiles) {
    check_both_modes(*this, Shape{1, 1, 256, 4, 1});   // 64: one row
    check_both_modes(*this, Shape{1, 150, 256, 4, 2}); // 64
    check_both_modes(*this, Shape{1, 100, 256, 2, 1}); // 128
    check_both_modes(*this, Shape{1, 40, 512, 2, 1});  // 256
}

// Two runs on the same inputs give the same bits (the emulator also replays each launch under five schedules),
// with multi-head and with grouped-query attention.
TEST_F(AttentionKernelTest, Deterministic) {
    for (const Shape& shape : {Shape{2, 100, 160, 2}, Shape{1, 100, 256, 4, 1}}) {
        const size_t tokens = size_t(shape.B) * shape.T;
        const auto qkv = random_floats(tokens * shape.qkv_width()), dout = random_floats(tokens * shape.C);
        const auto dqkv_start = random_floats(tokens * shape.qkv_width(), -accumulator_start, accumulator_start);
        for (const bool tf32 : {false, true}) {
            const Results first = run_cuda(shape, tf32, qkv, dout, dqkv_start, stream);
            const Results second = run_cuda(shape, tf32, qkv, dout, dqkv_start, stream);
            const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
                return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
            };
            EXPECT_TRUE(same_bits(first.out, second.out)) << "out, tf32=" << tf32;
            EXPECT_TRUE(same_bits(first.logsumexp, second.logsumexp)) << "logsumexp, tf32=" << tf32;
            EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "dqkv, tf32=" << tf32 << shape.describe();
        }
    }
}

TEST_F(AttentionKernelTest, RejectsOversizedHeads) {
    const int C = 2 * (gpu::attention_max_head_size + 32);
    float* none = nullptr; // typed: the f32 and bf16 overloads both take pointers
    EXPECT_THROW(gpu::attention_forward(none, none, none, 1, 1, C, 2, 2, false, stream), engine::EngineError);
    EXPECT_THROW(gpu::attention_backward(none, none, none, none, none, none, 1, 1, C, 2, 2, true, stream),
                 engine::EngineError);
}

// KVH must divide NH (and be positive): the launchers refuse before touching memory.
TEST_F(AttentionKernelTest, RejectsKvHeadsNotDividingHeads) {
    float* none = nullptr;
    for (const int kv_heads : {3, 0}) {
        expect_error([&] { gpu::attention_forward(none, none, none, 1, 1, 256, 4, kv_heads, false, stream); },
                     {"attention", "NH=4", "KVH=" + std::to_string(kv_heads)});
        expect_error([&] {
            gpu::attention_backward(none, none, none, none, none, none, 1, 1, 256, 4, kv_heads, false, stream);
        }, {"attention", "NH=4", "KVH=" + std::to_string(kv_heads)});
    }
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
