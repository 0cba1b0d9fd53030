// What keeps a training step free of needless host waits: the gradient norm over many tensors in one
// launch list and one read, and the forward offload copy on the copy stream with the source block fenced
// in the caching allocator (the emulated device reports any unordered reuse as a race).
#include <cstring>
#include <numeric>

#include "engine/cuda/runtime.h"
#include "engine/elementwise.h"
#include "engine/memory.h"
#include "engine/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using StepSynchronisationTest = CudaKernelTest;

// More tensors than one launch's list holds (so a second launch's total continues the first's), with empty,
// one-element and several-chunk sizes. The kernel follows the CPU's association
// (kernels/common/sum_of_squares_order.h): the same bits, not merely close.
TEST_F(StepSynchronisationTest, SumOfSquaresOfATensorListMatchesTheCpuAndIsDeterministic) {
    const int tensor_count = gpu::tensor_list_capacity + 37;
    std::vector<std::vector<float>> host(tensor_count);
    std::vector<const float*> host_pointers;
    std::vector<int64_t> counts;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> device;
    std::vector<const float*> device_pointers;
    for (int tensor = 0; tensor < tensor_count; ++tensor) {
        const int64_t count = tensor % 50 == 0 ? 0 : tensor % 7 == 0 ? 1 : tensor == 3 ? 200003 : 1 + tensor * 13;
        host[tensor] = random_floats(static_cast<size_t>(count));
        host_pointers.push_back(host[tensor].data());
        counts.push_back(count);
        device.push_back(std::make_unique<DeviceBuffer<float>>(host[tensor]));
        device_pointers.push_back(device.back()->get());
    }
    double expected = 0.0;
    cpu::sum_of_squares_list(&expected, host_pointers.data(), counts.data(), tensor_count);
    DeviceBuffer<double> result(std::vector<double>{std::numeric_limits<double>::quiet_NaN()});
    DeviceBuffer<double> partials(
        static_cast<size_t>(gpu::sum_of_squares_workspace_count(counts.data(), tensor_count)));
    gpu::sum_of_squares_list(result.get(), partials.get(), device_pointers.data(), counts.data(), tensor_count, stream);
    const std::vector<double> first = result.to_host();
    EXPECT_EQ(std::memcmp(first.data(), &expected, sizeof(double)), 0)
        << "cuda " << first[0] << " cpu " << expected << ": the same association must give the same bits";
    gpu::sum_of_squares_list(result.get(), partials.get(), device_pointers.data(), counts.data(), tensor_count, stream);
    EXPECT_EQ(std::memcmp(first.data(), result.to_host().data(), sizeof(double)), 0) << "two runs differ";
}

// The engine-level entry point the gradient norm uses: same value as the per-tensor sums on the CPU.
TEST_F(StepSynchronisationTest, SumOfSquaresOfTensorsOnTheDeviceMatchesTheCpu) {
    std::vector<Tensor> on_cpu, on_cuda;
    double expected = 0.0;
    for (const int64_t count : {int64_t(5), int64_t(4099), int64_t(1), int64_t(768)}) {
        on_cpu.push_back(Tensor::from_vector<float>(random_floats(static_cast<size_t>(count)), {count}, Device::cpu));
        on_cuda.push_back(on_cpu.back().to(Device::cuda));
        expected += sum_of_squares(on_cpu.back());
    }
    EXPECT_NEAR(sum_of_squares(on_cuda), expected, 1e-10 * expected);
    EXPECT_NEAR(sum_of_squares(on_cpu), expected, 1e-12 * expected);
    EXPECT_THROW(sum_of_squares(std::vector<Tensor>{on_cpu[0], on_cuda[1]}), EngineError);
}

// The source of an asynchronous device->host copy is freed at once and its block handed out again (same
// size class) to a kernel that overwrites it: the fence makes that kernel wait for the copy, so the host
// copy holds the original values. Without the fence the emulated device reports the reuse as a race.
TEST_F(StepSynchronisationTest, OffloadSourceMayBeFreedWhileItsCopyIsInFlight) {
    constexpr size_t count = (size_t(1) << 20) + 3;
    const size_t bytes = count * sizeof(float);
    std::vector<float> values(count);
    std::iota(values.begin(), values.end(), 1.0f);
    auto* pinned = static_cast<float*>(allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host));
    void* source = allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    engine::cuda::copy(source, Device::cuda, values.data(), Device::cpu, bytes);
    engine::cuda::StreamEvent done;
    engine::cuda::copy_to_host_async(pinned, source, bytes, done);
    deallocate_bytes(Device::cuda, source, bytes, MemoryCategory::activations);

    void* reused = allocate_bytes(Device::cuda, bytes, MemoryCategory::activations);
    EXPECT_EQ(reused, source) << "the caching allocator did not hand the freed block out again";
    gpu::fill(static_cast<float*>(reused), -1.0f, static_cast<int64_t>(count), stream);
    done.synchronize();
    EXPECT_EQ(std::memcmp(pinned, values.data(), bytes), 0);
    engine::cuda::synchronize();
    deallocate_bytes(Device::cuda, reused, bytes, MemoryCategory::activations);
    done.wait(stream); // the pinned pool orders the block's reuse on the compute stream
    deallocate_bytes(Device::cpu, pinned, bytes, MemoryCategory::pinned_host);
}

} // namespace
} // namespace engine::test
