// Emulated device memory is host memory. Each cudaMalloc block starts as NaN bytes (like the garbage a
// real one holds) and is placed so that its end touches an inaccessible guard page: a kernel reading or
// writing past it faults, and the fault is reported with the allocation and the kernel thread. Under
// AddressSanitizer the blocks come from the instrumented heap instead, which catches every byte.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "emulator/device.h"
#include "emulator/scheduler.h"


namespace engine::emulator {
namespace {

constexpr unsigned char device_poison = 0xff; // NaN as float, double and bf16
constexpr size_t device_alignment = 16;       // float4 loads stay aligned; a real cudaMalloc gives 256

struct Mapping {
    void* start = nullptr;
    size_t bytes = 0;
};

struct Table {
    std::map<uintptr_t, std::unique_ptr<Allocation>> by_base;
    std::map<uintptr_t, Mapping> mappings; // device blocks outside ASan, by base
    size_t device_bytes = 0;
};

Table& table() {
    static Table* instance = new Table(); // never destroyed: frees may come from static destructors
    return *instance;
}

size_t page_bytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

size_t capacity_from_environment() {
    const char* text = std::getenv("ENGINE_EMULATOR_MEMORY_GIB");
    if (text == nullptr || *text == '\0') return size_t(16) << 30;
    char* end = nullptr;
    const double gib = std::strtod(text, &end);
    if (*end != '\0' || !(gib > 0.0) || gib > 1e6) {
        throw std::invalid_argument(std::string("ENGINE_EMULATOR_MEMORY_GIB: '") + text +
                                    "' is not a positive number of GiB");
    }
    return static_cast<size_t>(gib * double(size_t(1) << 30));
}

#if !ENGINE_EMULATOR_ASAN
struct sigaction previous_segv_action;

// Runs on its own stack (a fiber's stack may be what overflowed). Not async-signal-safe in the strict
// sense (it reads the table and formats text), which is acceptable on the way to a crash.
void on_segmentation_fault(int signal_number, siginfo_t* info, void* context) {
    const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    char text[512];
    int length = 0;
    const RunningKernel kernel = running_kernel();
    const Table& current = table();
    auto after = current.by_base.upper_bound(address);
    if (after != current.by_base.begin()) {
        const Allocation& allocation = *std::prev(after)->second;
        const auto end = reinterpret_cast<uintptr_t>(allocation.base) + allocation.bytes;
        if (address >= end && address < end + page_bytes() + device_alignment) {
            length = std::snprintf(text, sizeof text,
                                   "CUDA emulator: out-of-bounds access at %p, %zu bytes past the end of the %zu-byte "
                                   "device allocation at %p",
                                   info->si_addr, static_cast<size_t>(address - end), allocation.bytes,
                                   static_cast<void*>(allocation.base));
        }
    }
    if (length == 0) {
        length = std::snprintf(text, sizeof text,
                               "CUDA emulator: segmentation fault at %p (past dynamic shared memory, a thread's stack, "
                               "or memory the emulator does not own)",
                               info->si_addr);
    }
    if (kernel.name != nullptr && length < static_cast<int>(sizeof text)) {
        length += std::snprintf(text + length, sizeof text - static_cast<size_t>(length),
                                ", by kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", kernel.name, kernel.block.x,
                                kernel.block.y, kernel.block.z, kernel.thread.x, kernel.thread.y, kernel.thread.z);
    }
    if (length > static_cast<int>(sizeof text) - 2) length = static_cast<int>(sizeof text) - 2;
    text[length++] = '\n';
    (void)!write(STDERR_FILENO, text, static_cast<size_t>(length));
    // Hand the fault back: the faulting access repeats under the previous disposition and ends the process.
    sigaction(signal_number, &previous_segv_action, nullptr);
    (void)context;
}

void install_fault_reporter() {
    static const bool installed = [] {
        install_signal_stack();
        struct sigaction action{};
        action.sa_sigaction = on_segmentation_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, &previous_segv_action);
        return true;
    }();
    (void)installed;
}
#endif

} // namespace

