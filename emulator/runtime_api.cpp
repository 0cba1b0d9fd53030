// The CUDA runtime API of the emulated device, defined once here against the toolkit's own declarations
// (cuda_runtime_api.h), so the emulated build links no libcudart. Each call checks its arguments the way
// the real runtime does and reports through the same error codes; the device it describes has sm_90's
// limits. Device faults are sticky, as on a GPU: after one, every call returns it.
#include <cstdlib>
#include <cstring>
#include <string>

#include "emulator/device.h"
#include "emulator/testing.h"

namespace engine::emulator {
namespace {

thread_local cudaError_t last_error = cudaSuccess;

struct StickyFault {
    cudaError_t status = cudaSuccess;
    std::string text; // what cudaGetErrorString returns for it
};
StickyFault sticky;

int visible_device_count() {
    static const int count = [] {
        const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        if (visible == nullptr) return 1;
        // As the real runtime: the list is read up to the first entry that names no device; ours is device 0.
        return std::strncmp(visible, "0", 1) == 0 && (visible[1] == '\0' || visible[1] == ',') ? 1 : 0;
    }();
    return count;
}

struct ErrorText {
    cudaError_t status;
    const char* name;
    const char* text;
};
constexpr ErrorText error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "operation not permitted in the current state"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
};

const ErrorText* find_error(cudaError_t status) {
    for (const ErrorText& entry : error_texts) {
        if (entry.status == status) return &entry;
    }
    return nullptr;
}

// Entry checks shared by the calls that need the device.
cudaError_t device_check() {
    if (visible_device_count() == 0) return cudaErrorNoDevice;
    return sticky_error();
}

using Lock = std::lock_guard<std::recursive_mutex>;

bool in_bounds(const Allocation* allocation, const void* pointer, size_t bytes) {
    const auto start = reinterpret_cast<uintptr_t>(pointer), base = reinterpret_cast<uintptr_t>(allocation->base);
    return start >= base && bytes <= allocation->bytes && start - base <= allocation->bytes - bytes;
}

bool is_device(const Allocation* allocation) { return allocation != nullptr && !allocation->pinned; }

std::shared_ptr<const std::string> describe(const char* call, size_t bytes) {
    return std::make_shared<const std::string>(std::string(call) + " of " + std::to_string(bytes) + " bytes");
}

// Both copies: the async one on `stream`, and the blocking cudaMemcpy (`blocking`) on the legacy stream.
// Which of them order the host after the copy follows NVIDIA's "API synchronization behavior"; the work
// itself may run earlier than that, which the race check (by clocks) does not mind.
cudaError_t copy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind, StreamState& stream,
                 bool blocking, const char* call) {
    Allocation* to = find_allocation(destination);
    Allocation* from = find_allocation(source);
    const bool to_device = is_device(to), from_device = is_device(from);
    switch (kind) {
    case cudaMemcpyHostToHost: if (to_device || from_device) return cudaErrorInvalidValue; break;
    case cudaMemcpyHostToDevice: if (!to_device || from_device) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToHost: if (to_device || !from_device) return cudaErrorInvalidValue; break;
    case cudaMemcpyDeviceToDevice: if (!to_device || !from_device) return cudaErrorInvalidValue; break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidValue;
    }
    if (bytes == 0) return cudaSuccess;
    if ((to != nullptr && !in_bounds(to, destination, bytes)) || (from != nullptr && !in_bounds(from, source, bytes))) {
        return cudaErrorInvalidValue;
    }
    if (!to_device && !from_device) { // host to host is synchronous: after the stream's earlier work, then done
        synchronize_stream(stream);
        std::memmove(destination, source, bytes);
        return sticky_error();
    }
    std::vector<Access> accesses;
    if (from != nullptr) accesses.push_back(Access{from, false});
    if (to != nullptr) accesses.push_back(Access{to, true});
    Operation operation{describe(call, bytes), {}, {}};
    const bool pageable_source = from == nullptr;
    const Clock before = stream.tail;
    if (pageable_source) {
        // Pageable memory is staged when the call is made, so the caller may reuse its buffer at once.
        auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(source),
                                                                   static_cast<const unsigned char*>(source) + bytes);
        operation.run = [destination, staged] { std::memcpy(destination, staged->data(), staged->size()); };
    } else {
        operation.run = [destination, source, bytes] { std::memmove(destination, source, bytes); };
    }
    const cudaError_t status = enqueue(stream, std::move(operation), accesses);
    if (status != cudaSuccess) return status;
    if (!to_device) { // device to host returns once the copy is done (async too, into pageable memory)
        if (blocking || to == nullptr) synchronize_stream(stream);
    } else if (blocking && !from_device) {
        if (pageable_source) {
            order_host_after(before); // the stream was synchronized before staging; the copy may still run
        } else {
            synchronize_stream(stream); // from pinned memory: done when the call returns
        }
    } // device to device, and async copies to the device, leave the host unordered
    return sticky_error();
}

