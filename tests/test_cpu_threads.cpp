// The threaded CPU kernels give bitwise the same results with 1, 2 and 5 OpenMP threads: every kernel that uses
// kernels/cpu/parallel.h, and whole GPT-2 and Llama training steps (forward, loss, backward, clip, AdamW).
#include <gtest/gtest.h>

#include <omp.h>

#include "kernels/cpu/parallel.h"
#include "tests/thread_kernels.h"

namespace {

using namespace engine;
using namespace engine::test::threads;
namespace k = engine::kernels::cpu;

// Runs `produce` under each thread count and returns its outputs, restoring the caller's thread count.
template <typename Produce>
std::vector<Outputs> under_thread_counts(Produce&& produce, std::initializer_list<int> counts) {
    const int original = omp_get_max_threads();
    std::vector<Outputs> results;
    for (int count : counts) {
        omp_set_num_threads(count);
        results.push_back(produce());
    }
    omp_set_num_threads(original);
    return results;
}

void expect_bitwise_equal(const std::vector<Outputs>& results) {
    ASSERT_GE(results.size(), 2u);
    const Outputs& reference = results[0];
    ASSERT_FALSE(reference.empty());
    for (size_t run = 1; run < results.size(); ++run) {
        ASSERT_EQ(results[run].size(), reference.size());
        for (size_t index = 0; index < reference.size(); ++index) {
            const NamedBytes& expected = reference[index];
            const NamedBytes& actual = results[run][index];
            ASSERT_EQ(actual.name, expected.name);
            ASSERT_EQ(actual.bytes.size(), expected.bytes.size()) << expected.name;
            size_t differing = 0;
            for (size_t byte = 0; byte < expected.bytes.size(); ++byte) differing += actual.bytes[byte] != expected.bytes[byte];
            EXPECT_EQ(differing, 0u) << expected.name << " differs between thread-count runs 0 and " << run;
        }
    }
}

const std::initializer_list<int> thread_counts{1, 2, 5};

// The shapes of tests/thread_kernels.h split into several chunks in every kernel, so that threads really share
// the work (one chunk would run inline and prove nothing).
TEST(CpuThreads, KernelShapesSplitIntoSeveralChunks) {
    const int64_t N = rows, C = channels, E = elements;
    // row kernels (layernorm, rms_norm) and their column sums; bias add; bias_backward
    EXPECT_GE(k::chunk_count(N, k::items_per_chunk(C, k::row_elements_per_chunk)), 4);
    EXPECT_GE(k::chunk_count(C, k::columns_per_chunk(N)), 4);
    EXPECT_GE(k::chunk_count(N, k::items_per_chunk(C, k::cheap_elements_per_chunk)), 4);
    // element kernels: costly (dropout, swiglu, unary), cheap (gelu, residual, sgd, sum_of_squares, copies), adamw
    EXPECT_GE(k::chunk_count(E, k::costly_elements_per_chunk), 4);
    EXPECT_GE(k::chunk_count(E, k::cheap_elements_per_chunk), 4);
    EXPECT_GE(k::chunk_count(E, k::costly_elements_per_chunk * 4), 4);
    // rope: (B*T) positions of 16 heads of 32
    EXPECT_GE(k::chunk_count(int64_t(batch) * length, k::items_per_chunk(16 * 32, k::cheap_elements_per_chunk)), 2);
    // cross-entropy rows of V logits; the fused rescale over (N, V + 16)
    EXPECT_GE(k::chunk_count(N, k::items_per_chunk(vocabulary, k::costly_elements_per_chunk)), 4);
    EXPECT_GE(k::chunk_count(N * (vocabulary + 16), k::cheap_elements_per_chunk), 4);
    // softmax: 256 (inner 1) and 2048 (inner 8) columns of 512
    EXPECT_GE(k::chunk_count(256, k::items_per_chunk(512, k::costly_elements_per_chunk)), 4);
    // embedding: (4*batch*length) positions forward, channel chunks backward
    const int64_t positions = 4 * int64_t(batch) * length;
    EXPECT_GE(k::chunk_count(positions, k::items_per_chunk(C, k::cheap_elements_per_chunk)), 2);
    EXPECT_GE(k::chunk_count(C, k::columns_per_chunk(positions)), 4);
    // attention: (batch, head) blocks forward, (batch, kv head) blocks backward, one block a chunk here
    const int64_t head_size = C / heads, triangle = int64_t(length) * (length + 1) / 2 * head_size;
    EXPECT_EQ(k::items_per_chunk(triangle, k::cheap_elements_per_chunk), 1);
    EXPECT_GE(k::chunk_count(int64_t(batch) * kv_heads, 1), 4);
}

TEST(CpuThreads, ParallelForCoversEveryIndexOnceInFixedChunks) {
    const int original = omp_get_max_threads();
    for (int count : thread_counts) {
        omp_set_num_threads(count);
        std::vector<int> visits(1000, 0);
        std::vector<std::pair<int64_t, int64_t>> chunks(k::chunk_count(1000, 64));
        k::parallel_for(1000, 64, [&](int64_t begin, int64_t end) {
            chunks[size_t(begin / 64)] = {begin, end};
            for (int64_t i = begin; i < end; ++i) ++visits[size_t(i)];
        });
        for (int visit : visits) ASSERT_EQ(visit, 1);
        for (size_t index = 0; index < chunks.size(); ++index) {
            EXPECT_EQ(chunks[index].first, int64_t(index) * 64);
            EXPECT_EQ(chunks[index].second, std::min<int64_t>(1000, int64_t(index + 1) * 64));
        }
    }
    omp_set_num_threads(original);
}

TEST(CpuThreads, KernelsAreBitwiseEqualForAnyThreadCount) {
    expect_bitwise_equal(under_thread_counts([] { return run_kernels(); }, thread_counts));
}

TEST(CpuThreads, GptTrainingStepIsBitwiseEqualForAnyThreadCount) {
    expect_bitwise_equal(under_thread_counts([] { return run_gpt_training(); }, thread_counts));
}

TEST(CpuThreads, LlamaTrainingStepIsBitwiseEqualForAnyThreadCount) {
    expect_bitwise_equal(under_thread_counts([] { return run_llama_training(); }, thread_counts));
}

} // namespace
