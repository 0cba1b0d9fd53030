// CUDA vs CPU for the tensor-core attention kernels (kernels/cuda/attention_*.cu against
// kernels/cpu/attention_{forward,backward}.cpp): forward out and logsumexp, backward dqkv accumulated onto non-zero contents,
// in 3xTF32 (fp32-accurate) and TF32 mode, at sequence lengths and head sizes chosen to break tile
// assumptions: T = 1, 17 and 1000 (not multiples of the 128-row blocks or the 64- and 32-row tiles), head
// sizes 64, 128 and 256 (each a compiled maximum width; 256 also the 4-warp blocks and 32-row key tiles),
// 80, 24 and 50 (run-time widths below the compiled maximum; 50 also the scalar, non-float4 path); then
// grouped-query attention (KVH < NH: the key/value pass sums several query heads per kv head) at the same; then
// packed documents (positions), whose boundaries fall inside and on the edges of the tiles.
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

// Packed documents: the lengths of each batch row's documents, in order, summing to T; none: plain causal.
using Documents = std::vector<std::vector<int>>;

// The (B,T) positions of `documents` (0, 1, ... inside each document), or empty for none.
std::vector<int32_t> document_positions(const Documents& documents, const Shape& shape) {
    if (documents.empty()) return {};
    EXPECT_EQ(documents.size(), size_t(shape.B));
    std::vector<int32_t> positions;
    for (const std::vector<int>& row : documents) {
        for (const int length : row) {
            for (int position = 0; position < length; ++position) positions.push_back(position);
        }
        EXPECT_EQ(positions.size() % shape.T, 0u) << "documents of a row must sum to T=" << shape.T;
    }
    EXPECT_EQ(positions.size(), size_t(shape.B) * shape.T);
    return positions;
}

// Runs the CUDA forward then backward (dqkv starting from `dqkv_start`) and copies the results back. `positions`
// empty: null positions.
Results run_cuda(const Shape& shape, bool tf32, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const std::vector<float>& dqkv_start, const std::vector<int32_t>& positions, cudaStream_t stream) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads();
    DeviceBuffer<float> qkv_device(qkv), dout_device(dout), dqkv_device(dqkv_start);
    DeviceBuffer<float> out_device(nan_filled(size_t(B) * T * C));
    DeviceBuffer<float> logsumexp_device(nan_filled(size_t(B) * NH * T)), row_dot_workspace(size_t(B) * NH * T);
    DeviceBuffer<int32_t> positions_device(positions.empty() ? std::vector<int32_t>(1) : positions);
    const int32_t* device_positions = positions.empty() ? nullptr : positions_device.get();
    gpu::attention_forward(out_device.get(), logsumexp_device.get(), qkv_device.get(), device_positions, B, T, C, NH,
                           KVH, tf32, stream);
    gpu::attention_backward(dqkv_device.get(), row_dot_workspace.get(), dout_device.get(), qkv_device.get(),
                            out_device.get(), logsumexp_device.get(), device_positions, B, T, C, NH, KVH, tf32, stream);
    return Results{out_device.to_host(), logsumexp_device.to_host(), dqkv_device.to_host()};
}

void report(const ::testing::AssertionResult& result) {
    EXPECT_TRUE(result);
    if (result) std::cout << "[ accuracy ] " << result.message() << "\n";
}