cudaError_t fill(void* destination, int value, size_t bytes, StreamState& stream, const char* call) {
    Allocation* to = find_allocation(destination);
    if (to == nullptr || !in_bounds(to, destination, bytes)) return cudaErrorInvalidValue;
    if (bytes == 0) return cudaSuccess;
    Operation operation{describe(call, bytes), [destination, value, bytes] { std::memset(destination, value, bytes); }, {}};
    return enqueue(stream, std::move(operation), {Access{to, true}});
}

// The shared shape of the calls on one stream: lock, the device checks, the handle, then the call.
template <typename Call>
cudaError_t on_stream(cudaStream_t handle, Call&& call) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    StreamState* stream = find_stream(handle);
    if (stream == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    return call(*stream);
}

template <typename Call>
cudaError_t on_event(cudaEvent_t handle, Call&& call) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    EventState* event = find_event(handle);
    if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    return call(*event);
}

} // namespace

std::recursive_mutex& device_mutex() {
    static std::recursive_mutex* mutex = new std::recursive_mutex();
    return *mutex;
}

cudaError_t record_error(cudaError_t status) {
    if (status != cudaSuccess) last_error = status;
    return status;
}

cudaError_t sticky_error() { return sticky.status; }
const char* sticky_message() { return sticky.text.c_str(); }

cudaError_t raise_fault(cudaError_t status, const std::string& message) {
    if (sticky.status == cudaSuccess) {
        const ErrorText* known = find_error(status);
        sticky.status = status;
        sticky.text = std::string(known != nullptr ? known->text : "device fault") + ": CUDA emulator: " + message;
        std::fprintf(stderr, "CUDA emulator: %s\n", message.c_str());
        drop_pending_work();
    }
    return sticky.status;
}

void clear_sticky_fault() {
    sticky = StickyFault{};
    last_error = cudaSuccess;
}

void clear_fault() {
    Lock lock(device_mutex());
    clear_sticky_fault();
    synchronize_device(); // what the fault dropped counts as finished: later work is ordered after it
}

} // namespace engine::emulator

using namespace engine::emulator;

// ---- errors ----
cudaError_t cudaGetLastError() {
    const cudaError_t status = last_error;
    last_error = sticky_error(); // a sticky fault is reported again and again
    return status != cudaSuccess ? status : sticky_error();
}
cudaError_t cudaPeekAtLastError() { return last_error != cudaSuccess ? last_error : sticky_error(); }
const char* cudaGetErrorName(cudaError_t status) {
    const ErrorText* known = find_error(status);
    return known != nullptr ? known->name : "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t status) {
    if (status != cudaSuccess && status == sticky_error()) return sticky_message();
    const ErrorText* known = find_error(status);
    return known != nullptr ? known->text : "unrecognized error code";
}

