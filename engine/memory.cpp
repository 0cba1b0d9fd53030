// Accounting allocator: counts live and peak bytes per device and category, and forwards to the backend's
// raw allocator (CPU heap, CUDA caching allocator, pinned host pool).
#include "engine/memory.h"

#include <cstdint>
#include <optional>

#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/memory_timeline.h"
#include "engine/profiling.h"

namespace engine {
namespace {

constexpr size_t alignment = 64;

class HeapAllocator final : public RawAllocator {
public:
    void* allocate(size_t bytes, bool* reached_system) override {
        *reached_system = true;
        // Rounding a size within `alignment` of SIZE_MAX up would wrap to a tiny block.
        if (bytes > std::numeric_limits<size_t>::max() - alignment) return nullptr;
        const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        return std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
    }
    void deallocate(void* pointer, size_t) override { std::free(pointer); }
};

// Host memory for offloaded activations, reused by exact size so that steady-state steps allocate nothing.
// On a CUDA build the CUDA layer replaces it with a cudaHostAlloc-backed pool.
class CachingHostPool final : public RawAllocator {
public:
    void* allocate(size_t bytes, bool* reached_system) override {
        auto found = free_blocks_.find(bytes);
        if (found != free_blocks_.end() && !found->second.empty()) {
            void* pointer = found->second.back();
            found->second.pop_back();
            cached_ -= bytes;
            return pointer;
        }
        return heap_.allocate(bytes, reached_system);
    }
    void deallocate(void* pointer, size_t bytes) override {
        free_blocks_[bytes].push_back(pointer);
        cached_ += bytes;
    }
    size_t cached_bytes() const override { return cached_; }
    void release_cache() override {
        for (auto& [bytes, pointers] : free_blocks_)
            for (void* pointer : pointers) heap_.deallocate(pointer, bytes);
        free_blocks_.clear();
        cached_ = 0;
    }

private:
    HeapAllocator heap_;
    std::map<size_t, std::vector<void*>> free_blocks_;
    size_t cached_ = 0;
};

struct DeviceAccount {
    MemoryStats stats;
    RawAllocator* allocator = nullptr;
    size_t limit = SIZE_MAX; // set_memory_limit
};

thread_local const char* last_kernel = nullptr;
thread_local std::optional<OutOfMemoryRecord> thread_out_of_memory;

struct Registry {
    std::mutex mutex;
    HeapAllocator heap;
    CachingHostPool host_pool;
    RawAllocator* pinned = &host_pool;
    DeviceAccount accounts[2];
    Registry() { accounts[0].allocator = &heap; }
};

Registry& registry() {
    static Registry* instance = new Registry(); // never destroyed: tensors may outlive static teardown
    return *instance;
}

int device_index(Device device) { return device == Device::cpu ? 0 : 1; }

RawAllocator* allocator_for(Registry& reg, Device device, MemoryCategory category) {
    if (category == MemoryCategory::pinned_host) return reg.pinned;
    RawAllocator* allocator = reg.accounts[device_index(device)].allocator;
    if (allocator == nullptr) {
        reg.mutex.unlock();
        try {
            cuda::ensure_initialized();
        } catch (...) {
            reg.mutex.lock();
            throw;
        }
        reg.mutex.lock();
        allocator = reg.accounts[device_index(device)].allocator;
        ENGINE_CHECK(allocator != nullptr, "CUDA layer did not install a device allocator");
    }
    return allocator;
}

thread_local MemoryCategory thread_category = MemoryCategory::activations;

} // namespace

const char* memory_category_name(MemoryCategory category) {
    switch (category) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::pinned_host: return "pinned_host";
    case MemoryCategory::count: break;
    }
    return "?";
}

std::string MemoryStats::to_string() const {
    std::ostringstream text;
    text << "current " << current_bytes << " B, peak " << peak_bytes << " B;";
    for (int index = 0; index < memory_category_count; ++index)
        text << " " << memory_category_name(static_cast<MemoryCategory>(index)) << " "
             << current_by_category[index] << " B";
    return text.str();
}

MemoryStats memory_stats(Device device) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    MemoryStats stats = reg.accounts[device_index(device)].stats;
    RawAllocator* allocator = reg.accounts[device_index(device)].allocator;
    stats.cached_bytes = allocator ? allocator->cached_bytes() : 0;
    if (device == Device::cpu) stats.cached_bytes += reg.pinned->cached_bytes();
    return stats;
}

void set_memory_limit(Device device, size_t bytes) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.accounts[device_index(device)].limit = bytes;
}

size_t memory_limit(Device device) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    return reg.accounts[device_index(device)].limit;
}

