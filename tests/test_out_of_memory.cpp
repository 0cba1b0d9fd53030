// Out of memory: a request the host cannot satisfy throws OutOfMemoryError carrying the request, the usage
// by category and the remedies, leaves the accounting as it was, and the process carries on allocating.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "engine/tensor.h"

namespace engine::testing {
namespace {

std::string out_of_memory_message(const std::function<void()>& action) {
    try {
        action();
    } catch (const OutOfMemoryError& error) {
        return error.what();
    }
    ADD_FAILURE() << "no OutOfMemoryError was thrown";
    return "";
}

void expect_same_usage(const MemoryStats& after, const MemoryStats& before) {
    EXPECT_EQ(after.current_bytes, before.current_bytes);
    EXPECT_EQ(after.peak_bytes, before.peak_bytes);
    EXPECT_EQ(after.current_by_category, before.current_by_category);
    EXPECT_EQ(after.peak_by_category, before.peak_by_category);
}

TEST(OutOfMemory, AbsurdTensorReportsRequestUsageAndHintAndChangesNothing) {
    // Known live usage, so that the message's per-category figures can be checked against the accounting.
    Tensor weights = Tensor::zeros({1000}, DType::f32, Device::cpu, MemoryCategory::parameters);
    const MemoryStats before = memory_stats(Device::cpu);
    ASSERT_GE(before.current(MemoryCategory::parameters), 4000u);

    constexpr int64_t elements = int64_t{1} << 58; // 2^60 bytes of f32: more than any address space holds
    const std::string message = out_of_memory_message(
        [&] { Tensor::empty({elements}, DType::f32, Device::cpu, MemoryCategory::activations); });
    EXPECT_NE(message.find("out of memory on cpu"), std::string::npos) << message;
    EXPECT_NE(message.find("requested " + std::to_string(uint64_t{1} << 60) + " B for activations"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("parameters " + std::to_string(before.current(MemoryCategory::parameters)) + " B"),
              std::string::npos)
        << message;
    for (const char* category : {"gradients", "optimizer_state", "activations", "workspace", "pinned_host"})
        EXPECT_NE(message.find(category), std::string::npos) << category << " missing from: " << message;
    for (const char* remedy :
         {"per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "offload"})
        EXPECT_NE(message.find(remedy), std::string::npos) << remedy << " missing from: " << message;
    expect_same_usage(memory_stats(Device::cpu), before);

    // Still usable: an ordinary allocation succeeds and is accounted.
    Tensor after = Tensor::zeros({16}, DType::f32, Device::cpu, MemoryCategory::workspace);
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::workspace),
              before.current(MemoryCategory::workspace) + 64);
}

TEST(OutOfMemory, PinnedHostRequestIsReportedUnderItsCategory) {
    const MemoryStats before = memory_stats(Device::cpu);
    const std::string message = out_of_memory_message(
        [] { Tensor::empty({int64_t{1} << 58}, DType::f32, Device::cpu, MemoryCategory::pinned_host); });
    EXPECT_NE(message.find("B for pinned_host"), std::string::npos) << message;
    expect_same_usage(memory_stats(Device::cpu), before);
}

// Sizes whose rounding up to the allocator's alignment would wrap around to a tiny block.
TEST(OutOfMemory, SizesNearTheTopOfSizeTAreRefusedNotWrapped) {
    const MemoryStats before = memory_stats(Device::cpu);
    for (size_t bytes : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 10}) {
        const std::string message =
            out_of_memory_message([&] { allocate_bytes(Device::cpu, bytes, MemoryCategory::workspace); });
        EXPECT_NE(message.find("requested " + std::to_string(bytes) + " B"), std::string::npos) << message;
    }
    expect_same_usage(memory_stats(Device::cpu), before);
}

TEST(OutOfMemory, IsAnEngineErrorSoGenericHandlersCatchIt) {
    EXPECT_THROW(Tensor::empty({int64_t{1} << 58}, DType::f32, Device::cpu), EngineError);
}

} // namespace
} // namespace engine::testing

namespace engine {
namespace {

TEST(OutOfMemory, ShapeWhoseByteCountOverflowsIsRefusedByName) {
    const MemoryStats before = memory_stats(Device::cpu);
    try {
        Tensor::empty({int64_t{1} << 62, 8}, DType::f32, Device::cpu);
        FAIL() << "a shape whose byte count wraps around must be refused";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("overflows"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("(4611686018427387904,8)"), std::string::npos) << error.what();
    }
    EXPECT_EQ(memory_stats(Device::cpu).current_bytes, before.current_bytes);
}

} // namespace
} // namespace engine