void check_attention(AttentionKernelTest& test, const Shape& shape, bool tf32, const Documents& documents = {}) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, KVH = shape.kv_heads();
    const size_t tokens = size_t(B) * T;
    const auto qkv = test.random_floats(tokens * shape.qkv_width()), dout = test.random_floats(tokens * C);
    const auto dqkv_start = test.random_floats(tokens * shape.qkv_width(), -accumulator_start, accumulator_start);
    const std::vector<int32_t> positions = document_positions(documents, shape);
    const Results cuda = run_cuda(shape, tf32, qkv, dout, dqkv_start, positions, test.stream);

    std::vector<float> out(tokens * C), logsumexp(size_t(B) * NH * T), dqkv = dqkv_start;
    const int32_t* host_positions = positions.empty() ? nullptr : positions.data();
    cpu::attention_forward(out.data(), logsumexp.data(), qkv.data(), host_positions, B, T, C, NH, KVH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), logsumexp.data(), host_positions, B, T, C,
                            NH, KVH);

    const Tolerances& tolerances = tf32 ? tf32_tolerances : fp32_tolerances;
    const std::string what = shape.describe() + (documents.empty() ? "" : " documents") + (tf32 ? " tf32" : " fp32");
    report(all_close(cuda.out, out, tolerances.out, "attention out" + what));
    report(all_close(cuda.logsumexp, logsumexp, tolerances.logsumexp, "attention logsumexp" + what));
    report(all_close(cuda.dqkv, dqkv, tolerances.dqkv, "attention dqkv" + what));
}

void check_both_modes(AttentionKernelTest& test, const Shape& shape, const Documents& documents = {}) {
    for (const bool tf32 : {false, true}) check_attention(test, shape, tf32, documents);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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
            const Results first = run_cuda(shape, tf32, qkv, dout, dqkv_start, {}, stream);
            const Results second = run_cuda(shape, tf32, qkv, dout, dqkv_start, {}, stream);
            EXPECT_TRUE(same_bits(first.out, second.out)) << "out, tf32=" << tf32;
            EXPECT_TRUE(same_bits(first.logsumexp, second.logsumexp)) << "logsumexp, tf32=" << tf32;
            EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "dqkv, tf32=" << tf32 << shape.describe();
        }
    }
}

// Packed documents (positions): each query sees its own document's keys only. The forward's blocks are 128 rows
// (64 at head size 256) streaming 64-key tiles (32), the backward's 64 keys against 32-query steps and 64 queries
// against 32-key steps: T = 300 is no multiple of any; the documents start mid-tile (41, 131, 231), on tile
// edges (64), span several tiles and blocks (150 rows from 65: the query block at 128 starts at key tile 64, and
// the key block at 64 meets queries up to 214), and are one token long (the first row, and token 64 of row 1).
TEST_F(AttentionKernelTest, DocumentsHeadSize64) {
    check_both_modes(*this, Shape{2, 300, 128, 2}, Documents{{1, 40, 90, 100, 69}, {64, 1, 150, 85}});
}

// The other compiled and run-time widths with documents: 128, 256 (32-key tiles, 64-row blocks, two dK/dV
// column passes), 80 (a row of one document beside one of several), 50 (the scalar path) and 24.
TEST_F(AttentionKernelTest, DocumentsEveryHeadSize) {
    check_both_modes(*this, Shape{1, 150, 256, 2}, Documents{{70, 1, 79}});            // 128
    check_both_modes(*this, Shape{1, 100, 512, 2}, Documents{{33, 40, 1, 26}});        // 256
    check_both_modes(*this, Shape{2, 130, 160, 2}, Documents{{130}, {17, 1, 1, 111}}); // 80
    check_both_modes(*this, Shape{1, 90, 100, 2}, Documents{{45, 45}});                // 50: no float4
    check_both_modes(*this, Shape{2, 70, 72, 3}, Documents{{3, 64, 3}, {32, 32, 6}});  // 24
}

// Grouped-query attention with documents: the key/value pass sums the group's query heads over each key's
// document only. Head sizes 64 (G = 2 and 6) and 256 (G = 2, two column passes).
TEST_F(AttentionKernelTest, GroupedQueryDocuments) {
    check_both_modes(*this, Shape{2, 150, 256, 4, 2}, Documents{{1, 1, 70, 78}, {100, 50}}); // 64, G = 2
    check_both_modes(*this, Shape{1, 80, 384, 6, 1}, Documents{{16, 16, 48}});               // 64, G = 6
    check_both_modes(*this, Shape{1, 100, 512, 2, 1}, Documents{{10, 60, 30}});              // 256, G = 2
}

