// The emulated device's execution model: a block's threads as cooperatively scheduled fibers, barriers and
// warp collectives as the only switch points, and the checks the hardware leaves undefined (a collective
// naming a lane that exited or does not exist, a barrier some threads never reach, deadlock).
#include "emulator/scheduler.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>

#include "emulator/fiber_memory.h"
#include "emulator/ready_queue.h"

#if ENGINE_EMULATOR_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace engine::emulator {

__thread uint3 current_thread_index __attribute__((tls_model("initial-exec"))) = {0, 0, 0};
__thread uint3 current_block_index __attribute__((tls_model("initial-exec"))) = {0, 0, 0};
__thread uint3 current_block_dim __attribute__((tls_model("initial-exec"))) = {1, 1, 1};
__thread uint3 current_grid_dim __attribute__((tls_model("initial-exec"))) = {1, 1, 1};

namespace {

namespace context = boost::context;
using detail::BlockOrder;
using detail::DynamicShared;
using detail::PooledStack;
using detail::ReadyQueue;
using detail::poison_static_shared;
using detail::stack_pool;

constexpr int warp_lanes = 32;

SchedulerStatistics statistics;

// Thrown inside a fiber to unwind it after a fault elsewhere in the block.
struct KernelAbort {};

enum class ThreadStatus : uint8_t { ready, waiting_block, waiting_warp, finished };

struct EmulatedThread {
    uint3 index{};
    int warp = 0, lane = 0;
    ThreadStatus status = ThreadStatus::ready;
    bool started = false;
    context::fiber self;      // resumes this thread (held by the scheduler while the thread is suspended)
    context::fiber scheduler; // resumes the scheduler (held by the thread while it runs)
    LaneRequest request{};    // while waiting_warp
    int barrier_result = 0;
};

struct WarpState {
    unsigned existing = 0, exited = 0, arrived = 0;
};

std::string lanes_text(unsigned lanes) {
    std::ostringstream text;
    const char* separator = "";
    for (int lane = 0; lane < warp_lanes; ++lane) {
        if (lanes & (1u << lane)) {
            text << separator << lane;
            separator = ",";
        }
    }
    return text.str();
}

std::string mask_text(unsigned mask) {
    std::ostringstream text;
    text << "0x" << std::hex << mask;
    return text.str();
}

std::string coordinates_text(uint3 value) {
    std::ostringstream text;
    text << "(" << value.x << "," << value.y << "," << value.z << ")";
    return text.str();
}

class BlockRun;
thread_local BlockRun* running_block = nullptr;
thread_local const char* running_kernel_name = nullptr;

class BlockRun final : public WarpExchange {
public:
    BlockRun(const KernelLaunch& launch, ScheduleChoice choice)
        : launch_(launch), choice_(choice), dynamic_shared_(launch.dynamic_shared_bytes) {
        const dim3 block = launch.block;
        thread_count_ = static_cast<int>(block.x * block.y * block.z);
        threads_.resize(static_cast<size_t>(thread_count_));
        warps_.resize(static_cast<size_t>((thread_count_ + warp_lanes - 1) / warp_lanes));
        for (int linear = 0; linear < thread_count_; ++linear) {
            EmulatedThread& thread = threads_[static_cast<size_t>(linear)];
            const unsigned x = static_cast<unsigned>(linear) % block.x;
            const unsigned y = static_cast<unsigned>(linear) / block.x % block.y;
            const unsigned z = static_cast<unsigned>(linear) / (block.x * block.y);
            thread.index = uint3{x, y, z};
            thread.warp = linear / warp_lanes;
            thread.lane = linear % warp_lanes;
        }
        for (size_t slot = 0; slot < static_cast<size_t>(thread_count_); ++slot) (void)stack_pool().stack(slot);
    }

    unsigned char* dynamic_shared() const { return dynamic_shared_.data(); }

