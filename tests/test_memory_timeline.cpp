// The memory timeline's recorder (engine/memory_timeline.h): every allocation and free while it records, each filed
// under the op whose kernel ran next, the sum of its events equal to the account's change, and its Chrome trace.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "engine/memory_timeline.h"
#include "tests/expect_error.h"

namespace engine::test {
namespace {

TEST(MemoryTimeline, RecordsEveryAllocationAndFreeUnderTheNextKernelsOp) {
    const Tensor x = Tensor::from_vector<float>({1.0f, -2.0f, 3.0f, 4.0f}, {2, 2}, Device::cpu);
    const size_t before = memory_stats(Device::cpu).current_bytes;
    start_memory_timeline();
    {
        const Tensor y = gelu(x);   // (2,2) f32: 16 B, then gelu's kernel
        const Tensor z = add(y, y); // 16 B, then add's kernel
    }                               // both freed; no kernel after them
    const MemoryTimeline timeline = stop_memory_timeline();
    EXPECT_FALSE(memory_timeline_recording());
    EXPECT_EQ(timeline.start_cpu.current_bytes, before);
    ASSERT_EQ(timeline.events.size(), 4u);
    EXPECT_EQ(timeline.events[0].bytes, 16);
    EXPECT_EQ(timeline.events[0].op, "gelu");
    EXPECT_EQ(timeline.events[1].bytes, 16);
    EXPECT_EQ(timeline.events[1].op, "add");
    EXPECT_EQ(timeline.events[2].bytes + timeline.events[3].bytes, -32);
    EXPECT_EQ(timeline.events[2].op, ""); // freed after the last kernel
    int64_t sum = 0;
    for (const MemoryEvent& event : timeline.events) {
        EXPECT_EQ(event.device, Device::cpu);
        EXPECT_EQ(event.category, MemoryCategory::activations);
        EXPECT_EQ(event.phase, profiling::Phase::forward);
        sum += event.bytes;
    }
    EXPECT_EQ(sum, 0);
    EXPECT_EQ(memory_stats(Device::cpu).current_bytes, before);

    // The trace: a counter per event (and one per account at the start: the CUDA account's too where a device, or
    // the emulated one, is present), the running bytes by category, and the events kept.
    const nlohmann::json trace = nlohmann::json::parse(memory_timeline_json(timeline, R"({"step": 3})"));
    std::vector<nlohmann::json> cpu_counters;
    for (const nlohmann::json& event : trace["traceEvents"]) {
        EXPECT_EQ(event["ph"], "C");
        if (event["name"] == "cpu memory") cpu_counters.push_back(event);
    }
    ASSERT_EQ(cpu_counters.size(), 5u); // the start and the four events
    EXPECT_EQ(cpu_counters[0]["args"]["activations"].get<int64_t>(),
              static_cast<int64_t>(timeline.start_cpu.current(MemoryCategory::activations)));
    EXPECT_EQ(cpu_counters[1]["args"]["activations"].get<int64_t>(),
              static_cast<int64_t>(timeline.start_cpu.current(MemoryCategory::activations)) + 16);
    EXPECT_EQ(trace["libengine"]["events"].size(), 4u);
    EXPECT_EQ(trace["libengine"]["metadata"]["step"], 3);
    EXPECT_EQ(trace["libengine"]["events"][0]["op"], "gelu");
}

TEST(MemoryTimeline, BackwardIsFiledUnderItsPhaseAndOneRecordingRunsAtATime) {
    Tensor x = Tensor::from_vector<float>({0.5f, -1.0f}, {2}, Device::cpu);
    x.set_requires_grad(true);
    const Tensor loss = sum(gelu(x));
    start_memory_timeline();
    engine::testing::expect_error([] { start_memory_timeline(); }, {"a recording is already running"});
    backward(loss);
    const MemoryTimeline timeline = stop_memory_timeline();
    bool backward_seen = false;
    for (const MemoryEvent& event : timeline.events) backward_seen = backward_seen || event.phase == profiling::Phase::backward;
    EXPECT_TRUE(backward_seen);
    zero_grad({x});
}

} // namespace
} // namespace engine::test
