// Inside the emulator: running one kernel grid on the CPU. Each block's threads are fibers (Boost.Context)
// on the calling host thread, switched only at barriers and warp collectives, in an order the schedule
// chooses. Blocks run one after another, in an order the schedule also chooses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "emulator/cuda_emulation.h"

// Under AddressSanitizer the emulator tells it about every fiber switch, and takes device memory from the
// instrumented heap rather than from guard-paged mappings.
#if defined(__SANITIZE_ADDRESS__)
#define ENGINE_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) // clang's spelling
#define ENGINE_EMULATOR_ASAN 1
#endif
#endif
#ifndef ENGINE_EMULATOR_ASAN
#define ENGINE_EMULATOR_ASAN 0
#endif

namespace engine::emulator {

enum class Schedule {
    round_robin,         // each ready thread in turn, lowest index first, advances to its next sync point
    round_robin_reverse, // the same, highest index first
    greedy,              // always the lowest-index ready thread: one warp runs far ahead of the others
    greedy_reverse,      // always the highest-index ready thread
    random,              // a seeded random ready thread each time
};
inline constexpr Schedule all_schedules[] = {Schedule::round_robin, Schedule::round_robin_reverse, Schedule::greedy,
                                             Schedule::greedy_reverse, Schedule::random};

struct ScheduleChoice {
    Schedule schedule = Schedule::round_robin;
    uint64_t seed = 0; // for Schedule::random
};

const char* schedule_name(Schedule schedule);
std::optional<Schedule> schedule_from_name(const std::string& name);

// Runs every block of `launch`. Returns the first fault (undefined behaviour the emulator detected, such
// as a warp collective naming an exited lane, a barrier not every thread reaches, a deadlock), or nullopt.
std::optional<std::string> run_grid(const KernelLaunch& launch, ScheduleChoice choice);

struct SchedulerStatistics {
    uint64_t blocks = 0;
    uint64_t threads = 0;
    uint64_t switches = 0; // fiber resumptions
};
SchedulerStatistics scheduler_statistics();

// What is running on this host thread, for the out-of-bounds report (emulator/memory.cpp); name is
// nullptr outside a kernel.
struct RunningKernel {
    const char* name;
    uint3 block;
    uint3 thread;
};
RunningKernel running_kernel();

// Gives this host thread the alternate signal stack the out-of-bounds report runs on (emulator/memory.cpp).
void install_signal_stack();

} // namespace engine::emulator