    std::optional<std::string> run(uint3 block_index, uint64_t block_seed) {
        current_block_index = block_index;
        block_index_ = block_index;
        dynamic_shared_.poison();
        poison_static_shared(launch_.static_shared_begin, launch_.static_shared_end);
        for (EmulatedThread& thread : threads_) {
            thread.status = ThreadStatus::ready;
            thread.started = false;
        }
        for (size_t warp = 0; warp < warps_.size(); ++warp) {
            const int lanes = std::min(warp_lanes, thread_count_ - static_cast<int>(warp) * warp_lanes);
            warps_[warp] = WarpState{lanes == warp_lanes ? ~0u : (1u << lanes) - 1u, 0, 0};
        }
        barrier_waiting_ = barrier_count_ = finished_count_ = 0;
        fault_.reset();
        aborting_ = false;
        queue_.reset(ScheduleChoice{choice_.schedule, block_seed}, thread_count_);
        push_range(0, thread_count_);

        while (!fault_ && !queue_.empty()) resume(queue_.pop());
        if (!fault_ && finished_count_ < thread_count_) fault_ = describe_deadlock();
        if (fault_) {
            aborting_ = true; // every suspended thread unwinds from its sync point
            for (int thread = 0; thread < thread_count_; ++thread) {
                EmulatedThread& state = threads_[static_cast<size_t>(thread)];
                if (state.started && state.status != ThreadStatus::finished) resume(thread);
            }
        }
        return fault_;
    }

    int barrier(BarrierReduction reduction, int predicate) {
        EmulatedThread& thread = current();
        check_abort();
        if (finished_count_ > 0) {
            fail_thread(thread, "__syncthreads() reached after " + std::to_string(finished_count_) + " of the block's " +
                                    std::to_string(thread_count_) +
                                    " threads exited: every thread of the block must reach the barrier");
        }
        thread.status = ThreadStatus::waiting_block;
        ++barrier_waiting_;
        barrier_count_ += predicate != 0 ? 1 : 0;
        if (barrier_waiting_ == thread_count_) {
            int result = 0;
            switch (reduction) {
            case BarrierReduction::none: break;
            case BarrierReduction::count: result = barrier_count_; break;
            case BarrierReduction::all: result = barrier_count_ == thread_count_ ? 1 : 0; break;
            case BarrierReduction::any: result = barrier_count_ > 0 ? 1 : 0; break;
            }
            for (EmulatedThread& waiting : threads_) waiting.barrier_result = result;
            barrier_waiting_ = barrier_count_ = 0;
            push_range(0, thread_count_);
        }
        yield(thread);
        check_abort();
        return thread.barrier_result;
    }

    void collective(const LaneRequest& request) {
        EmulatedThread& thread = current();
        check_abort();
        WarpState& warp = warps_[static_cast<size_t>(thread.warp)];
        const unsigned own = 1u << thread.lane;
        // The messages are built only on failure: this runs once per lane per collective.
        auto call = [&] { return std::string(request.kind->name) + " with mask " + mask_text(request.mask); };
        if ((request.mask & own) == 0) fail_thread(thread, call() + " does not name the calling lane " + std::to_string(thread.lane));
        if ((request.mask & ~warp.existing) != 0) {
            fail_thread(thread, call() + " names lanes " + lanes_text(request.mask & ~warp.existing) + " that do not exist: warp " +
                                    std::to_string(thread.warp) + " of this " + std::to_string(thread_count_) +
                                    "-thread block has only lanes " + lanes_text(warp.existing));
        }
        if ((request.mask & warp.exited) != 0) {
            fail_thread(thread, call() + " names lanes " + lanes_text(request.mask & warp.exited) + " that have exited");
        }
        thread.request = request;
        thread.status = ThreadStatus::waiting_warp;
        warp.arrived |= own;
        if ((warp.arrived & request.mask) == request.mask) complete_collective(thread, request);
        yield(thread);
        check_abort();
    }

