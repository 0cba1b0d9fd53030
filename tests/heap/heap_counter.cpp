// Global operator new and delete counted (tests/heap/heap_counter.h): each block's usable size is added when it is
// made and taken off when it is freed, so the count needs no header of its own and works under ASan's allocator too.
#include "tests/heap/heap_counter.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace engine::testing {
namespace {

std::atomic<size_t> held{0};
std::atomic<size_t> peak{0};

void* counted(void* block) {
    if (block == nullptr) return nullptr;
    const size_t now = held.fetch_add(malloc_usable_size(block)) + malloc_usable_size(block);
    size_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return block;
}

void* allocate(size_t bytes) {
    void* block = counted(std::malloc(bytes == 0 ? 1 : bytes));
    if (block == nullptr) throw std::bad_alloc();
    return block;
}

void* allocate_aligned(size_t bytes, std::align_val_t alignment) {
    const size_t align = static_cast<size_t>(alignment);
    void* block = counted(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    if (block == nullptr) throw std::bad_alloc();
    return block;
}

void release(void* block) {
    if (block == nullptr) return;
    held.fetch_sub(malloc_usable_size(block));
    std::free(block);
}

} // namespace

size_t heap_now() { return held.load(); }
size_t heap_peak() { return peak.load(); }
void reset_heap_peak() { peak.store(held.load()); }

} // namespace engine::testing

using engine::testing::allocate;
using engine::testing::allocate_aligned;
using engine::testing::release;

void* operator new(size_t bytes) { return allocate(bytes); }
void* operator new[](size_t bytes) { return allocate(bytes); }
void* operator new(size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return allocate(bytes);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return allocate(bytes);
    } catch (...) {
        return nullptr;
    }
}
void* operator new(size_t bytes, std::align_val_t alignment) { return allocate_aligned(bytes, alignment); }
void* operator new[](size_t bytes, std::align_val_t alignment) { return allocate_aligned(bytes, alignment); }
void operator delete(void* block) noexcept { release(block); }
void operator delete[](void* block) noexcept { release(block); }
void operator delete(void* block, size_t) noexcept { release(block); }
void operator delete[](void* block, size_t) noexcept { release(block); }
void operator delete(void* block, std::align_val_t) noexcept { release(block); }
void operator delete[](void* block, std::align_val_t) noexcept { release(block); }
void operator delete(void* block, size_t, std::align_val_t) noexcept { release(block); }
void operator delete[](void* block, size_t, std::align_val_t) noexcept { release(block); }
