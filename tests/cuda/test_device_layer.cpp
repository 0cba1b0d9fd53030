// The device layer: caching allocator reuse, copies through the compute stream, the pinned pool, and the
// workspace scratch that ops hand to the kernels. (The "no CUDA device" paths: tests/cuda_no_device.)
#include <numeric>

#include "base/cuda/handles.h"
#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/scratch.h"
#include "engine/memory.h"
#include "engine/ops.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

using DeviceLayerTest = CudaKernelTest;

TEST_F(DeviceLayerTest, CachingAllocatorReusesFreedBlocks) {
    constexpr size_t bytes = (size_t(3) << 20) + 123; // a large size class
    void* first = engine::allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    engine::deallocate_bytes(Device::cuda, first, bytes, MemoryCategory::activations);
    const size_t before = engine::cuda::system_allocation_count();
    const size_t stats_before = engine::memory_stats(Device::cuda).system_allocations;
    for (int round = 0; round < 10; ++round) {
        void* again = engine::allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
        engine::deallocate_bytes(Device::cuda, again, bytes, MemoryCategory::activations);
    }
    EXPECT_EQ(engine::cuda::system_allocation_count(), before);
    EXPECT_EQ(engine::memory_stats(Device::cuda).system_allocations, stats_before);
}

TEST_F(DeviceLayerTest, SmallSizesShareAClass) {
    void* first = engine::allocate_bytes(Device::cuda, 1000, MemoryCategory::workspace);
    engine::deallocate_bytes(Device::cuda, first, 1000, MemoryCategory::workspace);
    const size_t before = engine::cuda::system_allocation_count();
    void* second = engine::allocate_bytes(Device::cuda, 1020, MemoryCategory::workspace); // same 1024 B class
    engine::deallocate_bytes(Device::cuda, second, 1020, MemoryCategory::workspace);
    EXPECT_EQ(engine::cuda::system_allocation_count(), before);
}

TEST_F(DeviceLayerTest, CopyRoundTripAndZero) {
    constexpr size_t count = 1234567;
    std::vector<float> host(count);
    std::iota(host.begin(), host.end(), 0.5f);
    const size_t bytes = count * sizeof(float);
    void* device = engine::allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    void* device_copy = engine::allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    engine::cuda::copy(device, Device::cuda, host.data(), Device::cpu, bytes);
    engine::cuda::copy(device_copy, Device::cuda, device, Device::cuda, bytes);
    std::vector<float> back(count, -1.0f);
    engine::cuda::copy(back.data(), Device::cpu, device_copy, Device::cuda, bytes); // returns once written
    EXPECT_EQ(back, host);
    engine::cuda::zero(device_copy, bytes);
    engine::cuda::copy(back.data(), Device::cpu, device_copy, Device::cuda, bytes);
    EXPECT_EQ(back, std::vector<float>(count, 0.0f));
    engine::deallocate_bytes(Device::cuda, device, bytes, MemoryCategory::activations);
    engine::deallocate_bytes(Device::cuda, device_copy, bytes, MemoryCategory::activations);
}

TEST_F(DeviceLayerTest, PinnedPoolReusesBlocksAndServesCopies) {
    constexpr size_t bytes = 4096 + 7;
    auto* pinned = static_cast<unsigned char*>(engine::allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host));
    for (size_t i = 0; i < bytes; ++i) pinned[i] = static_cast<unsigned char>(i * 31);
    void* device = engine::allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    engine::cuda::copy(device, Device::cuda, pinned, Device::cpu, bytes);
    std::vector<unsigned char> back(bytes);
    engine::cuda::copy(back.data(), Device::cpu, device, Device::cuda, bytes);
    EXPECT_EQ(std::vector<unsigned char>(pinned, pinned + bytes), back);
    engine::deallocate_bytes(Device::cpu, pinned, bytes, MemoryCategory::pinned_host);
    engine::deallocate_bytes(Device::cuda, device, bytes, MemoryCategory::activations);
    const size_t before = engine::cuda::system_allocation_count();
    void* again = engine::allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host);
    engine::deallocate_bytes(Device::cpu, again, bytes, MemoryCategory::pinned_host);
    EXPECT_EQ(engine::cuda::system_allocation_count(), before);
}

// An op's kernel workspace (here sum's reduction partials) is scratch from the accounting allocator: counted
// while the op runs, given back when it returns, and refused on a stream other than the compute stream (the
// caching allocator's reuse is ordered on that stream only).
TEST_F(DeviceLayerTest, ScratchIsAccountedWorkspace) {
    const Tensor input = Tensor::full({300001}, 0.5, DType::f32, Device::cuda);
    const size_t workspace_before = engine::memory_stats(Device::cuda).current(MemoryCategory::workspace);
    engine::reset_peak(Device::cuda);
    const Tensor total = engine::sum(input);
    const MemoryStats after = engine::memory_stats(Device::cuda);
    EXPECT_EQ(after.current(MemoryCategory::workspace), workspace_before);
    EXPECT_GT(after.peak(MemoryCategory::workspace), workspace_before);
    EXPECT_EQ(total.to_vector<float>()[0], 150000.5f);

    base::cuda::Stream other;
    EXPECT_THROW(engine::cuda::Scratch<double>(16, other.get()), engine::EngineError);
    EXPECT_EQ(engine::memory_stats(Device::cuda).current(MemoryCategory::workspace), workspace_before);
}

// Uploaded ids keep their host values: to_vector serves them from the host (shown by writing the device
// memory behind the API's back, which the host copy does not see), and an API write drops the copy.
TEST_F(DeviceLayerTest, IdsUploadedWithHostCopyAreReadWithoutTheDevice) {
    const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9};
    Tensor device_ids = Tensor::from_vector<int32_t>(ids, {2, 3}, Device::cpu).to_keeping_host_copy(Device::cuda);
    ASSERT_TRUE(device_ids.has_host_copy());
    const std::vector<int32_t> other = {7, 7, 7, 7, 7, 7};
    CUDA_CHECK(cudaMemcpyAsync(device_ids.raw_data(), other.data(), other.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(device_ids.to_vector<int32_t>(), ids);
    EXPECT_EQ(device_ids.reshape({6}).to_vector<int32_t>(), ids); // reshape shares the storage and its copy
    EXPECT_EQ(device_ids.with_rows(1).to_vector<int32_t>(), std::vector<int32_t>(ids.begin(), ids.begin() + 3));

    device_ids.copy_from(Tensor::from_vector<int32_t>(other, {2, 3}, Device::cpu));
    EXPECT_FALSE(device_ids.has_host_copy());
    EXPECT_EQ(device_ids.to_vector<int32_t>(), other);
    EXPECT_THROW(Tensor::zeros({2}, DType::f32, Device::cpu).to_keeping_host_copy(Device::cuda), EngineError);
}

TEST_F(DeviceLayerTest, TooLargeAllocationRaisesOutOfMemory) {
    EXPECT_THROW(engine::allocate_bytes(Device::cuda, size_t(1) << 50, MemoryCategory::activations),
                 engine::OutOfMemoryError);
    void* after = engine::allocate_bytes(Device::cuda, 4096, MemoryCategory::activations); // still usable
    engine::deallocate_bytes(Device::cuda, after, 4096, MemoryCategory::activations);
}

} // namespace
} // namespace engine::test
