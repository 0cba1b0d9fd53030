// The one way a kernel is launched, and the one way a kernel declares dynamic shared memory. On a real GPU
// these are `<<<>>>` and `extern __shared__`; in the emulated build (ENGINE_CUDA=EMULATE) the same kernel
// source runs on the CPU through the emulator (emulator/cuda_emulation.h). No kernel has another copy.
//
//   ENGINE_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, arguments...);
//   ENGINE_DYNAMIC_SHARED(float, shared); // inside a kernel: `float* shared`, 16-byte aligned
//
// Every launch is checked: a bad configuration (too many threads, too much shared memory, an empty grid)
// throws engine::EngineError naming the kernel, as does an error left by earlier asynchronous work.
#pragma once

#include <string>

#include "base/cuda/check.h"

namespace engine::base::cuda {

inline void check_launch(cudaError_t status, const char* kernel, const char* file, int line) {
    if (status != cudaSuccess) {
        throw_cuda_error(status, (std::string("the launch of ") + kernel).c_str(), file, line);
    }
}

} // namespace engine::base::cuda

#if ENGINE_CUDA_EMULATED
#define ENGINE_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, ...)                                \
    do {                                                                                                     \
        (void)::engine::emulator::launch(#kernel, kernel, grid, block, dynamic_shared_bytes,                 \
                                         stream __VA_OPT__(, ) __VA_ARGS__);                                 \
        ::engine::base::cuda::check_launch(cudaGetLastError(), #kernel, __FILE__, __LINE__);                 \
    } while (0)
#define ENGINE_DYNAMIC_SHARED(type, name) type* const name = ::engine::emulator::dynamic_shared_memory<type>()
#else
#define ENGINE_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, ...)                                \
    do {                                                                                                     \
        kernel<<<grid, block, dynamic_shared_bytes, stream>>>(__VA_ARGS__);                                  \
        ::engine::base::cuda::check_launch(cudaGetLastError(), #kernel, __FILE__, __LINE__);                 \
    } while (0)
#define ENGINE_DYNAMIC_SHARED(type, name)                                                                    \
    extern __shared__ __align__(16) unsigned char engine_dynamic_shared_memory[];                            \
    type* const name = reinterpret_cast<type*>(engine_dynamic_shared_memory)
#endif
