// The memory timeline's recorder and its Chrome trace: a mutex-guarded list of events, labelled with the next
// kernel's op (engine/memory_timeline.h).
#include "engine/memory_timeline.h"

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/cuda/runtime.h"

namespace engine {
namespace {

struct Recorder {
    std::mutex mutex;
    MemoryTimeline timeline;
    size_t unlabelled = 0; // the first event no kernel has run after yet
    std::chrono::steady_clock::time_point start;
};

// Leaked, as memory.cpp's registry is: tensors may be freed during static teardown, after a static would be gone.
Recorder& recorder() {
    static Recorder* instance = new Recorder();
    return *instance;
}

void record_event(Recorder& state, Device device, MemoryCategory category, int64_t bytes);

} // namespace

void start_memory_timeline() {
    // Read before the recorder's lock: memory.cpp takes its own lock, then this one (never the other way round).
    const MemoryStats start_cpu = memory_stats(Device::cpu);
    const MemoryStats start_cuda = cuda::device_available() ? memory_stats(Device::cuda) : MemoryStats();
    Recorder& state = recorder();
    std::lock_guard lock(state.mutex);
    ENGINE_CHECK(!memory_timeline_recording(), "memory timeline: a recording is already running");
    state.timeline = MemoryTimeline();
    state.timeline.start_cpu = start_cpu;
    state.timeline.start_cuda = start_cuda;
    state.unlabelled = 0;
    state.start = std::chrono::steady_clock::now();
    detail::timeline_recording.store(true, std::memory_order_relaxed);
}

MemoryTimeline stop_memory_timeline() {
    Recorder& state = recorder();
    std::lock_guard lock(state.mutex);
    detail::timeline_recording.store(false, std::memory_order_relaxed);
    return std::move(state.timeline);
}

void record_memory_event(Device device, MemoryCategory category, int64_t bytes) noexcept {
    Recorder& state = recorder();
    std::lock_guard lock(state.mutex);
    if (!memory_timeline_recording()) return; // stopped between the caller's check and here
    // Called from frees in destructors: an event that cannot be stored is counted, never thrown.
    try {
        record_event(state, device, category, bytes);
    } catch (...) {
        ++state.timeline.dropped_events;
    }
}

namespace {
void record_event(Recorder& state, Device device, MemoryCategory category, int64_t bytes) {
    MemoryEvent event;
    event.device = device;
    event.category = category;
    event.bytes = bytes;
    event.nanoseconds =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - state.start).count();
    event.phase = profiling::current_phase();
    state.timeline.events.push_back(std::move(event));
}
} // namespace

void note_kernel(const char* op) {
    Recorder& state = recorder();
    std::lock_guard lock(state.mutex);
    std::vector<MemoryEvent>& events = state.timeline.events;
    for (size_t index = state.unlabelled; index < events.size(); ++index) events[index].op = op;
    state.unlabelled = events.size();
}

std::string memory_timeline_json(const MemoryTimeline& timeline, const std::string& metadata) {
    using nlohmann::json;
    json trace_events = json::array();
    // The running bytes of each account by category, from what it held at the start.
    std::array<std::array<int64_t, memory_category_count>, 2> running{};
    for (int index = 0; index < memory_category_count; ++index) {
        running[0][index] = static_cast<int64_t>(timeline.start_cpu.current_by_category[index]);
        running[1][index] = static_cast<int64_t>(timeline.start_cuda.current_by_category[index]);
    }
    auto counter = [&](int account, int64_t nanoseconds) {
        json args = json::object();
        for (int index = 0; index < memory_category_count; ++index)
            args[memory_category_name(static_cast<MemoryCategory>(index))] = running[account][index];
        return json{{"name", account == 0 ? "cpu memory" : "cuda memory"},
                    {"ph", "C"},
                    {"ts", static_cast<double>(nanoseconds) / 1000.0},
                    {"pid", 1},
                    {"args", std::move(args)}};
    };
    trace_events.push_back(counter(0, 0));
    if (cuda::device_available()) trace_events.push_back(counter(1, 0));
    json events = json::array();
    for (const MemoryEvent& event : timeline.events) {
        const int account = event.device == Device::cpu ? 0 : 1;
        running[account][static_cast<int>(event.category)] += event.bytes;
        trace_events.push_back(counter(account, event.nanoseconds));
        events.push_back(json{{"device", device_name(event.device)},
                              {"category", memory_category_name(event.category)},
                              {"bytes", event.bytes},
                              {"ns", event.nanoseconds},
                              {"phase", profiling::phase_name(event.phase)},
                              {"op", event.op}});
    }
    auto start = [](const MemoryStats& stats) {
        json by_category = json::object();
        for (int index = 0; index < memory_category_count; ++index)
            by_category[memory_category_name(static_cast<MemoryCategory>(index))] = stats.current_by_category[index];
        return by_category;
    };
    json libengine{{"start", {{"cpu", start(timeline.start_cpu)}, {"cuda", start(timeline.start_cuda)}}},
                   {"events", std::move(events)},
                   {"dropped_events", timeline.dropped_events},
                   {"metadata", json::parse(metadata)}};
    json document{{"traceEvents", std::move(trace_events)}, {"displayTimeUnit", "ms"}, {"libengine", std::move(libengine)}};
    return document.dump();
}

} // namespace engine
