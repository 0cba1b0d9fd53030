// The one stub of the CUDA device layer (engine/cuda/runtime.h) for builds without CUDA: no device is
// available, and anything that needs one throws "built without CUDA" naming the call. CMake compiles it only
// when the backend is absent (ENGINE_CUDA=OFF, or AUTO without nvcc).
#include "base/error.h"
#include "engine/cuda/runtime.h"

namespace engine::cuda {
namespace {
[[noreturn]] void absent(const char* call) {
    ENGINE_FAIL(call << ": cuda device requested, but libengine was built without CUDA (ENGINE_CUDA=OFF or no nvcc)");
}
} // namespace

bool device_available() { return false; }
int device_count() { return 0; }
void select_device(int) { absent("select_device"); }
void ensure_initialized() { absent("ensure_initialized"); }
cudaStream_t compute_stream() { absent("compute_stream"); }
cublasHandle_t cublas_handle() { absent("cublas_handle"); }
cublasLtHandle_t cublaslt_handle() { absent("cublaslt_handle"); }
void* cublaslt_workspace() { absent("cublaslt_workspace"); }
void copy(void*, Device, const void*, Device, size_t) { absent("copy to or from a cuda tensor"); }
void zero(void*, size_t) { absent("zeroing a cuda tensor"); }
void synchronize() { absent("synchronize"); }
void synchronize(Device device) {
    if (device == Device::cuda) absent("synchronize");
}
void memory_info(size_t&, size_t&) { absent("memory_info"); }
size_t system_allocation_count() { return 0; }
void set_tf32_enabled(bool) { absent("set_tf32_enabled"); }
bool tf32_enabled() { return false; }
cudaStream_t copy_stream() { absent("copy_stream"); }
void synchronize_copy_stream() noexcept {}

StreamEvent::StreamEvent() { absent("StreamEvent"); }
StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
    event_ = other.event_;
    other.event_ = nullptr;
    return *this;
}
void StreamEvent::record(cudaStream_t) { absent("StreamEvent::record"); }
void StreamEvent::wait(cudaStream_t) const { absent("StreamEvent::wait"); }
void StreamEvent::synchronize() const { absent("StreamEvent::synchronize"); }

void copy_to_device_async(void*, const void*, size_t, StreamEvent&) { absent("copy_to_device_async"); }
void copy_to_host_async(void*, const void*, size_t, StreamEvent&) { absent("copy_to_host_async"); }

} // namespace engine::cuda
