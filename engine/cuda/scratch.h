// Temporary device memory that the op layer hands to a CUDA launcher as its workspace (reduction partials,
// attention's row dots), taken from the engine's accounting allocator: it is counted under `workspace`,
// served from the caching allocator, and a failed request raises engine::OutOfMemoryError like any tensor
// allocation.
#pragma once

#include <cstddef>

#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/memory.h"

namespace engine::cuda {

// Freed when the op returns, while the launcher's kernels may still be queued. That is safe because the
// caching allocator hands a freed block out again without synchronizing, and any later user is ordered after
// these kernels only if both run on the compute stream: hence the check.
template <typename T>
class Scratch {
public:
    Scratch(size_t count, cudaStream_t stream) : bytes_(count * sizeof(T)) {
        ENGINE_CHECK(stream == compute_stream(),
                     "CUDA scratch: launchers that take scratch memory must run on engine::cuda::compute_stream(), "
                     "the stream the caching allocator orders reuse on");
        data_ = static_cast<T*>(allocate_bytes(Device::cuda, bytes_, MemoryCategory::workspace));
    }
    ~Scratch() { deallocate_bytes(Device::cuda, data_, bytes_, MemoryCategory::workspace); }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    T* get() const { return data_; }

private:
    size_t bytes_;
    T* data_ = nullptr;
};

} // namespace engine::cuda
