// The emulated CUDA device itself: launch limits and errors as the real runtime gives them, poisoned
// shared memory, deferred streams, the undefined behaviour it reports, shuffle and vote semantics against
// the CUDA programming guide's definitions, schedules, wmma against a float64 product, cuBLAS's checks.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/testing.h"
#include "tests/cuda/cuda_test.h"
#include "tests/cuda_emulator/test_kernels.h"

namespace engine::test {
namespace {

namespace kernels = emulated;

class EmulatorTest : public CudaKernelTest {
protected:
    void TearDown() override {
        engine::emulator::set_schedules({"round-robin"});
        engine::emulator::clear_fault();
    }
    // Synchronizes the compute stream; the error it raises, or "" when none.
    std::string synchronize_error() {
        try {
            engine::cuda::synchronize();
        } catch (const EngineError& error) {
            engine::emulator::clear_fault();
            return error.what();
        }
        return {};
    }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(EmulatorTest, LaunchLimitsGiveTheRuntimeErrors) {
    EXPECT_EQ(kernels::launch_empty(1, 1024, 0, stream), "");
    EXPECT_TRUE(contains(kernels::launch_empty(1, 1025, 0, stream), "cudaErrorInvalidConfiguration"));
    EXPECT_TRUE(contains(kernels::launch_empty(0, 32, 0, stream), "cudaErrorInvalidConfiguration"));
    EXPECT_EQ(kernels::launch_empty(1, 32, 48 * 1024, stream), "");
    EXPECT_TRUE(contains(kernels::launch_empty(1, 32, 48 * 1024 + 1, stream), "cudaErrorInvalidValue"));
    ASSERT_EQ(kernels::raise_shared_limit(100 * 1024), cudaSuccess);
    EXPECT_EQ(kernels::launch_empty(1, 32, 100 * 1024, stream), "");
    EXPECT_EQ(kernels::raise_shared_limit(232448 + 1), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    EXPECT_EQ(synchronize_error(), "");
}

TEST_F(EmulatorTest, SharedMemoryStartsAsNaNInEveryBlock) {
    DeviceBuffer<float> out_static(32), out_dynamic(32);
    kernels::read_shared_before_write(out_static.get(), out_dynamic.get(), stream); // 2 blocks: the second sees no 1.0
    for (float value : out_static.to_host()) EXPECT_TRUE(std::isnan(value));
    for (float value : out_dynamic.to_host()) EXPECT_TRUE(std::isnan(value));
}

TEST_F(EmulatorTest, FreshDeviceMemoryIsNaN) {
    float* memory = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&memory), 64 * sizeof(float)), cudaSuccess);
    std::vector<float> host(64, 0.0f);
    ASSERT_EQ(cudaMemcpy(host.data(), memory, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (float value : host) EXPECT_TRUE(std::isnan(value));
    ASSERT_EQ(cudaFree(memory), cudaSuccess);
}

TEST_F(EmulatorTest, QueuedWorkRunsOnlyWhenForced) {
    constexpr size_t bytes = 256;
    void* device = nullptr;
    unsigned char* pinned = nullptr;
    ASSERT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, cudaHostAllocDefault), cudaSuccess);
    std::fill(pinned, pinned + bytes, 0);
    ASSERT_EQ(cudaMemsetAsync(device, 7, bytes, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(pinned[0], 0) << "an asynchronous copy into pinned memory ran before anything forced it";
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(pinned[0], 7);
    EXPECT_EQ(pinned[bytes - 1], 7);
    ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
    ASSERT_EQ(cudaFree(device), cudaSuccess);
}

TEST_F(EmulatorTest, CopiesAreCheckedAgainstTheirAllocations) {
    void* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, 64), cudaSuccess);
    std::vector<unsigned char> host(128);
    EXPECT_EQ(cudaMemcpy(device, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue); // one byte past
    EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 64, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue); // not device
    EXPECT_EQ(cudaMemcpy(device, host.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue); // wrong direction
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaFree(device), cudaSuccess);
}

TEST_F(EmulatorTest, KernelArgumentInHostMemoryIsAnIllegalAddress) {
    std::vector<float> host(32);
    EXPECT_THROW(kernels::touch(host.data(), stream), EngineError);
    engine::emulator::clear_fault();
    DeviceBuffer<float> device(std::vector<float>(32, 1.0f));
    kernels::touch(device.get(), stream);
    EXPECT_EQ(device.to_host()[0], 2.0f);
}

TEST_F(EmulatorTest, CollectiveNamingAnExitedLaneIsReported) {
    DeviceBuffer<float> out(32);
    kernels::lanes_exit_then_shuffle(out.get(), stream);
    // Whichever comes first under the schedule: lanes 0..15 shuffling after 16..31 exited, or a lane of
    // 16..31 exiting while 0..15 wait for it.
    const std::string error = synchronize_error();
    EXPECT_TRUE(contains(error, "__shfl_xor_sync") && contains(error, "exited")) << error;
}

TEST_F(EmulatorTest, BarrierSkippedByExitedThreadsIsReported) {
    DeviceBuffer<float> out(64);
    kernels::some_threads_skip_barrier(out.get(), stream);
    const std::string error = synchronize_error();
    EXPECT_TRUE(contains(error, "__syncthreads") && contains(error, "exited")) << error;
}

TEST_F(EmulatorTest, DeadlockIsReported) {
    kernels::warp_waits_for_barrier(stream);
    const std::string error = synchronize_error();
    EXPECT_TRUE(contains(error, "deadlock") && contains(error, "__syncwarp")) << error;
}

// Expected values from the CUDA programming guide's definitions of the shuffles with width 8: segments of
// 8 lanes; an index is taken modulo the width, and a shift or xor that leaves the segment upwards gives
// the lane its own value.
TEST_F(EmulatorTest, ShufflesAndVotesFollowTheProgrammingGuide) {
    DeviceBuffer<int> out(32 * 7);
    kernels::shuffles_and_votes(out.get(), stream);
    const std::vector<int> result = out.to_host();
    unsigned ballot = 0;
    for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane) {
        const int segment = lane / 8 * 8, position = lane % 8;
        const int* row = &result[static_cast<size_t>(lane) * 7];
        EXPECT_EQ(row[0], 100 + segment + 5) << "lane " << lane;
        EXPECT_EQ(row[1], 100 + (position >= 3 ? lane - 3 : lane)) << "lane " << lane;
        EXPECT_EQ(row[2], 100 + (position + 3 < 8 ? lane + 3 : lane)) << "lane " << lane;
        EXPECT_EQ(row[3], 100 + (lane ^ 6)) << "lane " << lane;
        EXPECT_EQ(static_cast<unsigned>(row[4]), ballot);
        EXPECT_EQ(row[5], 1);
        EXPECT_EQ(row[6], 0);
    }
}

