// The CUDA device layer as the rest of the engine sees it: plain C++ declarations, no CUDA headers. Every
// build has them: without CUDA they are engine/cuda/absent.cpp's stubs (device_available() is false, the rest
// throw "built without CUDA"), so no code outside the device layer needs an `#if ENGINE_HAS_CUDA`.
#pragma once

#include <cstddef>

#include "engine/dtype.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
struct cublasContext;
using cublasHandle_t = cublasContext*;
struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;

namespace engine::cuda {

// Whether this build has the CUDA backend (nvcc, or the emulated device); a device may still be absent.
inline constexpr bool backend_built = ENGINE_HAS_CUDA != 0;

// True when the runtime finds at least one CUDA device; never throws.
bool device_available();
// The number of visible devices, 0 when there is no driver or device; never throws.
int device_count();
// Which visible device ensure_initialized binds (default 0; a data-parallel rank takes its host-local index).
// Throws EngineError when the index is not a visible device, or when the layer is already bound to another.
void select_device(int device);
// Selects the device, creates the engine-owned compute stream, cuBLAS and cuBLASLt handles, and installs the caching
// device allocator and the pinned host pool into the accounting layer. Idempotent. Throws EngineError
// "no CUDA device" when there is none.
void ensure_initialized();
// The one engine-owned compute stream every kernel, copy and cuBLAS call of the engine is ordered on.
cudaStream_t compute_stream();
// The engine's cuBLAS handle, created bound to the compute stream.
cublasHandle_t cublas_handle();
// The engine's cuBLASLt handle (GEMMs with a fused epilogue); cublasLtMatmul takes the stream per call.
cublasLtHandle_t cublaslt_handle();
// cuBLASLt's workspace: cublaslt_workspace_bytes of device memory, allocated on first use through the
// accounting allocator (counted under MemoryCategory::workspace from then on) and never freed. Only
// compute-stream work may use it, as with every caching-allocator block.
inline constexpr size_t cublaslt_workspace_bytes = size_t(32) << 20; // what cuBLASLt's Hopper kernels want at most
void* cublaslt_workspace();
// Copies between host and device on the compute stream; returns once a host destination is written.
void copy(void* destination, Device destination_device, const void* source, Device source_device, size_t bytes);
void zero(void* destination, size_t bytes); // cudaMemsetAsync on the compute stream
void synchronize();                         // waits for the compute stream
// The host waits for the compute stream when `device` is cuda; nothing on the CPU (every build, no device needed).
void synchronize(Device device);
// cudaMemGetInfo of the bound device (initialising the layer).
void memory_info(size_t& free_bytes, size_t& total_bytes);
// cudaMalloc/cudaHostAlloc calls made so far (the caching allocator's misses), for steady-state tests.
size_t system_allocation_count();
// Math of the engine's GEMMs and attention on CUDA: TF32 tensor cores (the default) or full fp32.
void set_tf32_enabled(bool enabled);
bool tf32_enabled();

// Offload prefetching (checkpoint/checkpoint.cpp): a second engine-owned stream for host->device copies
// that overlap the compute stream, ordered with events.
cudaStream_t copy_stream();
// The host waits for everything queued on the copy stream. Never throws (a failure is cleared, and a sticky
// one reports at the next checked call): it is the fallback for destructors that could not order the
// compute stream after their copies and must not free the copies' buffers while they run.
void synchronize_copy_stream() noexcept;

// A CUDA event, without CUDA headers. Move-only; destruction never throws.
class StreamEvent {
public:
    StreamEvent();
    ~StreamEvent();
    StreamEvent(StreamEvent&& other) noexcept;
    StreamEvent& operator=(StreamEvent&& other) noexcept;
    StreamEvent(const StreamEvent&) = delete;
    StreamEvent& operator=(const StreamEvent&) = delete;

    void record(cudaStream_t stream);
    // Work queued on `stream` after this call waits (on the device, not the host) for the recorded work.
    void wait(cudaStream_t stream) const;
    void synchronize() const; // host waits

private:
    CUevent_st* event_ = nullptr;
};

// Host -> device on the copy stream; returns at once. The copy starts after everything queued on the compute
// stream so far, because `destination` may be a block the caching allocator recycled from work still queued
// there. `done` is recorded after the copy: the compute stream must wait on it before it reads
// `destination`, and before either buffer is freed (the pinned pool orders reuse on the compute stream).
// `source` should be pinned, or the copy is not asynchronous.
void copy_to_device_async(void* destination, const void* source, size_t bytes, StreamEvent& done);
// Device -> host (pinned) on the copy stream; returns at once, the host never waits. The copy starts after
// everything queued on the compute stream so far (the work that wrote `source`). `done` is recorded after
// it: the compute stream must wait on it before anything reads `destination` or frees it (the pinned pool
// orders reuse on the compute stream). `source` must be the start of a caching-allocator block; it may be
// freed at once: the allocator hands that block to later compute-stream work only after the copy read it.
void copy_to_host_async(void* destination, const void* source, size_t bytes, StreamEvent& done);

} // namespace engine::cuda