    // WarpExchange, for the combine function of the collective being completed.
    unsigned mask() const override { return exchange_mask_; }
    const LaneRequest& request(int lane) const override {
        return threads_[static_cast<size_t>(exchange_warp_ * warp_lanes + lane)].request;
    }
    [[noreturn]] void fail(int lane, const char* message) override {
        fail_thread(threads_[static_cast<size_t>(exchange_warp_ * warp_lanes + lane)], message);
    }

private:
    EmulatedThread& current() { return threads_[static_cast<size_t>(running_thread_)]; }

    void check_abort() const {
        if (aborting_) throw KernelAbort{};
    }

    [[noreturn]] void fail_thread(const EmulatedThread& thread, const std::string& what) {
        if (!fault_) {
            std::ostringstream text;
            text << "kernel " << launch_.name << ", block " << coordinates_text(block_index_) << ", thread "
                 << coordinates_text(thread.index) << " (warp " << thread.warp << ", lane " << thread.lane << "): " << what
                 << " [schedule " << schedule_name(choice_.schedule) << "]";
            fault_ = text.str();
        }
        aborting_ = true;
        throw KernelAbort{};
    }

    void push_range(int begin, int end) {
        if (queue_.reverse()) {
            for (int thread = end; thread-- > begin;) make_ready(thread);
        } else {
            for (int thread = begin; thread < end; ++thread) make_ready(thread);
        }
    }
    void make_ready(int thread) {
        threads_[static_cast<size_t>(thread)].status = ThreadStatus::ready;
        queue_.push(thread);
    }

    void complete_collective(const EmulatedThread& arriving, const LaneRequest& request) {
        const int warp_index = arriving.warp;
        for (int lane = 0; lane < warp_lanes; ++lane) {
            if ((request.mask & (1u << lane)) == 0) continue;
            const EmulatedThread& other = threads_[static_cast<size_t>(warp_index * warp_lanes + lane)];
            if (other.request.kind != request.kind || other.request.mask != request.mask) {
                fail_thread(arriving, std::string("lanes of warp ") + std::to_string(warp_index) + " meet in different warp collectives: lane " +
                                          std::to_string(arriving.lane) + " in " + request.kind->name + " (mask " +
                                          mask_text(request.mask) + "), lane " + std::to_string(lane) + " in " +
                                          other.request.kind->name + " (mask " + mask_text(other.request.mask) + ")");
            }
        }
        exchange_warp_ = warp_index;
        exchange_mask_ = request.mask;
        request.kind->combine(*this);
        warps_[static_cast<size_t>(warp_index)].arrived &= ~request.mask;
        const int first = warp_index * warp_lanes;
        if (queue_.reverse()) {
            for (int lane = warp_lanes; lane-- > 0;) {
                if (request.mask & (1u << lane)) make_ready(first + lane);
            }
        } else {
            for (int lane = 0; lane < warp_lanes; ++lane) {
                if (request.mask & (1u << lane)) make_ready(first + lane);
            }
        }
    }

    void finish(EmulatedThread& thread) {
        thread.status = ThreadStatus::finished;
        ++finished_count_;
        WarpState& warp = warps_[static_cast<size_t>(thread.warp)];
        const unsigned own = 1u << thread.lane;
        warp.exited |= own;
        if (barrier_waiting_ > 0) {
            fail_thread(thread, "exited while " + std::to_string(barrier_waiting_) +
                                    " threads of the block wait at __syncthreads() for it");
        }
        for (int lane = 0; lane < warp_lanes; ++lane) {
            if ((warp.arrived & (1u << lane)) == 0) continue;
            const LaneRequest& waiting = threads_[static_cast<size_t>(thread.warp * warp_lanes + lane)].request;
            if (waiting.mask & own) {
                fail_thread(thread, "exited while lane " + std::to_string(lane) + " waits for it in " + waiting.kind->name +
                                        " with mask " + mask_text(waiting.mask));
            }
        }
    }