// ---- the device ----
cudaError_t cudaGetDeviceCount(int* count) {
    if (count == nullptr) return record_error(cudaErrorInvalidValue);
    *count = visible_device_count();
    return *count == 0 ? record_error(cudaErrorNoDevice) : cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (visible_device_count() == 0) return record_error(cudaErrorNoDevice);
    return device == 0 ? cudaSuccess : record_error(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
    if (device == nullptr) return record_error(cudaErrorInvalidValue);
    *device = 0;
    return record_error(device_check());
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
    if (properties == nullptr) return record_error(cudaErrorInvalidValue);
    if (visible_device_count() == 0) return record_error(cudaErrorNoDevice);
    if (device != 0) return record_error(cudaErrorInvalidDevice);
    *properties = cudaDeviceProp{};
    std::snprintf(properties->name, sizeof properties->name, "libengine emulated CUDA device (sm_90 limits)");
    properties->major = 9;
    properties->minor = 0;
    properties->totalGlobalMem = device_capacity();
    properties->sharedMemPerBlock = sm90::default_dynamic_shared_bytes;
    properties->sharedMemPerBlockOptin = sm90::opt_in_dynamic_shared_bytes;
    properties->sharedMemPerMultiprocessor = sm90::shared_bytes_per_multiprocessor;
    properties->regsPerBlock = 65536;
    properties->warpSize = 32;
    properties->maxThreadsPerBlock = sm90::max_threads_per_block;
    properties->maxThreadsDim[0] = sm90::max_block_x;
    properties->maxThreadsDim[1] = sm90::max_block_y;
    properties->maxThreadsDim[2] = sm90::max_block_z;
    properties->maxGridSize[0] = static_cast<int>(sm90::max_grid_x);
    properties->maxGridSize[1] = static_cast<int>(sm90::max_grid_y);
    properties->maxGridSize[2] = static_cast<int>(sm90::max_grid_z);
    properties->multiProcessorCount = sm90::multiprocessors;
    properties->maxThreadsPerMultiProcessor = 2048;
    properties->unifiedAddressing = 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
    if (value == nullptr) return record_error(cudaErrorInvalidValue);
    if (visible_device_count() == 0) return record_error(cudaErrorNoDevice);
    if (device != 0) return record_error(cudaErrorInvalidDevice);
    switch (attribute) {
    case cudaDevAttrMaxThreadsPerBlock: *value = sm90::max_threads_per_block; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(sm90::default_dynamic_shared_bytes); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(sm90::opt_in_dynamic_shared_bytes); return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = sm90::multiprocessors; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxBlockDimX: *value = sm90::max_block_x; return cudaSuccess;
    case cudaDevAttrMaxBlockDimY: *value = sm90::max_block_y; return cudaSuccess;
    case cudaDevAttrMaxBlockDimZ: *value = sm90::max_block_z; return cudaSuccess;
    case cudaDevAttrMaxGridDimX: *value = static_cast<int>(sm90::max_grid_x); return cudaSuccess;
    case cudaDevAttrMaxGridDimY: *value = static_cast<int>(sm90::max_grid_y); return cudaSuccess;
    case cudaDevAttrMaxGridDimZ: *value = static_cast<int>(sm90::max_grid_z); return cudaSuccess;
    default: return record_error(cudaErrorInvalidValue);
    }
}
cudaError_t cudaDriverGetVersion(int* version) {
    if (version == nullptr) return record_error(cudaErrorInvalidValue);
    *version = CUDART_VERSION; // the emulator is its own driver, as new as the headers it was built with
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
    if (version == nullptr) return record_error(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    synchronize_device();
    return record_error(sticky_error());
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    if (free == nullptr || total == nullptr) return record_error(cudaErrorInvalidValue);
    Lock lock(device_mutex());
    *total = device_capacity();
    *free = device_capacity() - device_bytes_in_use();
    return record_error(device_check());
}
cudaError_t cudaFuncSetAttribute(const void* function, cudaFuncAttribute attribute, int value) {
    Lock lock(device_mutex());
    if (function == nullptr) return record_error(cudaErrorInvalidDeviceFunction);
    if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || static_cast<size_t>(value) > sm90::opt_in_dynamic_shared_bytes) {
            return record_error(cudaErrorInvalidValue);
        }
        limits_of(function).max_dynamic_shared_bytes = static_cast<size_t>(value);
    }
    return cudaSuccess;
}

// ---- memory ----
cudaError_t cudaMalloc(void** pointer, size_t bytes) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    return record_error(allocate(pointer, bytes, false));
}
cudaError_t cudaFree(void* pointer) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    return record_error(release(pointer, false));
}
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    (void)flags;
    return record_error(allocate(pointer, bytes, true));
}
cudaError_t cudaMallocHost(void** pointer, size_t bytes) { return cudaHostAlloc(pointer, bytes, cudaHostAllocDefault); }
cudaError_t cudaFreeHost(void* pointer) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    return record_error(release(pointer, true));
}
cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    StreamState& stream = *legacy_stream();
    return record_error(copy(destination, source, bytes, kind, stream, true, "cudaMemcpy"));
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind, cudaStream_t handle) {
    return on_stream(handle, [&](StreamState& stream) {
        return record_error(copy(destination, source, bytes, kind, stream, false, "cudaMemcpyAsync"));
    });
}
cudaError_t cudaMemset(void* destination, int value, size_t bytes) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    // Asynchronous to the host for device memory, like the real one.
    return record_error(fill(destination, value, bytes, *legacy_stream(), "cudaMemset"));
}
cudaError_t cudaMemsetAsync(void* destination, int value, size_t bytes, cudaStream_t handle) {
    return on_stream(handle, [&](StreamState& stream) {
        return record_error(fill(destination, value, bytes, stream, "cudaMemsetAsync"));
    });
}

