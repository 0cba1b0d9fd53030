// The CUDA build on a machine where no device is visible: ctest runs this binary with CUDA_VISIBLE_DEVICES
// empty, so the "no CUDA device" paths are tested on a GPU machine and on the emulated device too.
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/tensor.h"

namespace engine::test {
namespace {

void skip_if_a_device_is_visible() {
    if (engine::cuda::device_available()) {
        GTEST_SKIP() << "a CUDA device is visible: run with CUDA_VISIBLE_DEVICES= (empty), as ctest does";
    }
}

TEST(WithoutDevice, DeviceIsNotAvailable) {
    skip_if_a_device_is_visible();
    EXPECT_FALSE(engine::cuda::device_available());
}

TEST(WithoutDevice, InitializationFailsWithAReason) {
    skip_if_a_device_is_visible();
    try {
        engine::cuda::ensure_initialized();
        FAIL() << "ensure_initialized() succeeded without a device";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("no CUDA device"), std::string::npos) << error.what();
    }
}

TEST(WithoutDevice, CudaTensorThrowsNoCudaDevice) {
    skip_if_a_device_is_visible();
    try {
        (void)Tensor::zeros({4}, DType::f32, Device::cuda);
        FAIL() << "a cuda tensor was created without a device";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("no CUDA device"), std::string::npos) << error.what();
    }
}

} // namespace
} // namespace engine::test
