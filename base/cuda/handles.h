// RAII owners for CUDA streams, events, cuBLAS and cuBLASLt handles. Creation failures throw; destruction never
// throws (errors there are ignored, since a destructor may run while an exception is in flight or after
// the CUDA runtime has begun shutting down at process exit).
#pragma once

#include <utility>

#include "base/cuda/check.h"

namespace engine::base::cuda {

class Stream {
public:
    Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
    ~Stream() {
        if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    }
    Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
    Stream& operator=(Stream&& other) noexcept {
        std::swap(stream_, other.stream_);
        return *this;
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return stream_; }

private:
    cudaStream_t stream_ = nullptr;
};

class Event {
public:
    Event() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
    explicit Event(unsigned flags) { CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags)); }
    ~Event() {
        if (event_ != nullptr) (void)cudaEventDestroy(event_);
    }
    Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
    Event& operator=(Event&& other) noexcept {
        std::swap(event_, other.event_);
        return *this;
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    // Takes ownership of an event the caller created itself, for callers that must not throw.
    static Event adopt(cudaEvent_t event) noexcept {
        Event owner{Adopted{}};
        owner.event_ = event;
        return owner;
    }
    cudaEvent_t get() const { return event_; }
    void record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }
    void synchronize() const { CUDA_CHECK(cudaEventSynchronize(event_)); }

private:
    struct Adopted {};
    explicit Event(Adopted) noexcept {}
    cudaEvent_t event_ = nullptr;
};

// A cuBLAS handle bound to `stream` at creation.
class CublasHandle {
public:
    explicit CublasHandle(cudaStream_t stream) {
        CUBLAS_CHECK(cublasCreate(&handle_));
        const cublasStatus_t status = cublasSetStream(handle_, stream);
        if (status != CUBLAS_STATUS_SUCCESS) {
            (void)cublasDestroy(handle_);
            throw_cublas_error(status, "cublasSetStream(handle_, stream)", __FILE__, __LINE__);
        }
    }
    ~CublasHandle() {
        if (handle_ != nullptr) (void)cublasDestroy(handle_);
    }
    CublasHandle(CublasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    CublasHandle& operator=(CublasHandle&& other) noexcept {
        std::swap(handle_, other.handle_);
        return *this;
    }
    CublasHandle(const CublasHandle&) = delete;
    CublasHandle& operator=(const CublasHandle&) = delete;
    cublasHandle_t get() const { return handle_; }

private:
    cublasHandle_t handle_ = nullptr;
};

// A cuBLASLt handle; it has no stream, each cublasLtMatmul names its own.
class CublasLtHandle {
public:
    CublasLtHandle() { CUBLAS_CHECK(cublasLtCreate(&handle_)); }
    ~CublasLtHandle() {
        if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
    }
    CublasLtHandle(CublasLtHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    CublasLtHandle& operator=(CublasLtHandle&& other) noexcept {
        std::swap(handle_, other.handle_);
        return *this;
    }
    CublasLtHandle(const CublasLtHandle&) = delete;
    CublasLtHandle& operator=(const CublasLtHandle&) = delete;
    cublasLtHandle_t get() const { return handle_; }

private:
    cublasLtHandle_t handle_ = nullptr;
};

} // namespace engine::base::cuda
