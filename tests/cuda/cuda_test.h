// Shared pieces of the CUDA kernel tests: the fixture that skips without a device, a seeded random source
// that prints its seed, and a minimal device buffer on raw cudaMalloc/cudaMemcpy.
#pragma once

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "base/cuda/check.h"
#include "base/cuda/headers.h"
#include "engine/cuda/runtime.h"

namespace engine::test {

// Each test gets fresh inputs; the seed is printed (and recorded in the XML report) so a failure replays.
class CudaKernelTest : public ::testing::Test {
public: // free helper functions in the tests use these too
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::ensure_initialized();
        // The references are fp32 CPU kernels; tests of the TF32 paths ask for them by argument.
        engine::cuda::set_tf32_enabled(false);
        stream = engine::cuda::compute_stream();
        seed = std::random_device{}();
        generator.seed(seed);
        std::cout << "[ seed     ] " << seed << "\n";
        RecordProperty("seed", std::to_string(seed));
    }

    std::vector<float> random_floats(size_t count, float low = -1.0f, float high = 1.0f) {
        std::uniform_real_distribution<float> distribution(low, high);
        std::vector<float> values(count);
        for (float& value : values) value = distribution(generator);
        return values;
    }
    std::vector<int32_t> random_ints(size_t count, int32_t low, int32_t high) { // inclusive range
        std::uniform_int_distribution<int32_t> distribution(low, high);
        std::vector<int32_t> values(count);
        for (int32_t& value : values) value = distribution(generator);
        return values;
    }

    cudaStream_t stream = nullptr;
    uint32_t seed = 0;
    std::mt19937 generator;
};

inline std::vector<float> nan_filled(size_t count) {
    return std::vector<float>(count, std::numeric_limits<float>::quiet_NaN());
}

// Device memory for one test; copies are synchronous (on the legacy stream after a device-wide sync) so
// that tests read plainly.
template <typename T>
class DeviceBuffer {
public:
    explicit DeviceBuffer(const std::vector<T>& host) : count_(host.size()) {
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
        if (count_ > 0) CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
        // The compute stream is non-blocking, so it does not wait for legacy-stream copies by itself.
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    explicit DeviceBuffer(size_t count) : DeviceBuffer(std::vector<T>(count)) {}
    ~DeviceBuffer() { (void)cudaFree(data_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    T* get() { return data_; }
    std::vector<T> to_host() const {
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<T> host(count_);
        if (count_ > 0) CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
        return host;
    }

private:
    size_t bytes() const { return count_ * sizeof(T); }
    T* data_ = nullptr;
    size_t count_;
};

} // namespace engine::test
