// The CUDA build's raw allocators: a caching device allocator and a pinned host pool. Both keep freed blocks
// in per-size free lists so that steady-state training makes no cudaMalloc/cudaHostAlloc calls.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/cuda/check.h"
#include "base/cuda/handles.h"
#include "engine/cuda/runtime.h"
#include "engine/memory.h"

namespace engine::cuda {
namespace {

std::atomic<size_t> system_allocations{0};

// Size classes: 512 B granules below 1 MiB, 2 MiB granules above. Exact-class free lists with no
// splitting keep the allocator simple; the granules bound the waste to 512 B or 2 MiB per block, not 2x.
constexpr size_t small_granule = 512, large_granule = size_t(2) << 20, large_threshold = size_t(1) << 20;
size_t size_class(size_t bytes) {
    const size_t granule = bytes <= large_threshold ? small_granule : large_granule;
    const size_t rounded = (bytes + granule - 1) / granule * granule;
    return rounded == 0 ? small_granule : rounded;
}

// Freed blocks are reused by later allocations without synchronization. That is safe because every
// kernel and copy of the engine runs on the one compute stream, so a later use is ordered after every
// earlier use of the same memory. A block that work on another stream still reads carries a fence (an event
// recorded after that work, see fence()): whoever gets the block next makes the compute stream wait for it.
class CachingDeviceAllocator final : public RawAllocator {
public:
    void* allocate(size_t bytes, bool* reached_system) override {
        const size_t rounded = size_class(bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        auto cached = free_lists_.find(rounded);
        if (cached != free_lists_.end() && !cached->second.empty()) {
            CachedBlock block = std::move(cached->second.back());
            cached->second.pop_back();
            cached_bytes_ -= rounded;
            if (block.fence) {
                const cudaError_t status = cudaStreamWaitEvent(compute_stream(), block.fence->get(), 0);
                if (status != cudaSuccess) { // the wait could not be queued: the host waits for the event instead
                    (void)cudaGetLastError();
                    CUDA_CHECK(cudaEventSynchronize(block.fence->get()));
                }
            }
            return block.pointer;
        }
        if (reached_system != nullptr) *reached_system = true;
        void* pointer = system_allocate(rounded);
        if (pointer == nullptr) { // fragmentation across size classes: give the cache back and retry once
            release_cache_locked();
            pointer = system_allocate(rounded);
        }
        return pointer; // nullptr: the accounting layer raises OutOfMemoryError with the usage breakdown
    }

    // Called from Storage's destructor (noexcept): it must never throw.
    void deallocate(void* pointer, size_t bytes) noexcept override {
        if (pointer == nullptr) return;
        const size_t rounded = size_class(bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        CachedBlock block{pointer, std::nullopt};
        if (auto fenced = fences_.find(pointer); fenced != fences_.end()) {
            block.fence.emplace(std::move(fenced->second));
            fences_.erase(fenced);
        }
        try {
            free_lists_[rounded].push_back(std::move(block));
            cached_bytes_ += rounded;
        } catch (const std::bad_alloc&) { // no room to list it: hand it back (cudaFree waits for the device)
            if (cudaFree(pointer) != cudaSuccess) (void)cudaGetLastError();
        }
    }

    // The live block at `pointer` is read by work on another stream that ends with `event`: once freed, it
    // is handed out again only after the compute stream waits for that event. A second fence replaces the
    // first (the later event covers the earlier work on the same stream).
    void fence(void* pointer, base::cuda::Event event) {
        std::lock_guard<std::mutex> lock(mutex_);
        fences_.insert_or_assign(pointer, std::move(event));
    }

    size_t cached_bytes() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return cached_bytes_;
    }

    void release_cache() noexcept override {
        std::lock_guard<std::mutex> lock(mutex_);
        release_cache_locked();
    }

private:
    static void* system_allocate(size_t bytes) {
        void* pointer = nullptr;
        ++system_allocations;
        const cudaError_t status = cudaMalloc(&pointer, bytes);
        if (status == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError(); // clear the error so that later launch checks do not report it
            return nullptr;
        }
        CUDA_CHECK(status);
        return pointer;
    }

    // Never throws: it runs in allocate's retry, where the caller only wants memory back. Each block leaves
    // the list before it is freed, so a failure cannot leave a freed pointer to be handed out again; a block
    // whose cudaFree fails (a sticky fault, or the runtime unloading) is dropped, and the fault is reported
    // by the next checked call.
    void release_cache_locked() noexcept {
        // cudaFree waits for the device, so blocks still read by queued kernels are not pulled away early.
        for (auto& [size, blocks] : free_lists_) {
            while (!blocks.empty()) {
                const CachedBlock block = std::move(blocks.back());
                blocks.pop_back();
                cached_bytes_ -= size;
                if (block.fence && cudaEventSynchronize(block.fence->get()) != cudaSuccess) {
                    (void)cudaGetLastError();
                    continue; // still read elsewhere for all we know: leaked rather than freed under a copy
                }
                if (cudaFree(block.pointer) != cudaSuccess) (void)cudaGetLastError();
            }
        }
    }

    struct CachedBlock {
        void* pointer;
        std::optional<base::cuda::Event> fence; // recorded after the last other-stream work that reads it
    };

    mutable std::mutex mutex_;
    std::unordered_map<size_t, std::vector<CachedBlock>> free_lists_;
    std::unordered_map<void*, base::cuda::Event> fences_; // live blocks still read on another stream
    size_t cached_bytes_ = 0;
};

// Host staging memory from cudaHostAlloc. A freed block may still be the source of an asynchronous copy on
// the compute stream, so each free records an event and reuse waits for it. The host writes these blocks, so
// the wait is the host's: to keep it rare, reuse takes a block whose event has already completed, and else
// the block freed longest ago (the most recently freed one was released after everything the host has
// queued, so waiting for it would wait for the whole queue: e.g. an upload's staging block, freed just
// before the next upload asks for one). A block whose event cannot be recorded is never reused or freed
// (leaked): nothing would say when its copies end.
class PinnedHostPool final : public RawAllocator {
public:
    void* allocate(size_t bytes, bool* reached_system) override {
        const size_t rounded = size_class(bytes);
        std::optional<FreeBlock> block;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto cached = free_lists_.find(rounded);
            if (cached != free_lists_.end() && !cached->second.empty()) {
                std::vector<FreeBlock>& blocks = cached->second; // in the order they were freed
                auto chosen = std::find_if(blocks.begin(), blocks.end(), [](const FreeBlock& candidate) {
                    const cudaError_t status = cudaEventQuery(candidate.released.get());
                    if (status != cudaSuccess && status != cudaErrorNotReady) (void)cudaGetLastError();
                    return status == cudaSuccess;
                });
                if (chosen == blocks.end()) chosen = blocks.begin();
                block.emplace(std::move(*chosen));
                blocks.erase(chosen);
                cached_bytes_ -= rounded;
            }
        }
        if (block) {
            block->released.synchronize();
            return block->pointer;
        }
        if (reached_system != nullptr) *reached_system = true;
        void* pointer = system_allocate(rounded);
        if (pointer == nullptr) {
            release_cache();
            pointer = system_allocate(rounded);
        }
        return pointer;
    }