// ---- streams ----
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* handle, unsigned int flags) {
    Lock lock(device_mutex());
    if (handle == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return record_error(cudaErrorInvalidValue);
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    *handle = reinterpret_cast<cudaStream_t>(create_stream((flags & cudaStreamNonBlocking) == 0));
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* handle) { return cudaStreamCreateWithFlags(handle, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t handle) {
    Lock lock(device_mutex());
    StreamState* stream = find_stream(handle);
    if (stream == nullptr || stream->legacy) return record_error(cudaErrorInvalidResourceHandle);
    destroy_stream(stream);
    return record_error(sticky_error());
}
cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
    return on_stream(handle, [](StreamState& stream) {
        synchronize_stream(stream);
        return record_error(sticky_error());
    });
}
// A query that finds work queued runs it, so that polling loops finish, but answers "not ready" this time:
// callers' not-ready paths run too. Only a "done" answer orders the host after the work.
cudaError_t cudaStreamQuery(cudaStream_t handle) {
    return on_stream(handle, [](StreamState& stream) {
        if (stream.completed < stream.enqueued) {
            run_all(stream);
            return sticky_error() != cudaSuccess ? record_error(sticky_error()) : cudaErrorNotReady;
        }
        order_host_after(stream.tail);
        return cudaSuccess;
    });
}
cudaError_t cudaStreamWaitEvent(cudaStream_t handle, cudaEvent_t event_handle, unsigned int flags) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    StreamState* stream = find_stream(handle);
    EventState* event = find_event(event_handle);
    if (stream == nullptr || event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    if (flags != 0 && flags != cudaEventWaitDefault) return record_error(cudaErrorInvalidValue);
    return record_error(wait_event(*stream, *event));
}

// ---- events ----
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* handle, unsigned int flags) {
    Lock lock(device_mutex());
    if (handle == nullptr) return record_error(cudaErrorInvalidValue);
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    *handle = reinterpret_cast<cudaEvent_t>(create_event(flags));
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* handle) { return cudaEventCreateWithFlags(handle, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t handle) {
    Lock lock(device_mutex());
    EventState* event = find_event(handle);
    if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    destroy_event(event);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t handle, cudaStream_t stream_handle) {
    Lock lock(device_mutex());
    if (const cudaError_t status = device_check(); status != cudaSuccess) return record_error(status);
    EventState* event = find_event(handle);
    StreamState* stream = find_stream(stream_handle);
    if (event == nullptr || stream == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    return record_error(record_event(*event, *stream));
}
cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
    return on_event(handle, [](EventState& event) {
        synchronize_event(event);
        return record_error(sticky_error());
    });
}
cudaError_t cudaEventQuery(cudaEvent_t handle) {
    return on_event(handle, [](EventState& event) {
        if (event.recorded && event.stream->completed < event.sequence) {
            run_until(*event.stream, event.sequence);
            return sticky_error() != cudaSuccess ? record_error(sticky_error()) : cudaErrorNotReady;
        }
        synchronize_event(event);
        return cudaSuccess;
    });
}
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start_handle, cudaEvent_t end_handle) {
    Lock lock(device_mutex());
    if (milliseconds == nullptr) return record_error(cudaErrorInvalidValue);
    EventState* start = find_event(start_handle);
    EventState* end = find_event(end_handle);
    if (start == nullptr || end == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    if ((start->flags & cudaEventDisableTiming) != 0 || (end->flags & cudaEventDisableTiming) != 0) {
        return record_error(cudaErrorInvalidResourceHandle);
    }
    if (!start->recorded || !end->recorded) return record_error(cudaErrorInvalidResourceHandle);
    synchronize_event(*start);
    synchronize_event(*end);
    *milliseconds = std::chrono::duration<float, std::milli>(*end->completed_at - *start->completed_at).count();
    return record_error(sticky_error());
}
