// Inside the emulator: the one emulated device's state shared by the runtime API (runtime_api.cpp), the
// allocation table (memory.cpp), streams and events (streams.cpp) and cuBLAS (cublas.cpp). Every entry
// point takes device_mutex() first; nothing here is for kernels or the engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emulator/cuda_emulation.h"

namespace engine::emulator {

std::recursive_mutex& device_mutex();

// ---- errors: the thread's last error, and the sticky fault that ends the emulated context ----
cudaError_t record_error(cudaError_t status); // sets the thread's last error when status is an error
cudaError_t sticky_error();                   // cudaSuccess until a fault
// Ends the context like a device fault: every later call returns `status`; queued work is dropped. The
// message is printed and becomes cudaGetErrorString(status)'s text.
cudaError_t raise_fault(cudaError_t status, const std::string& message);
const char* sticky_message();
void clear_sticky_fault();

// ---- device memory (cudaMalloc) and pinned host memory (cudaHostAlloc) ----
using Clock = std::vector<uint64_t>; // a vector clock: per stream id, the last sequence ordered before

struct StreamAccesses {
    uint64_t last_read = 0, last_write = 0; // sequences on that stream
    std::shared_ptr<const std::string> reader, writer; // what did it, for the report
};

struct Allocation {
    unsigned char* base = nullptr;
    size_t bytes = 0;
    bool pinned = false;
    std::vector<StreamAccesses> accesses; // by stream id
};

// The allocation that contains `pointer` (one past the end counts), or nullptr.
Allocation* find_allocation(const void* pointer);
cudaError_t allocate(void** pointer, size_t bytes, bool pinned);
cudaError_t release(void* pointer, bool pinned);
size_t device_bytes_in_use();
size_t device_capacity();

// ---- streams, events and the deferred queue ----
struct StreamState;
struct Operation {
    std::shared_ptr<const std::string> description;
    std::function<void()> run;
    std::vector<std::pair<StreamState*, uint64_t>> waits; // run those streams up to these sequences first
};

struct StreamState {
    int id = 0;
    bool blocking = true; // synchronizes with the legacy default stream
    bool legacy = false;
    bool destroyed = false;
    std::deque<Operation> pending;
    uint64_t enqueued = 0, completed = 0;
    Clock tail;
};

struct EventState {
    bool recorded = false;
    StreamState* stream = nullptr;
    uint64_t sequence = 0;
    Clock clock;
    unsigned flags = 0;
    // When the record last ran; cudaEventElapsedTime reports the host time the emulated work took.
    std::shared_ptr<std::chrono::steady_clock::time_point> completed_at;
};

struct Access {
    Allocation* allocation;
    bool writes;
};

StreamState* legacy_stream();
// nullptr for a handle that is not a live stream; 0, cudaStreamLegacy and cudaStreamPerThread give the
// legacy stream.
StreamState* find_stream(cudaStream_t handle);
StreamState* create_stream(bool blocking);
void destroy_stream(StreamState* stream);

// Queues `operation` after checking its accesses against every other stream's for races (an access not
// ordered after a conflicting one by stream order, events or host synchronization). A race raises a fault.
cudaError_t enqueue(StreamState& stream, Operation&& operation, const std::vector<Access>& accesses);
void count_operation(const std::string& description); // enqueue's census (testing.h's stream_operations)
// Running queued work early is always allowed (race detection goes by the clocks, not by what ran); only
// the calls CUDA defines as synchronizing order the host after work, through order_host_after.
void run_until(StreamState& stream, uint64_t sequence); // runs queued work, oldest first
void run_all(StreamState& stream);
void order_host_after(const Clock& clock);
void synchronize_stream(StreamState& stream);              // run_all, and the host is ordered after it
void synchronize_device();
void drop_pending_work(); // after a fault: nothing queued will ever run

EventState* find_event(cudaEvent_t handle);
EventState* create_event(unsigned flags);
void destroy_event(EventState* event);
cudaError_t record_event(EventState& event, StreamState& stream);
cudaError_t wait_event(StreamState& stream, const EventState& event);
void synchronize_event(const EventState& event);

// ---- the emulated device's limits: sm_90's, as an H100/H200 reports them ----
namespace sm90 {
inline constexpr int max_threads_per_block = 1024;
inline constexpr int max_block_x = 1024, max_block_y = 1024, max_block_z = 64;
inline constexpr unsigned max_grid_x = 2147483647u, max_grid_y = 65535u, max_grid_z = 65535u;
inline constexpr size_t default_dynamic_shared_bytes = 48 * 1024; // without cudaFuncSetAttribute
inline constexpr size_t opt_in_dynamic_shared_bytes = 232448;     // 227 KiB, the most it may raise to
inline constexpr size_t shared_bytes_per_multiprocessor = 233472;
inline constexpr int multiprocessors = 132;
} // namespace sm90

// ---- launches ----
struct KernelLimits {
    size_t max_dynamic_shared_bytes;
};
KernelLimits& limits_of(const void* kernel);

} // namespace engine::emulator