// Every token its own document (all positions 0): each query sees itself alone, every block starts at its own
// diagonal tile, and most tiles of every warp are skipped.
TEST_F(AttentionKernelTest, EveryTokenItsOwnDocument) {
    check_both_modes(*this, Shape{1, 70, 128, 2}, Documents{std::vector<int>(70, 1)});
}

// One document per row given as positions 0..T-1 is plain causal attention: the kernels give null positions' bits.
TEST_F(AttentionKernelTest, OneDocumentPerRowIsCausalBitwise) {
    for (const Shape& shape : {Shape{2, 100, 160, 2}, Shape{1, 100, 256, 4, 1}}) {
        const size_t tokens = size_t(shape.B) * shape.T;
        const auto qkv = random_floats(tokens * shape.qkv_width()), dout = random_floats(tokens * shape.C);
        const auto dqkv_start = random_floats(tokens * shape.qkv_width(), -accumulator_start, accumulator_start);
        const auto positions = document_positions(Documents(shape.B, std::vector<int>{shape.T}), shape);
        for (const bool tf32 : {false, true}) {
            const Results causal = run_cuda(shape, tf32, qkv, dout, dqkv_start, {}, stream);
            const Results documents = run_cuda(shape, tf32, qkv, dout, dqkv_start, positions, stream);
            EXPECT_TRUE(same_bits(causal.out, documents.out)) << "out, tf32=" << tf32 << shape.describe();
            EXPECT_TRUE(same_bits(causal.logsumexp, documents.logsumexp)) << "logsumexp, tf32=" << tf32;
            EXPECT_TRUE(same_bits(causal.dqkv, documents.dqkv)) << "dqkv, tf32=" << tf32 << shape.describe();
        }
    }
}

// Documents give the same bits run to run too (the emulator replays each launch under five schedules).
TEST_F(AttentionKernelTest, DocumentsDeterministic) {
    const Shape shape{2, 150, 256, 4, 2};
    const auto positions = document_positions(Documents{{1, 1, 70, 78}, {100, 50}}, shape);
    const size_t tokens = size_t(shape.B) * shape.T;
    const auto qkv = random_floats(tokens * shape.qkv_width()), dout = random_floats(tokens * shape.C);
    const auto dqkv_start = random_floats(tokens * shape.qkv_width(), -accumulator_start, accumulator_start);
    for (const bool tf32 : {false, true}) {
        const Results first = run_cuda(shape, tf32, qkv, dout, dqkv_start, positions, stream);
        const Results second = run_cuda(shape, tf32, qkv, dout, dqkv_start, positions, stream);
        EXPECT_TRUE(same_bits(first.out, second.out)) << "out, tf32=" << tf32;
        EXPECT_TRUE(same_bits(first.logsumexp, second.logsumexp)) << "logsumexp, tf32=" << tf32;
        EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "dqkv, tf32=" << tf32;
    }
}

TEST_F(AttentionKernelTest, RejectsOversizedHeads) {
    const int C = 2 * (gpu::attention_max_head_size + 32);
    float* none = nullptr; // typed: the f32 and bf16 overloads both take pointers
    EXPECT_THROW(gpu::attention_forward(none, none, none, nullptr, 1, 1, C, 2, 2, false, stream), engine::EngineError);
    EXPECT_THROW(gpu::attention_backward(none, none, none, none, none, none, nullptr, 1, 1, C, 2, 2, true, stream),
                 engine::EngineError);
}

// KVH must divide NH (and be positive): the launchers refuse before touching memory.
TEST_F(AttentionKernelTest, RejectsKvHeadsNotDividingHeads) {
    float* none = nullptr;
    for (const int kv_heads : {3, 0}) {
        expect_error([&] { gpu::attention_forward(none, none, none, nullptr, 1, 1, 256, 4, kv_heads, false, stream); },
                     {"attention", "NH=4", "KVH=" + std::to_string(kv_heads)});
        expect_error(
            [&] {
                gpu::attention_backward(none, none, none, none, none, none, nullptr, 1, 1, 256, 4, kv_heads, false,
                                        stream);
            },
            {"attention", "NH=4", "KVH=" + std::to_string(kv_heads)});
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
