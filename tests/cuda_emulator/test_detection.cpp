// Proof that the emulated device catches the bugs it exists to catch: each test runs one deliberately
// broken kernel or stream sequence (tests/cuda_emulator/broken_kernels.cu) and asserts the emulator
// reports it, naming what was wrong; where there is a correct twin, it passes.
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/testing.h"
#include "engine/cuda/runtime.h"
#include "engine/memory.h"
#include "tests/cuda/cuda_test.h"
#include "tests/cuda_emulator/test_kernels.h"

namespace engine::test {
namespace {

using emulated::full_mask_warp_sum;
using emulated::shift_left_off_by_one;
using emulated::two_block_sums_missing_barrier;

// Runs `action`, which must throw an EngineError whose message contains `expected`; then forgets the
// emulated fault so the device stays usable for the rest of the process.
template <typename Action>
void expect_detected(Action&& action, const std::string& expected) {
    try {
        action();
        ADD_FAILURE() << "the bug went undetected (expected an error containing \"" << expected << "\")";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
    engine::emulator::clear_fault();
}

class DetectionTest : public CudaKernelTest {
protected:
    void TearDown() override { engine::emulator::set_schedules({"round-robin"}); }
};

TEST_F(DetectionTest, MissingSyncthreadsGivesScheduleDependentResults) {
    constexpr int blocks = 2, threads = 128;
    const std::vector<float> input = random_floats(blocks * threads);
    DeviceBuffer<float> in(input), out(4 * blocks);

    // Round-robin alone lets every warp read before any writes again, so it misses the bug ...
    engine::emulator::set_schedules({"round-robin"});
    two_block_sums_missing_barrier(out.get(), in.get(), blocks, threads, stream);
    const std::vector<float> round_robin = out.to_host();
    double sum = 0.0;
    for (int i = 0; i < threads; ++i) sum += input[i];
    EXPECT_NEAR(round_robin[0], sum, 1e-4);
    // ... the greedy schedules, where one warp runs ahead, do not.
    engine::emulator::set_schedules({"round-robin", "round-robin-reverse", "greedy", "greedy-reverse", "random"});
    expect_detected(
        [&] {
            two_block_sums_missing_barrier(out.get(), in.get(), blocks, threads, stream);
            (void)out.to_host();
        },
        "writes different results under schedules");
}

TEST_F(DetectionTest, OffByOneReadPastABufferIsCaught) {
    constexpr int n = 1024; // a multiple of 4 floats: the buffer's end touches the guard page exactly
    DeviceBuffer<float> in(random_floats(n)), out(n);
    EXPECT_DEATH(
        {
            shift_left_off_by_one(out.get(), in.get(), n, stream);
            (void)out.to_host();
        },
        "out-of-bounds access at .*0 bytes past the end of the 4096-byte device allocation|heap-buffer-overflow");
}

TEST_F(DetectionTest, FullMaskShuffleInAPartialWarpIsCaught) {
    DeviceBuffer<float> in(random_floats(48)), out(2);
    expect_detected(
        [&] {
            full_mask_warp_sum(out.get(), in.get(), 48, stream);
            (void)out.to_host();
        },
        "names lanes 16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31 that do not exist");
    // The same kernel with whole warps is fine: each warp's sum, within float rounding of a double sum.
    const std::vector<float> values = random_floats(64);
    DeviceBuffer<float> whole_in(values), whole_out(2);
    full_mask_warp_sum(whole_out.get(), whole_in.get(), 64, stream);
    const std::vector<float> sums = whole_out.to_host();
    for (int warp = 0; warp < 2; ++warp) {
        double expected = 0.0;
        for (int lane = 0; lane < 32; ++lane) expected += values[static_cast<size_t>(warp * 32 + lane)];
        EXPECT_NEAR(sums[static_cast<size_t>(warp)], expected, 1e-5) << "warp " << warp;
    }
}

// A pinned source copied to the device on the copy stream (as offload prefetch does), then read on the
// compute stream.
struct PrefetchedBuffer {
    explicit PrefetchedBuffer(size_t count) : bytes(count * sizeof(float)) {
        pinned = static_cast<float*>(allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host));
        std::iota(pinned, pinned + count, 1.0f);
        device = allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    }
    ~PrefetchedBuffer() {
        deallocate_bytes(Device::cpu, pinned, bytes, MemoryCategory::pinned_host);
        if (device != nullptr) deallocate_bytes(Device::cuda, device, bytes, MemoryCategory::activations);
    }
    size_t bytes;
    float* pinned = nullptr;
    void* device = nullptr;
};

TEST_F(DetectionTest, MissingEventWaitBetweenCopyAndComputeStreamsIsCaught) {
    constexpr size_t count = 4096;
    std::vector<float> back(count);
    {
        PrefetchedBuffer buffer(count);
        engine::cuda::StreamEvent done;
        engine::cuda::copy_to_device_async(buffer.device, buffer.pinned, buffer.bytes, done);
        done.wait(engine::cuda::compute_stream()); // the correct order
        engine::cuda::copy(back.data(), Device::cpu, buffer.device, Device::cuda, buffer.bytes);
        EXPECT_EQ(back, std::vector<float>(buffer.pinned, buffer.pinned + count));
    }
    PrefetchedBuffer buffer(count);
    engine::cuda::StreamEvent done;
    engine::cuda::copy_to_device_async(buffer.device, buffer.pinned, buffer.bytes, done);
    // The bug: no done.wait(compute_stream()) before the compute stream reads the destination.
    expect_detected([&] { engine::cuda::copy(back.data(), Device::cpu, buffer.device, Device::cuda, buffer.bytes); },
                    "race on device allocation");
}

TEST_F(DetectionTest, FreedBufferReusedWhileACopyIsPendingIsCaught) {
    constexpr size_t count = 4096;
    PrefetchedBuffer buffer(count);
    engine::cuda::StreamEvent done;
    engine::cuda::copy_to_device_async(buffer.device, buffer.pinned, buffer.bytes, done);
    // The bug: the destination goes back to the caching allocator while the copy stream may still write it.
    deallocate_bytes(Device::cuda, buffer.device, buffer.bytes, MemoryCategory::activations);
    void* reused = allocate_bytes(Device::cuda, buffer.bytes, MemoryCategory::activations);
    buffer.device = reused;
    expect_detected([&] { engine::cuda::zero(reused, buffer.bytes); }, "race on device allocation");
}

} // namespace
} // namespace engine::test