TEST_F(EmulatorTest, ShuffleOperandsUseTheirLowFiveBits) {
    DeviceBuffer<int> out(32);
    kernels::shuffle_xor_33(out.get(), stream);
    const std::vector<int> result = out.to_host();
    for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(result[static_cast<size_t>(lane)], 100 + (lane ^ 1)) << lane;
}

// A pageable-source cudaMemcpyAsync and cudaMemset do not order the host after the device, so work queued
// after them on another non-blocking stream is still unordered with theirs: the race stays visible.
TEST_F(EmulatorTest, CallsThatDoNotSynchronizeTheHostLeaveRacesVisible) {
    cudaStream_t other = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    DeviceBuffer<float> shared(std::vector<float>(32, 1.0f)), scratch(32);
    const std::vector<float> host(32, 2.0f);
    kernels::touch(shared.get(), other); // writes `shared` on `other`
    ASSERT_EQ(cudaMemcpyAsync(scratch.get(), host.data(), 32 * sizeof(float), cudaMemcpyHostToDevice, other), cudaSuccess);
    EXPECT_THROW(kernels::touch(shared.get(), stream), EngineError); // writes it on the compute stream, unordered
    engine::emulator::clear_fault();

    ASSERT_EQ(cudaMemset(shared.get(), 0, 32 * sizeof(float)), cudaSuccess); // the legacy stream writes it
    EXPECT_THROW(kernels::touch(shared.get(), stream), EngineError); // a non-blocking stream does not wait for that
    engine::emulator::clear_fault();
    ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

TEST_F(EmulatorTest, QueriesAnswerNotReadyWhileWorkIsQueued) {
    DeviceBuffer<float> buffer(std::vector<float>(32, 1.0f));
    cudaEvent_t event = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
    kernels::touch(buffer.get(), stream);
    ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(event), cudaErrorNotReady);
    EXPECT_EQ(cudaEventQuery(event), cudaSuccess); // the first query ran the work: polling ends
    kernels::touch(buffer.get(), stream);
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess); // "not ready" is an answer, not an error
    EXPECT_EQ(buffer.to_host()[0], 3.0f);
    ASSERT_EQ(cudaEventDestroy(event), cudaSuccess);
}