    // Called from Storage's destructor (noexcept), also after a sticky fault or while the runtime unloads at
    // exit: it must never throw, so it calls the runtime directly and leaks the block on any failure.
    void deallocate(void* pointer, size_t bytes) noexcept override {
        if (pointer == nullptr) return;
        cudaEvent_t raw_event = nullptr;
        if (cudaEventCreateWithFlags(&raw_event, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            return;
        }
        base::cuda::Event released = base::cuda::Event::adopt(raw_event);
        cudaStream_t stream = nullptr;
        try {
            stream = compute_stream(); // initialized already in practice: the pool is installed by it
        } catch (...) {
            return;
        }
        if (cudaEventRecord(released.get(), stream) != cudaSuccess) {
            (void)cudaGetLastError();
            return;
        }
        const size_t rounded = size_class(bytes);
        std::lock_guard<std::mutex> lock(mutex_);
        try {
            free_lists_[rounded].push_back(FreeBlock{pointer, std::move(released)});
            cached_bytes_ += rounded;
        } catch (const std::bad_alloc&) { // no room to list it: leak it rather than free it under a copy
        }
    }

    size_t cached_bytes() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return cached_bytes_;
    }

    // Never throws, for the same reasons as the device allocator's: each block leaves the list before it is
    // freed, and one whose event cannot be waited for is leaked rather than freed under a running copy.
    void release_cache() noexcept override {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [size, blocks] : free_lists_) {
            while (!blocks.empty()) {
                const FreeBlock block = std::move(blocks.back());
                blocks.pop_back();
                cached_bytes_ -= size;
                if (cudaEventSynchronize(block.released.get()) != cudaSuccess) {
                    (void)cudaGetLastError();
                    continue;
                }
                if (cudaFreeHost(block.pointer) != cudaSuccess) (void)cudaGetLastError();
            }
        }
    }

private:
    struct FreeBlock {
        void* pointer;
        base::cuda::Event released; // recorded on the compute stream when the block was freed
    };

    static void* system_allocate(size_t bytes) {
        void* pointer = nullptr;
        ++system_allocations;
        const cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocDefault);
        if (status == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return nullptr;
        }
        CUDA_CHECK(status);
        return pointer;
    }

    mutable std::mutex mutex_;
    std::unordered_map<size_t, std::vector<FreeBlock>> free_lists_;
    size_t cached_bytes_ = 0;
};

// Never destroyed: tensors with static lifetime may be freed after any static destructor would have run.
CachingDeviceAllocator& device_allocator() {
    static CachingDeviceAllocator* allocator = new CachingDeviceAllocator();
    return *allocator;
}

} // namespace

// Called once by ensure_initialized() (engine/cuda/runtime.cpp).
void install_caching_allocators() {
    static PinnedHostPool* pinned_pool = new PinnedHostPool();
    set_raw_allocator(Device::cuda, &device_allocator());
    set_pinned_allocator(pinned_pool);
}

void fence_device_block(void* pointer, base::cuda::Event event) { device_allocator().fence(pointer, std::move(event)); }

size_t system_allocation_count() { return system_allocations.load(); }

} // namespace engine::cuda