void install_signal_stack() {
#if !ENGINE_EMULATOR_ASAN
    // Per host thread: the report must run on a stack of its own, since a fiber's may be what overflowed.
    thread_local const bool installed = [] {
        thread_local unsigned char alternate_stack[64 * 1024];
        stack_t stack{};
        stack.ss_sp = alternate_stack;
        stack.ss_size = sizeof alternate_stack;
        return sigaltstack(&stack, nullptr) == 0;
    }();
    (void)installed;
#endif
}

Allocation* find_allocation(const void* pointer) {
    if (pointer == nullptr) return nullptr;
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    Table& current = table();
    auto after = current.by_base.upper_bound(address);
    if (after == current.by_base.begin()) return nullptr;
    Allocation& allocation = *std::prev(after)->second;
    return address <= reinterpret_cast<uintptr_t>(allocation.base) + allocation.bytes ? &allocation : nullptr;
}

cudaError_t allocate(void** pointer, size_t bytes, bool pinned) {
    if (pointer == nullptr) return cudaErrorInvalidValue;
    *pointer = nullptr;
    if (bytes == 0) return cudaSuccess;
    Table& current = table();
    if (!pinned && (bytes > device_capacity() || current.device_bytes > device_capacity() - bytes)) {
        return cudaErrorMemoryAllocation;
    }
    auto allocation = std::make_unique<Allocation>();
    allocation->bytes = bytes;
    allocation->pinned = pinned;
    if (pinned) {
        void* memory = nullptr;
        if (posix_memalign(&memory, 4096, bytes) != 0) return cudaErrorMemoryAllocation;
        allocation->base = static_cast<unsigned char*>(memory);
    } else {
#if ENGINE_EMULATOR_ASAN
        void* memory = nullptr;
        if (posix_memalign(&memory, device_alignment, bytes) != 0) return cudaErrorMemoryAllocation;
        allocation->base = static_cast<unsigned char*>(memory);
#else
        install_fault_reporter();
        const size_t page = page_bytes();
        const size_t rounded = (bytes + device_alignment - 1) / device_alignment * device_alignment;
        const size_t mapped = (rounded + page - 1) / page * page + page;
        void* start = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (start == MAP_FAILED) return cudaErrorMemoryAllocation;
        unsigned char* guard = static_cast<unsigned char*>(start) + mapped - page;
        mprotect(guard, page, PROT_NONE);
        allocation->base = guard - rounded;
        current.mappings[reinterpret_cast<uintptr_t>(allocation->base)] = Mapping{start, mapped};
#endif
        std::memset(allocation->base, device_poison, bytes);
        current.device_bytes += bytes;
    }
    *pointer = allocation->base;
    current.by_base[reinterpret_cast<uintptr_t>(allocation->base)] = std::move(allocation);
    return cudaSuccess;
}

cudaError_t release(void* pointer, bool pinned) {
    if (pointer == nullptr) return cudaSuccess;
    Table& current = table();
    auto found = current.by_base.find(reinterpret_cast<uintptr_t>(pointer));
    if (found == current.by_base.end() || found->second->pinned != pinned) return cudaErrorInvalidValue;
    // Like the real cudaFree and cudaFreeHost, which wait for the device before they free.
    synchronize_device();
    if (pinned) {
        std::free(pointer);
    } else {
        current.device_bytes -= found->second->bytes;
        auto mapping = current.mappings.find(reinterpret_cast<uintptr_t>(pointer));
        if (mapping != current.mappings.end()) {
            munmap(mapping->second.start, mapping->second.bytes);
            current.mappings.erase(mapping);
        } else {
            std::free(pointer);
        }
    }
    current.by_base.erase(found);
    return cudaSuccess;
}

size_t device_bytes_in_use() { return table().device_bytes; }

size_t device_capacity() {
    static const size_t capacity = capacity_from_environment();
    return capacity;
}

} // namespace engine::emulator