    std::string describe_deadlock() const {
        std::ostringstream text;
        text << "kernel " << launch_.name << ", block " << coordinates_text(block_index_) << ": deadlock, "
             << finished_count_ << " of " << thread_count_ << " threads finished";
        if (barrier_waiting_ > 0) text << ", " << barrier_waiting_ << " wait at __syncthreads()";
        for (size_t warp = 0; warp < warps_.size(); ++warp) {
            if (warps_[warp].arrived == 0) continue;
            text << ", warp " << warp << " lanes " << lanes_text(warps_[warp].arrived) << " wait in ";
            const LaneRequest& request = threads_[warp * warp_lanes + static_cast<size_t>(std::countr_zero(warps_[warp].arrived))].request;
            text << request.kind->name << " (mask " << mask_text(request.mask) << ")";
        }
        text << " [schedule " << schedule_name(choice_.schedule) << "]";
        return text.str();
    }

    void resume(int index) {
        EmulatedThread& thread = threads_[static_cast<size_t>(index)];
        running_thread_ = index;
        current_thread_index = thread.index;
        const context::stack_context& stack = stack_pool().stack(static_cast<size_t>(index));
        if (!thread.started) {
            thread.started = true;
#if ENGINE_EMULATOR_ASAN
            // A fiber that returned normally left its stack clean; one unwound by an exception may have
            // left redzones behind. Clearing every stack every time would cost more than the kernels.
            if (stack_pool().dirty(static_cast<size_t>(index))) {
                __asan_unpoison_memory_region(static_cast<char*>(stack.sp) - stack.size, stack.size);
                stack_pool().set_dirty(static_cast<size_t>(index), false);
            }
#endif
            thread.self = context::fiber(std::allocator_arg, context::preallocated(stack.sp, stack.size, stack),
                                         PooledStack{}, [this, index](context::fiber&& scheduler) {
                                             return thread_entry(index, std::move(scheduler));
                                         });
        }
        ++statistics.switches;
#if ENGINE_EMULATOR_ASAN
        __sanitizer_start_switch_fiber(&scheduler_fake_stack_, static_cast<char*>(stack.sp) - stack.size, stack.size);
#endif
        thread.self = std::move(thread.self).resume();
#if ENGINE_EMULATOR_ASAN
        __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
    }

    context::fiber thread_entry(int index, context::fiber&& scheduler) {
#if ENGINE_EMULATOR_ASAN
        __sanitizer_finish_switch_fiber(stack_pool().fake_stack(static_cast<size_t>(index)), &scheduler_stack_bottom_,
                                        &scheduler_stack_size_);
#endif
        EmulatedThread& thread = threads_[static_cast<size_t>(index)];
        thread.scheduler = std::move(scheduler);
        try {
            launch_.run_thread();
            finish(thread);
        } catch (const context::detail::forced_unwind&) {
            throw; // Boost unwinding a fiber that is being destroyed: it must reach Boost's entry point
        } catch (const KernelAbort&) {
            stack_pool().set_dirty(static_cast<size_t>(index), true);
        } catch (const std::exception& error) {
            stack_pool().set_dirty(static_cast<size_t>(index), true);
            if (!fault_) fault_ = std::string("kernel ") + launch_.name + " threw: " + error.what();
        } catch (...) {
            stack_pool().set_dirty(static_cast<size_t>(index), true);
            if (!fault_) fault_ = std::string("kernel ") + launch_.name + " threw a non-standard exception";
        }
        if (thread.status != ThreadStatus::finished) {
            thread.status = ThreadStatus::finished;
            ++finished_count_;
        }
#if ENGINE_EMULATOR_ASAN
        __sanitizer_start_switch_fiber(&stack_pool().fake_stack(static_cast<size_t>(index)), scheduler_stack_bottom_,
                                       scheduler_stack_size_);
#endif
        return std::move(thread.scheduler);
    }

    void yield(EmulatedThread& thread) {
#if ENGINE_EMULATOR_ASAN
        void*& fake_stack = stack_pool().fake_stack(static_cast<size_t>(running_thread_));
        __sanitizer_start_switch_fiber(&fake_stack, scheduler_stack_bottom_, scheduler_stack_size_);
#endif
        thread.scheduler = std::move(thread.scheduler).resume();
#if ENGINE_EMULATOR_ASAN
        __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    }

