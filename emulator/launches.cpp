// Kernel launches on the emulated device: the runtime's launch checks, the queueing, and the replay that
// runs each launch under every configured thread schedule from the same memory and requires bitwise equal
// results (a kernel whose output depends on the schedule has a race between its threads or blocks).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <map>
#include <sstream>

#include "emulator/device.h"
#include "emulator/scheduler.h"
#include "emulator/testing.h"

namespace engine::emulator {
namespace {

struct Configuration {
    std::vector<Schedule> schedules;
    uint64_t seed = 0x5eed;
};

std::vector<Schedule> parse_schedules(const std::string& text) {
    if (text == "all") return {std::begin(all_schedules), std::end(all_schedules)};
    std::vector<Schedule> parsed;
    std::stringstream list(text);
    std::string name;
    while (std::getline(list, name, ',')) {
        const std::optional<Schedule> schedule = schedule_from_name(name);
        if (!schedule) {
            throw std::invalid_argument("ENGINE_EMULATOR_SCHEDULES: unknown schedule '" + name +
                                        "' (use all, or a comma list of round-robin, round-robin-reverse, greedy, "
                                        "greedy-reverse, random)");
        }
        parsed.push_back(*schedule);
    }
    if (parsed.empty()) throw std::invalid_argument("ENGINE_EMULATOR_SCHEDULES names no schedule");
    return parsed;
}

Configuration& configuration() {
    static Configuration current = [] {
        Configuration initial;
        const char* schedules = std::getenv("ENGINE_EMULATOR_SCHEDULES");
        initial.schedules = parse_schedules(schedules != nullptr && *schedules != '\0' ? schedules : "round-robin");
        if (const char* seed = std::getenv("ENGINE_EMULATOR_SEED"); seed != nullptr && *seed != '\0') {
            initial.seed = std::strtoull(seed, nullptr, 0);
        }
        if (const char* report = std::getenv("ENGINE_EMULATOR_STATISTICS"); report != nullptr && *report == '1') {
            std::atexit([] {
                const EmulatorStatistics totals = statistics();
                std::fprintf(stderr, "CUDA emulator: %llu launches, %llu blocks, %llu threads, %llu fiber switches\n",
                             static_cast<unsigned long long>(totals.launches), static_cast<unsigned long long>(totals.blocks),
                             static_cast<unsigned long long>(totals.threads), static_cast<unsigned long long>(totals.switches));
            });
        }
        return initial;
    }();
    return current;
}

uint64_t launches_submitted = 0;

uint64_t mix(uint64_t seed, uint64_t value) {
    uint64_t mixed = seed ^ (value + 0x9E3779B97F4A7C15ull + (seed << 6) + (seed >> 2));
    mixed ^= mixed >> 31;
    mixed *= 0xBF58476D1CE4E5B9ull;
    return mixed ^ (mixed >> 29);
}

bool valid_configuration(dim3 grid, dim3 block) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) return false;
    if (grid.x > sm90::max_grid_x || grid.y > sm90::max_grid_y || grid.z > sm90::max_grid_z) return false;
    if (block.x > unsigned(sm90::max_block_x) || block.y > unsigned(sm90::max_block_y) ||
        block.z > unsigned(sm90::max_block_z)) {
        return false;
    }
    return uint64_t(block.x) * block.y * block.z <= uint64_t(sm90::max_threads_per_block);
}

std::vector<Allocation*> written_allocations(const KernelLaunch& launch) {
    std::vector<Allocation*> written;
    for (const PointerArgument& pointer : launch.pointers) {
        Allocation* allocation = pointer.writes ? find_allocation(pointer.pointer) : nullptr;
        if (allocation != nullptr && std::find(written.begin(), written.end(), allocation) == written.end()) {
            written.push_back(allocation);
        }
    }
    return written;
}

std::vector<std::vector<unsigned char>> contents(const std::vector<Allocation*>& allocations) {
    std::vector<std::vector<unsigned char>> copies;
    for (const Allocation* allocation : allocations) copies.emplace_back(allocation->base, allocation->base + allocation->bytes);
    return copies;
}

void restore(const std::vector<Allocation*>& allocations, const std::vector<std::vector<unsigned char>>& copies) {
    for (size_t index = 0; index < allocations.size(); ++index) {
        std::memcpy(allocations[index]->base, copies[index].data(), copies[index].size());
    }
}

std::string describe_difference(const KernelLaunch& launch, Schedule first, Schedule other, const Allocation& allocation,
                                 const std::vector<unsigned char>& expected, size_t offset) {
    std::ostringstream text;
    text << "kernel " << launch.name << " writes different results under schedules " << schedule_name(first) << " and "
         << schedule_name(other) << ": a race between its threads or blocks. First difference at byte " << offset
         << " of the " << allocation.bytes << "-byte allocation " << static_cast<const void*>(allocation.base);
    const size_t word = offset / 4 * 4;
    if (word + 4 <= allocation.bytes) {
        float a, b;
        std::memcpy(&a, expected.data() + word, 4);
        std::memcpy(&b, allocation.base + word, 4);
        text << " (as float: " << a << " vs " << b << ")";
    }
    return text.str();
}

