// Per-device allocation with accounting by category: every tensor byte in the engine passes through here.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "engine/dtype.h"

namespace engine {

enum class MemoryCategory { parameters, gradients, optimizer_state, activations, workspace, pinned_host, count };
inline constexpr int memory_category_count = static_cast<int>(MemoryCategory::count);
const char* memory_category_name(MemoryCategory category);

struct MemoryStats {
    size_t current_bytes = 0; // live bytes in all categories
    size_t peak_bytes = 0;    // high-water mark of current_bytes since the last reset_peak
    std::array<size_t, memory_category_count> current_by_category{};
    std::array<size_t, memory_category_count> peak_by_category{}; // each category's own high-water mark
    size_t system_allocations = 0; // calls that reached the system allocator (malloc, cudaMalloc, cudaHostAlloc)
    // The same count split by the category that asked, so that one pool (e.g. pinned_host) can be watched.
    std::array<size_t, memory_category_count> system_allocations_by_category{};
    size_t cached_bytes = 0;       // bytes held by caches for reuse, not live

    size_t current(MemoryCategory category) const { return current_by_category[static_cast<int>(category)]; }
    size_t peak(MemoryCategory category) const { return peak_by_category[static_cast<int>(category)]; }
    size_t system_allocations_for(MemoryCategory category) const {
        return system_allocations_by_category[static_cast<int>(category)];
    }
    std::string to_string() const;
};

MemoryStats memory_stats(Device device);
void reset_peak(Device device);

// The current category for new tensors: op outputs default to activations. Scoped and per thread.
MemoryCategory current_memory_category();
class MemoryCategoryScope {
public:
    explicit MemoryCategoryScope(MemoryCategory category);
    ~MemoryCategoryScope();
    MemoryCategoryScope(const MemoryCategoryScope&) = delete;
    MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

private:
    MemoryCategory previous_;
};

// A backend's raw allocator. Accounting lives above it, so every backend reports the same way.
// pinned_host memory is host memory: on a CUDA build it comes from cudaHostAlloc, else from the CPU heap,
// and it is always accounted under Device::cpu.
struct RawAllocator {
    virtual ~RawAllocator() = default;
    // Returns nullptr when the memory is not available (the caller reports out-of-memory).
    virtual void* allocate(size_t bytes, bool* reached_system) = 0;
    virtual void deallocate(void* pointer, size_t bytes) = 0;
    virtual size_t cached_bytes() const { return 0; }
    virtual void release_cache() {}
};

// Installs the backend allocators; the CUDA layer installs its own at first use. Not thread-safe with
// concurrent allocation.
void set_raw_allocator(Device device, RawAllocator* allocator);
void set_pinned_allocator(RawAllocator* allocator);

// Allocate/free with accounting. Throws OutOfMemoryError with the request, usage by category and a hint.
void* allocate_bytes(Device device, size_t bytes, MemoryCategory category);

// A limit on `device`'s account (train_gpt --memory-limit): an allocation that would take its live bytes past
// `bytes` fails as out of memory, as on a device of that size. SIZE_MAX (the default): none.
void set_memory_limit(Device device, size_t bytes);
size_t memory_limit(Device device);

// What the calling thread's last out-of-memory failure was (the error's message says the same in words): for
// a caller that reports it against the plan (train_gpt). Reset by clear_out_of_memory().
struct OutOfMemoryRecord {
    Device device = Device::cpu;
    MemoryCategory category = MemoryCategory::activations;
    size_t requested = 0;
    MemoryStats usage;     // the account when it failed
    size_t limit = 0;      // memory_limit(device) then (SIZE_MAX: none)
    std::string phase;     // profiling::current_phase's name: forward, backward, grad_norm, optimizer
    std::string after_op;  // the last kernel dispatched on the thread before the failure ("" when none)
};
const OutOfMemoryRecord* last_out_of_memory();
void clear_out_of_memory();
// The dispatch helpers' note of each kernel, for OutOfMemoryRecord::after_op (one store).
void note_last_kernel(const char* op);
void deallocate_bytes(Device device, void* pointer, size_t bytes, MemoryCategory category);

} // namespace engine
