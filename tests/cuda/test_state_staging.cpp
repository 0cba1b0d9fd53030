// The pinned block a save and a resume move a device's tensors through (engine/io/state_file.h, StateStaging): a
// tensor several blocks long goes down and comes up whole, though each copy up is only ordered on the compute stream
// and the block is refilled for the next piece (the block must wait for the copy before it is reused).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/io/state_file.h"
#include "engine/tensor.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

class StateStagingTest : public CudaKernelTest {};

TEST_F(StateStagingTest, TensorsSeveralBlocksLongGoDownAndUpWhole) {
    const size_t bytes = 2 * io::state_staging_bytes + 12345; // three pieces, the last a short one
    std::vector<uint8_t> pattern(bytes);
    for (size_t index = 0; index < bytes; ++index) pattern[index] = static_cast<uint8_t>((index * 131 + index / 7) & 0xFF);
    const Tensor device = Tensor::zeros({static_cast<int64_t>(bytes)}, DType::u8, Device::cuda);

    // Up: each piece read into the block, copied up, and the block refilled with the next.
    io::StateStaging up;
    size_t calls = 0;
    up.fill(device.raw_data(), Device::cuda, bytes, [&](void* host, size_t offset, size_t count) {
        std::memcpy(host, pattern.data() + offset, count);
        ++calls;
    });
    EXPECT_EQ(calls, 3u);
    std::vector<uint8_t> back(bytes);
    copy_bytes(back.data(), Device::cpu, device.raw_data(), Device::cuda, bytes);
    EXPECT_TRUE(back == pattern) << "a piece came up from a block already refilled";

    // Down: the pieces reach the sink in order.
    io::StateStaging down;
    std::vector<uint8_t> sunk;
    down.emit(device.raw_data(), Device::cuda, bytes, [&](const void* data, size_t count) {
        sunk.insert(sunk.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + count);
    });
    EXPECT_TRUE(sunk == pattern);
    // An empty sink copies nothing and calls nothing.
    down.emit(device.raw_data(), Device::cuda, bytes, {});
}

} // namespace
} // namespace engine::test