void execute(const KernelLaunch& launch, uint64_t launch_number) {
    const std::vector<Schedule>& schedules = configuration().schedules;
    const uint64_t seed = mix(configuration().seed, launch_number);
    if (schedules.size() == 1) {
        if (auto fault = run_grid(launch, ScheduleChoice{schedules.front(), seed})) raise_fault(cudaErrorLaunchFailure, *fault);
        return;
    }
    const std::vector<Allocation*> written = written_allocations(launch);
    const auto before = contents(written);
    std::vector<std::vector<unsigned char>> first_result;
    for (size_t index = 0; index < schedules.size(); ++index) {
        if (index > 0) restore(written, before);
        if (auto fault = run_grid(launch, ScheduleChoice{schedules[index], seed})) {
            raise_fault(cudaErrorLaunchFailure, *fault);
            return;
        }
        if (index == 0) {
            first_result = contents(written);
            continue;
        }
        for (size_t allocation = 0; allocation < written.size(); ++allocation) {
            const std::vector<unsigned char>& expected = first_result[allocation];
            const unsigned char* actual = written[allocation]->base;
            if (std::memcmp(expected.data(), actual, expected.size()) == 0) continue;
            size_t offset = 0;
            while (expected[offset] == actual[offset]) ++offset;
            raise_fault(cudaErrorLaunchFailure, describe_difference(launch, schedules.front(), schedules[index],
                                                                    *written[allocation], expected, offset));
            return;
        }
    }
}

std::map<const void*, KernelLimits>& kernel_limits() {
    static std::map<const void*, KernelLimits> limits;
    return limits;
}

} // namespace

KernelLimits& limits_of(const void* kernel) {
    auto [entry, inserted] = kernel_limits().try_emplace(kernel, KernelLimits{sm90::default_dynamic_shared_bytes});
    return entry->second;
}

cudaError_t submit_launch(KernelLaunch&& launch) {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    if (sticky_error() != cudaSuccess) return record_error(sticky_error());
    StreamState* stream = find_stream(launch.stream);
    if (stream == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    if (!valid_configuration(launch.grid, launch.block)) return record_error(cudaErrorInvalidConfiguration);
    if (launch.dynamic_shared_bytes > limits_of(launch.kernel).max_dynamic_shared_bytes) {
        return record_error(cudaErrorInvalidValue);
    }
    std::vector<Access> accesses;
    for (const PointerArgument& pointer : launch.pointers) {
        if (pointer.pointer == nullptr) continue;
        Allocation* allocation = find_allocation(pointer.pointer);
        if (allocation == nullptr) {
            std::ostringstream text;
            text << "kernel " << launch.name << ": argument " << pointer.position << " (" << pointer.pointer
                 << ") points to memory that cudaMalloc or cudaHostAlloc did not allocate; on a GPU it is an illegal "
                    "address";
            return record_error(raise_fault(cudaErrorIllegalAddress, text.str()));
        }
        auto same = std::find_if(accesses.begin(), accesses.end(), [&](const Access& access) { return access.allocation == allocation; });
        if (same == accesses.end()) {
            accesses.push_back(Access{allocation, pointer.writes});
        } else {
            same->writes = same->writes || pointer.writes;
        }
    }
    const uint64_t number = ++launches_submitted;
    auto queued = std::make_shared<const KernelLaunch>(std::move(launch));
    Operation operation{std::make_shared<const std::string>(std::string("kernel ") + queued->name),
                        [queued, number] { execute(*queued, number); },
                        {}};
    return record_error(enqueue(*stream, std::move(operation), accesses));
}

void set_schedules(const std::vector<std::string>& names) {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    std::vector<Schedule> parsed;
    for (const std::string& name : names) {
        const std::optional<Schedule> schedule = schedule_from_name(name);
        if (!schedule) throw std::invalid_argument("unknown emulator schedule '" + name + "'");
        parsed.push_back(*schedule);
    }
    if (parsed.empty()) throw std::invalid_argument("set_schedules needs at least one schedule");
    configuration().schedules = std::move(parsed);
}

std::vector<std::string> schedules() {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    std::vector<std::string> names;
    for (Schedule schedule : configuration().schedules) names.emplace_back(schedule_name(schedule));
    return names;
}

EmulatorStatistics statistics() {
    std::lock_guard<std::recursive_mutex> lock(device_mutex());
    const SchedulerStatistics scheduler = scheduler_statistics();
    return EmulatorStatistics{launches_submitted, scheduler.blocks, scheduler.threads, scheduler.switches};
}

} // namespace engine::emulator
