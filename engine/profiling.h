// The op profiler: wall time and call counts of the CPU kernels per op name and phase (forward, backward,
// gradient norm, optimizer), off by default and one branch per kernel call when off. docs/TRAINING.md, "--profile".
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace engine::profiling {

// Where a kernel call happened. backward is set by the tape walk (so checkpoint recomputation, which runs
// forward ops inside the walk, counts as backward); grad_norm and optimizer by the trainer around the norm and
// the update (with its zero_grad); everything else is forward.
enum class Phase { forward, backward, grad_norm, optimizer };
inline constexpr int phase_count = 4;
const char* phase_name(Phase phase);

namespace detail {
// Constant-initialised, so the ENGINE_PROFILE=1 check in profiling.cpp's static initialiser cannot race it.
inline std::atomic<bool> enabled_flag{false};
} // namespace detail

// The one branch the dispatch helpers pay when profiling is off.
inline bool enabled() { return detail::enabled_flag.load(std::memory_order_relaxed); }
// Turns recording on or off for every thread. The environment variable ENGINE_PROFILE=1 turns it on at start-up.
void set_enabled(bool enabled);

// The calling thread's phase, and a scope that sets it (restoring the previous one on exit).
Phase current_phase();
class PhaseScope {
public:
    explicit PhaseScope(Phase phase);
    ~PhaseScope();
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

private:
    Phase previous_;
};

// Times one kernel region of `op` on this thread, recorded under the thread's phase when it closes. Only the
// outermost region of a thread records: a kernel region inside another (cast's nested dispatch, a zeroed
// buffer inside an op) belongs to the outer one, so that no time is counted twice and the total never exceeds
// the wall time. `op` must outlive the region (the helpers pass string literals). Construct it only when
// enabled(); the dispatch helpers do.
class Region {
public:
    explicit Region(const char* op);
    ~Region();
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;

private:
    const char* op_;
    bool outermost_;
    int64_t start_nanoseconds_ = 0;
};

// The category of an op for the breakdown: gemm, attention, normalisation, loss, embedding, elementwise,
// layout, optimizer (every kernel of the grad_norm and optimizer phases) or other (names not listed).
std::string category_of(std::string_view op, Phase phase);

struct OpRecord {
    std::string op;
    Phase phase = Phase::forward;
    std::string category;
    int64_t calls = 0;
    double seconds = 0.0;
};

struct Snapshot {
    std::vector<OpRecord> records; // by seconds, largest first
    double total_seconds = 0.0;    // the sum over records
    int64_t total_calls = 0;
    double seconds_in_category(std::string_view category) const;
    int64_t calls_of(std::string_view op, Phase phase) const; // 0 when never recorded
};

// What has been recorded since the last reset (or start), over every thread.
Snapshot snapshot();
void reset();

// The table: op, phase, calls, total ms, % of the profiled time, category, sorted by time; then the time per
// category with its share of the profiled time and, when step_seconds > 0 (the wall time of the steps the
// records cover), of that wall time, and the unprofiled remainder (step time outside every kernel region:
// allocation, the tape, data loading, and any kernel on CUDA, which this profiler does not time).
std::string format_report(const Snapshot& snapshot, double step_seconds = 0.0);

} // namespace engine::profiling