    const KernelLaunch& launch_;
    ScheduleChoice choice_;
    DynamicShared dynamic_shared_;
    int thread_count_ = 0;
    std::vector<EmulatedThread> threads_;
    std::vector<WarpState> warps_;
    ReadyQueue queue_;
    uint3 block_index_{};
    int running_thread_ = 0;
    int barrier_waiting_ = 0, barrier_count_ = 0, finished_count_ = 0;
    std::optional<std::string> fault_;
    bool aborting_ = false;
    int exchange_warp_ = 0;
    unsigned exchange_mask_ = 0;
    void* scheduler_fake_stack_ = nullptr;
    const void* scheduler_stack_bottom_ = nullptr;
    size_t scheduler_stack_size_ = 0;
};

BlockRun& block_for_device_call(const char* what) {
    if (running_block == nullptr) throw std::logic_error(std::string(what) + " called outside an emulated kernel");
    return *running_block;
}

} // namespace

int block_barrier(BarrierReduction reduction, int predicate) {
    return block_for_device_call("__syncthreads").barrier(reduction, predicate);
}

void warp_collective(const LaneRequest& request) { block_for_device_call(request.kind->name).collective(request); }

unsigned char* dynamic_shared_bytes() { return block_for_device_call("dynamic shared memory").dynamic_shared(); }

const char* schedule_name(Schedule schedule) {
    switch (schedule) {
    case Schedule::round_robin: return "round-robin";
    case Schedule::round_robin_reverse: return "round-robin-reverse";
    case Schedule::greedy: return "greedy";
    case Schedule::greedy_reverse: return "greedy-reverse";
    case Schedule::random: return "random";
    }
    return "unknown";
}

std::optional<Schedule> schedule_from_name(const std::string& name) {
    for (Schedule schedule : all_schedules) {
        if (name == schedule_name(schedule)) return schedule;
    }
    return std::nullopt;
}

// Restores the thread's running block even when a launch throws.
class RunningBlockScope {
public:
    RunningBlockScope(BlockRun* block, const char* name) : outer_(running_block), outer_name_(running_kernel_name) {
        running_block = block;
        running_kernel_name = name;
    }
    ~RunningBlockScope() {
        running_block = outer_;
        running_kernel_name = outer_name_;
    }
    RunningBlockScope(const RunningBlockScope&) = delete;
    RunningBlockScope& operator=(const RunningBlockScope&) = delete;

private:
    BlockRun* outer_;
    const char* outer_name_;
};

std::optional<std::string> run_grid(const KernelLaunch& launch, ScheduleChoice choice) {
    install_signal_stack();
    BlockRun block(launch, choice);
    const dim3 grid = launch.grid;
    const uint64_t block_count = uint64_t(grid.x) * grid.y * grid.z;
    const BlockOrder order(choice.schedule, choice.seed, block_count);
    current_grid_dim = uint3{grid.x, grid.y, grid.z};
    current_block_dim = uint3{launch.block.x, launch.block.y, launch.block.z};
    const RunningBlockScope running(&block, launch.name);
    std::optional<std::string> fault;
    for (uint64_t position = 0; position < block_count; ++position) {
        const uint64_t linear = order[position];
        const uint3 index{static_cast<unsigned>(linear % grid.x), static_cast<unsigned>(linear / grid.x % grid.y),
                          static_cast<unsigned>(linear / (uint64_t(grid.x) * grid.y))};
        ++statistics.blocks;
        statistics.threads += uint64_t(launch.block.x) * launch.block.y * launch.block.z;
        fault = block.run(index, choice.seed ^ (linear * 0x9E3779B97F4A7C15ull));
        if (fault) break;
    }
    return fault;
}

SchedulerStatistics scheduler_statistics() { return statistics; }

RunningKernel running_kernel() { return RunningKernel{running_kernel_name, current_block_index, current_thread_index}; }

} // namespace engine::emulator