const OutOfMemoryRecord* last_out_of_memory() { return thread_out_of_memory ? &*thread_out_of_memory : nullptr; }
void clear_out_of_memory() { thread_out_of_memory.reset(); }
void note_last_kernel(const char* op) { last_kernel = op; }

void reset_peak(Device device) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    MemoryStats& stats = reg.accounts[device_index(device)].stats;
    stats.peak_bytes = stats.current_bytes;
    stats.peak_by_category = stats.current_by_category;
}

MemoryCategory current_memory_category() { return thread_category; }
MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category) : previous_(thread_category) {
    thread_category = category;
}
MemoryCategoryScope::~MemoryCategoryScope() { thread_category = previous_; }

void set_raw_allocator(Device device, RawAllocator* allocator) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.accounts[device_index(device)].allocator = allocator;
}

void set_pinned_allocator(RawAllocator* allocator) {
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    reg.pinned = allocator ? allocator : &reg.host_pool;
}

// Pinned blocks must all come from one pool: where a GPU is present, start the CUDA layer (which installs
// its cudaHostAlloc pool) before the first pinned allocation, so no heap block is ever freed into it.
static void start_cuda_for_pinned_memory() {
    static const bool started = [] {
        if (!cuda::device_available()) return false;
        cuda::ensure_initialized();
        return true;
    }();
    (void)started;
}

void* allocate_bytes(Device device, size_t bytes, MemoryCategory category) {
    // Pinned host memory belongs to the host, whatever device asked for it.
    if (category == MemoryCategory::pinned_host) {
        device = Device::cpu;
        start_cuda_for_pinned_memory();
    }
    Registry& reg = registry();
    std::unique_lock lock(reg.mutex);
    RawAllocator* allocator = allocator_for(reg, device, category);
    MemoryStats& stats = reg.accounts[device_index(device)].stats;
    const size_t limit = reg.accounts[device_index(device)].limit;
    const bool over_limit = bytes > limit || stats.current_bytes > limit - bytes;
    bool reached_system = false;
    void* pointer = over_limit ? nullptr : allocator->allocate(bytes, &reached_system);
    if (pointer == nullptr && !over_limit) {
        allocator->release_cache();
        pointer = allocator->allocate(bytes, &reached_system);
    }
    if (pointer == nullptr) {
        OutOfMemoryRecord record;
        record.device = device;
        record.category = category;
        record.requested = bytes;
        record.usage = stats;
        record.limit = limit;
        record.phase = profiling::phase_name(profiling::current_phase());
        record.after_op = last_kernel ? last_kernel : "";
        std::ostringstream text;
        text << "out of memory on " << device_name(device) << " in " << record.phase
             << (record.after_op.empty() ? std::string() : " (after " + record.after_op + ")") << ": requested "
             << bytes << " B for " << memory_category_name(category);
        if (over_limit) text << ", past the account's limit of " << limit << " B (set_memory_limit)";
        text << "; in use: " << stats.to_string()
             << ". Hint: use a smaller per_device_train_batch_size with more gradient_accumulation_steps, "
                "turn on gradient_checkpointing, or offload checkpointed inputs to host memory";
        thread_out_of_memory = std::move(record);
        throw OutOfMemoryError(text.str());
    }
    const int index = static_cast<int>(category);
    if (reached_system) {
        ++stats.system_allocations;
        ++stats.system_allocations_by_category[index];
    }
    stats.current_bytes += bytes;
    stats.current_by_category[index] += bytes;
    if (stats.current_bytes > stats.peak_bytes) stats.peak_bytes = stats.current_bytes;
    if (stats.current_by_category[index] > stats.peak_by_category[index])
        stats.peak_by_category[index] = stats.current_by_category[index];
    if (memory_timeline_recording()) [[unlikely]]
        record_memory_event(device, category, static_cast<int64_t>(bytes));
    return pointer;
}

void deallocate_bytes(Device device, void* pointer, size_t bytes, MemoryCategory category) {
    if (pointer == nullptr) return;
    if (category == MemoryCategory::pinned_host) device = Device::cpu;
    Registry& reg = registry();
    std::lock_guard lock(reg.mutex);
    RawAllocator* allocator =
        category == MemoryCategory::pinned_host ? reg.pinned : reg.accounts[device_index(device)].allocator;
    allocator->deallocate(pointer, bytes);
    MemoryStats& stats = reg.accounts[device_index(device)].stats;
    stats.current_bytes -= bytes;
    stats.current_by_category[static_cast<int>(category)] -= bytes;
    if (memory_timeline_recording()) [[unlikely]]
        record_memory_event(device, category, -static_cast<int64_t>(bytes));
}

} // namespace engine