TEST_F(EmulatorTest, SchedulesOrderThreadsDifferently) {
    std::set<std::vector<int>> orders;
    for (const char* schedule : {"round-robin", "round-robin-reverse", "greedy", "greedy-reverse", "random"}) {
        engine::emulator::set_schedules({schedule});
        DeviceBuffer<int> order(64), counter(std::vector<int>{0});
        kernels::arrival_order(order.get(), counter.get(), stream);
        orders.insert(order.to_host());
    }
    EXPECT_GE(orders.size(), 3u); // forward, reverse and random at least; round-robin and greedy may agree here
    // Under several schedules at once, this schedule-dependent output is reported as a race.
    engine::emulator::set_schedules({"round-robin", "greedy-reverse"});
    DeviceBuffer<int> order(64), counter(std::vector<int>{0});
    kernels::arrival_order(order.get(), counter.get(), stream);
    EXPECT_TRUE(contains(synchronize_error(), "writes different results under schedules"));
}

std::vector<double> reference_product(const std::vector<float>& a, const std::vector<float>& b, int m, int n, int k) {
    std::vector<double> c(static_cast<size_t>(m) * n, 0.0);
    for (int row = 0; row < m; ++row)
        for (int column = 0; column < n; ++column)
            for (int inner = 0; inner < k; ++inner)
                c[static_cast<size_t>(row) * n + column] += double(a[static_cast<size_t>(row) * k + inner]) * b[static_cast<size_t>(inner) * n + column];
    return c;
}

TEST_F(EmulatorTest, WmmaTf32TileMatchesAFloat64Product) {
    const std::vector<float> a = random_floats(16 * 8), b = random_floats(8 * 16);
    DeviceBuffer<float> a_device(a), b_device(b), c(16 * 16);
    kernels::wmma_tile_tf32(c.get(), a_device.get(), b_device.get(), stream);
    const std::vector<float> result = c.to_host();
    const std::vector<double> expected = reference_product(a, b, 16, 16, 8);
    for (size_t i = 0; i < result.size(); ++i) EXPECT_NEAR(result[i], expected[i], 8 * 2e-3) << i; // TF32: 2^-11 per input
}

TEST_F(EmulatorTest, WmmaBf16TileMatchesAFloat64Product) {
    std::vector<float> a = random_floats(16 * 16), b = random_floats(16 * 16);
    std::vector<__nv_bfloat16> a_bf16, b_bf16;
    for (float& value : a) {
        a_bf16.push_back(__float2bfloat16(value));
        value = __bfloat162float(a_bf16.back()); // the product of what the kernel sees
    }
    for (float& value : b) {
        b_bf16.push_back(__float2bfloat16(value));
        value = __bfloat162float(b_bf16.back());
    }
    DeviceBuffer<__nv_bfloat16> a_device(a_bf16), b_device(b_bf16);
    DeviceBuffer<float> c(16 * 16);
    kernels::wmma_tile_bf16(c.get(), a_device.get(), b_device.get(), stream);
    const std::vector<float> result = c.to_host();
    // The kernel loads b as column-major, so it multiplies by b^T.
    std::vector<float> b_transposed(b.size());
    for (int row = 0; row < 16; ++row)
        for (int column = 0; column < 16; ++column) b_transposed[static_cast<size_t>(column) * 16 + row] = b[static_cast<size_t>(row) * 16 + column];
    const std::vector<double> expected = reference_product(a, b_transposed, 16, 16, 16);
    for (size_t i = 0; i < result.size(); ++i) EXPECT_NEAR(result[i], expected[i], 1e-5) << i;
}

TEST_F(EmulatorTest, CublasChecksLeadingDimensionsAndOperandExtents) {
    cublasHandle_t handle = nullptr;
    ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(handle, stream), CUBLAS_STATUS_SUCCESS);
    DeviceBuffer<float> a(4 * 3), b(3 * 5), c(4 * 5);
    const float one = 1.0f, zero = 0.0f;
    // column-major C (4,5) = A (4,3) B (3,5): lda must be at least 4
    EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 5, 3, &one, a.get(), CUDA_R_32F, 3, b.get(), CUDA_R_32F, 3,
                           &zero, c.get(), CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    // k = 4 reads A as (4,4), past its 12 floats (B, 4 x 5 with ldb 4, fits in a 20-float C-sized buffer)
    DeviceBuffer<float> b_larger(4 * 5);
    EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 5, 4, &one, a.get(), CUDA_R_32F, 4, b_larger.get(),
                           CUDA_R_32F, 4, &zero, c.get(), CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_EXECUTION_FAILED);
    EXPECT_TRUE(contains(synchronize_error(), "operand A"));
    ASSERT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

} // namespace
} // namespace engine::test
