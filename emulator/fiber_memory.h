// Inside the emulator: the memory a block's fibers run on, their stacks (pooled per host thread, each above a
// guard page) and the block's dynamic shared memory (ending at a guard page), and the shared-memory poison.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include <boost/context/stack_context.hpp>

#include "emulator/scheduler.h"

namespace engine::emulator::detail {

namespace context = boost::context;

// Kernels keep little on their stacks; ASan's redzones need more.
inline constexpr size_t fiber_stack_bytes = ENGINE_EMULATOR_ASAN ? 512 * 1024 : 64 * 1024;

inline size_t page_bytes() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
}


// One stack per thread slot of a block, mapped once per host thread with a guard page below it (an
// overflow faults instead of corrupting the next stack) and reused by every block after.
class StackPool {
public:
    StackPool() = default;
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;
    ~StackPool() {
        for (const context::stack_context& stack : stacks_) munmap(static_cast<char*>(stack.sp) - stack.size, stack.size);
    }
    const context::stack_context& stack(size_t slot) {
        while (stacks_.size() <= slot) {
            const size_t total = fiber_stack_bytes + page_bytes();
            void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (base == MAP_FAILED) throw std::bad_alloc();
            mprotect(base, page_bytes(), PROT_NONE);
            context::stack_context stack;
            stack.size = total;
            stack.sp = static_cast<char*>(base) + total;
            stacks_.push_back(stack);
            dirty_.push_back(false);
            fake_stacks_.push_back(nullptr);
        }
        return stacks_[slot];
    }
    bool dirty(size_t slot) const { return dirty_[slot]; }
    void set_dirty(size_t slot, bool dirty) { dirty_[slot] = dirty; }
    // ASan's fake stack (detect_stack_use_after_return) of the fibers on this slot. Handing it from one
    // finished fiber to the next, rather than letting ASan destroy and map a new one per thread, is what
    // keeps the ASan stage affordable.
    void*& fake_stack(size_t slot) { return fake_stacks_[slot]; }

private:
    std::vector<context::stack_context> stacks_;
    std::vector<bool> dirty_; // unwound by an exception since it was last cleared (ASan builds)
    std::vector<void*> fake_stacks_;
};

// This host thread's pool.
inline StackPool& stack_pool() {
    thread_local StackPool pool;
    return pool;
}

// The pool owns the stacks; a finished fiber gives nothing back.
struct PooledStack {
    context::stack_context allocate() { throw std::logic_error("PooledStack hands out preallocated stacks only"); }
    void deallocate(context::stack_context&) noexcept {}
};


// Shared memory starts as NaN bytes (0xff): a read before any write shows up instead of a stale value.
inline constexpr unsigned char shared_poison = 0xff;

// The static shared section also holds other kernels' variables and, under ASan, their redzones, which
// must be written without the instrumented memset complaining.
__attribute__((no_sanitize_address)) inline void poison_static_shared(unsigned char* begin, unsigned char* end) {
    for (volatile unsigned char* byte = begin; byte < end; ++byte) *byte = shared_poison;
}

// Dynamic shared memory for one launch: under ASan an exact heap block; otherwise mapped so that its end
// touches a guard page, so reading past it faults.
class DynamicShared {
public:
    explicit DynamicShared(size_t bytes) : bytes_(bytes) {
#if ENGINE_EMULATOR_ASAN
        heap_.resize(bytes == 0 ? 1 : bytes);
        data_ = heap_.data();
#else
        const size_t rounded = (bytes + 15) / 16 * 16;
        mapped_bytes_ = (rounded + page_bytes() - 1) / page_bytes() * page_bytes() + page_bytes();
        void* base = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) throw std::bad_alloc();
        mapped_ = static_cast<unsigned char*>(base);
        unsigned char* guard = mapped_ + mapped_bytes_ - page_bytes();
        mprotect(guard, page_bytes(), PROT_NONE);
        data_ = guard - rounded;
#endif
    }
    ~DynamicShared() {
        if (mapped_ != nullptr) munmap(mapped_, mapped_bytes_);
    }
    DynamicShared(const DynamicShared&) = delete;
    DynamicShared& operator=(const DynamicShared&) = delete;
    unsigned char* data() const { return data_; }
    void poison() { std::memset(data_, shared_poison, bytes_); }

private:
    size_t bytes_;
    unsigned char* data_ = nullptr;
    unsigned char* mapped_ = nullptr;
    size_t mapped_bytes_ = 0;
    std::vector<unsigned char> heap_;
};


} // namespace engine::emulator::detail
