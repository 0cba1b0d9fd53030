// The CUDA device layer (engine/cuda/runtime.h): device selection, the engine's compute stream, cuBLAS and
// cuBLASLt handles and cuBLASLt's workspace, host/device copies, and installation of the caching allocators.
#include "engine/cuda/runtime.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "base/cuda/check.h"
#include "base/cuda/handles.h"
#include "base/error.h"
#include "engine/memory.h"

namespace engine::cuda {

void install_caching_allocators();                                  // engine/cuda/caching_allocator.cpp
void fence_device_block(void* pointer, base::cuda::Event event); // engine/cuda/caching_allocator.cpp

namespace {

struct DeviceState {
    int device = 0;
    base::cuda::Stream stream;
    base::cuda::CublasHandle cublas{stream.get()};
    base::cuda::CublasLtHandle cublaslt;
    std::once_flag workspace_allocated;
    void* workspace = nullptr; // cublaslt_workspace_bytes, lazily: a process that never fuses pays nothing
    base::cuda::Stream copies; // prefetch copies only; everything else is on `stream`
};

std::mutex initialization_mutex;
// Never destroyed: allocations with static lifetime may still be freed, and ordered on the stream, after
// static destructors would have run. Published once fully built, so readers need no lock.
std::atomic<DeviceState*> device_state{nullptr};
std::atomic<bool> tf32{true}; // TF32 tensor cores unless a caller asks for full fp32
std::atomic<int> selected_device{0}; // select_device's choice, bound by ensure_initialized

DeviceState& state() {
    DeviceState* current = device_state.load(std::memory_order_acquire);
    if (current != nullptr) return *current;
    ensure_initialized();
    return *device_state.load(std::memory_order_acquire);
}

cudaMemcpyKind copy_kind(Device destination, Device source) {
    if (source == Device::cpu) return destination == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
    return destination == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

} // namespace

bool device_available() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError(); // no driver or no device: not an error for this query
        return false;
    }
    return count > 0;
}

int device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

void select_device(int device) {
    std::lock_guard<std::mutex> lock(initialization_mutex);
    const int count = device_count();
    ENGINE_CHECK(device >= 0 && device < count,
                 "select_device: device " << device << " is not one of the " << count << " visible CUDA devices");
    DeviceState* current = device_state.load(std::memory_order_acquire);
    ENGINE_CHECK(current == nullptr || current->device == device,
                 "select_device: the engine already runs on device " << current->device << ", cannot move to " << device);
    selected_device.store(device);
}

void ensure_initialized() {
    if (device_state.load(std::memory_order_acquire) != nullptr) return;
    std::lock_guard<std::mutex> lock(initialization_mutex);
    if (device_state.load(std::memory_order_acquire) != nullptr) return;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        ENGINE_FAIL("no CUDA device (cudaGetDeviceCount: "
                    << (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) << ")");
    }
    // Device 0 of those visible unless select_device chose another: CUDA_VISIBLE_DEVICES chooses among
    // physical devices.
    const int device = selected_device.load();
    CUDA_CHECK(cudaSetDevice(device));
    auto built = std::make_unique<DeviceState>();
    built->device = device;
    install_caching_allocators(); // before publishing, so no caller sees the layer without its allocators
    device_state.store(built.release(), std::memory_order_release);
}

cudaStream_t compute_stream() { return state().stream.get(); }

cublasHandle_t cublas_handle() { return state().cublas.get(); }

cublasLtHandle_t cublaslt_handle() { return state().cublaslt.get(); }

void* cublaslt_workspace() {
    DeviceState& current = state();
    // A failed allocation (OutOfMemoryError) leaves the flag unset, so a later call tries again.
    std::call_once(current.workspace_allocated, [&] {
        current.workspace = allocate_bytes(Device::cuda, cublaslt_workspace_bytes, MemoryCategory::workspace);
    });
    return current.workspace;
}

void copy(void* destination, Device destination_device, const void* source, Device source_device, size_t bytes) {
    if (bytes == 0) return;
    cudaStream_t stream = compute_stream();
    CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, copy_kind(destination_device, source_device), stream));
    if (destination_device == Device::cpu) CUDA_CHECK(cudaStreamSynchronize(stream));
}

void zero(void* destination, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(destination, 0, bytes, compute_stream()));
}

void synchronize() { CUDA_CHECK(cudaStreamSynchronize(compute_stream())); }
void synchronize(Device device) {
    if (device == Device::cuda) synchronize();
}
void memory_info(size_t& free_bytes, size_t& total_bytes) {
    ensure_initialized();
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
}

void set_tf32_enabled(bool enabled) { tf32.store(enabled); }
bool tf32_enabled() { return tf32.load(); }

cudaStream_t copy_stream() { return state().copies.get(); }

void synchronize_copy_stream() noexcept {
    DeviceState* current = device_state.load(std::memory_order_acquire);
    if (current == nullptr) return; // never initialized: nothing was ever queued
    if (cudaStreamSynchronize(current->copies.get()) != cudaSuccess) (void)cudaGetLastError();
}

StreamEvent::StreamEvent() {
    ensure_initialized();
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}
StreamEvent::~StreamEvent() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
}
StreamEvent::StreamEvent(StreamEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
}
void StreamEvent::record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }
void StreamEvent::wait(cudaStream_t stream) const { CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
void StreamEvent::synchronize() const { CUDA_CHECK(cudaEventSynchronize(event_)); }

void copy_to_device_async(void* destination, const void* source, size_t bytes, StreamEvent& done) {
    cudaStream_t copies = copy_stream();
    StreamEvent compute_so_far;
    compute_so_far.record(compute_stream());
    compute_so_far.wait(copies);
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice, copies));
    done.record(copies);
}

void copy_to_host_async(void* destination, const void* source, size_t bytes, StreamEvent& done) {
    cudaStream_t copies = copy_stream();
    StreamEvent compute_so_far;
    compute_so_far.record(compute_stream());
    compute_so_far.wait(copies);
    if (bytes == 0) {
        done.record(copies);
        return;
    }
    CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToHost, copies));
    done.record(copies);
    base::cuda::Event source_read;
    source_read.record(copies);
    fence_device_block(const_cast<void*>(source), std::move(source_read));
}

} // namespace engine::cuda
