// Offload with prefetching on CUDA: the copy stream and its events, and a GPT step whose offloaded segment
// inputs come back one segment ahead on the copy stream. The kernels are deterministic, so prefetch on and
// off must give bitwise the same gradients; against the CPU they agree within the GPT tolerances of gpt_gradients.h.
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "tests/cuda/gpt_gradients.h"

namespace engine::test {
namespace {

constexpr int micro_batch_count = 3, batch = 3;

class OffloadCudaTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::ensure_initialized();
        engine::cuda::set_tf32_enabled(false); // gradients are compared with the fp32 CPU
    }
};

// The copy-stream copy lands, and the compute stream orders after it by waiting on the event: a device
// copy enqueued on the compute stream right after the wait sees the data.
TEST_F(OffloadCudaTest, CopyStreamCopyIsOrderedByItsEvent) {
    constexpr size_t count = (size_t(3) << 20) + 17; // 12 MiB: long enough to still be in flight
    const size_t bytes = count * sizeof(float);
    auto* pinned = static_cast<float*>(allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host));
    std::iota(pinned, pinned + count, 1.0f);
    void* device = allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    void* device_copy = allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    engine::cuda::zero(device, bytes); // queued on the compute stream before the copy: the copy must follow it
    engine::cuda::StreamEvent done;
    engine::cuda::copy_to_device_async(device, pinned, bytes, done);
    done.wait(engine::cuda::compute_stream());
    engine::cuda::copy(device_copy, Device::cuda, device, Device::cuda, bytes);
    std::vector<float> back(count, -1.0f);
    engine::cuda::copy(back.data(), Device::cpu, device_copy, Device::cuda, bytes);
    EXPECT_EQ(back, std::vector<float>(pinned, pinned + count));
    deallocate_bytes(Device::cpu, pinned, bytes, MemoryCategory::pinned_host);
    deallocate_bytes(Device::cuda, device, bytes, MemoryCategory::activations);
    deallocate_bytes(Device::cuda, device_copy, bytes, MemoryCategory::activations);
}

TEST_F(OffloadCudaTest, PrefetchGivesBitwiseTheGradientsOfPlainOffload) {
    const auto batches = make_micro_batches(small_gpt_config(), micro_batch_count, batch);
    for (int every_n_layers : {1, 2}) {
        const std::string what = "every_n_layers " + std::to_string(every_n_layers);
        const GptGradients offloaded =
            accumulate_gpt_gradients(Device::cuda, checkpoint_policy(every_n_layers, true, false), batches, batch);
        checkpoint::reset_prefetched_segment_count();
        const GptGradients prefetched =
            accumulate_gpt_gradients(Device::cuda, checkpoint_policy(every_n_layers, true, true), batches, batch);
        const size_t segments = every_n_layers == 1 ? 3 : 2; // of 3 layers
        EXPECT_EQ(checkpoint::prefetched_segment_count(), (segments - 1) * micro_batch_count) << what;
        EXPECT_EQ(prefetched.loss, offloaded.loss) << what;
        ASSERT_EQ(prefetched.gradients.size(), offloaded.gradients.size());
        for (size_t index = 0; index < prefetched.gradients.size(); ++index)
            EXPECT_EQ(prefetched.gradients[index].second, offloaded.gradients[index].second)
                << what << ": gradient of " << prefetched.gradients[index].first;

        // And against the CPU.
        const GptGradients cpu =
            accumulate_gpt_gradients(Device::cpu, checkpoint_policy(every_n_layers, true, true), batches, batch);
        expect_gradients_close_to_cpu(prefetched, cpu, what);
    }
}

} // namespace
} // namespace engine::test
