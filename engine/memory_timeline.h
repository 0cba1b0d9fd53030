// The memory timeline (train_gpt --memory-timeline FILE): every allocation and free of every account while it
// records, with its category, size, phase and op, written in Chrome's trace format for Perfetto and drawn by
// scripts/plot_memory.py. docs/MEMORY.md, "The memory timeline".
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/memory.h"
#include "engine/profiling.h"

namespace engine {

struct MemoryEvent {
    Device device = Device::cpu; // whose account: pinned_host is always the host's
    MemoryCategory category = MemoryCategory::activations;
    int64_t bytes = 0;           // + allocated, − freed
    int64_t nanoseconds = 0;     // since the recording started
    profiling::Phase phase = profiling::Phase::forward;
    // The op whose kernel was dispatched next (on any thread): an op allocates its output, then runs its kernel, so
    // that is the op the allocation was for (a free is filed under the op that ran after it); "" when no kernel
    // ran after the event before the recording stopped.
    std::string op;
};

struct MemoryTimeline {
    std::vector<MemoryEvent> events;
    // What each account held when the recording started, by category (the events are changes from there).
    MemoryStats start_cpu, start_cuda;
    // Events that could not be stored (no memory for the list): the events then do not add up; 0 in practice.
    int64_t dropped_events = 0;
};

namespace detail {
inline std::atomic<bool> timeline_recording{false};
} // namespace detail

// One relaxed load: what memory.cpp and the dispatch helpers pay when nothing records.
inline bool memory_timeline_recording() { return detail::timeline_recording.load(std::memory_order_relaxed); }

// Starts recording (from empty) every allocation and free of every thread; throws if a recording is running.
void start_memory_timeline();
// Stops and returns what was recorded.
MemoryTimeline stop_memory_timeline();

// memory.cpp: one allocation (+bytes) or free (−bytes) on `device`'s account.
void record_memory_event(Device device, MemoryCategory category, int64_t bytes) noexcept;
// The dispatch helpers: `op`'s kernel runs now; the events since the previous kernel are filed under it.
void note_kernel(const char* op);

// The recording as Chrome's JSON trace format (chrome://tracing, ui.perfetto.dev): one counter track per account
// ("cpu memory", "cuda memory") with a series per category, in bytes, at every event; the events themselves, and
// `metadata` (a JSON object: the step, the predicted peak, ...), under the top-level key "libengine", which the
// viewers ignore and scripts/plot_memory.py reads.
std::string memory_timeline_json(const MemoryTimeline& timeline, const std::string& metadata = "{}");

} // namespace engine
