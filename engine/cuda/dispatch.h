// The op layer's door to the CUDA kernels: their declarations and the macros an op's CUDA branch is written
// with. In a build with the backend (nvcc or the emulator) the macros run the branch; without it they are the
// "built without CUDA" error and the branch, which names CUDA kernels, is not compiled. This header and the
// device layer's stubs (engine/cuda/absent.cpp) are the only places that ask ENGINE_HAS_CUDA, so no op does.
// Included by engine/dispatch.h, after the helpers the macros call.
#pragma once

#include "engine/cuda/runtime.h"
#if ENGINE_HAS_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/llama_kernels.h"
#include "kernels/cuda/nf4_kernels.h"
#endif

#if ENGINE_HAS_CUDA
#define ENGINE_ON_CUDA(op, dtype, ...)                                                                   \
    do {                                                                                                 \
        ::engine::detail::require_cuda_f32(op, dtype);                                                   \
        __VA_ARGS__;                                                                                     \
    } while (0)
// ENGINE_DISPATCH_CUDA(op, dtype, [&]<typename T>() { kernels::cuda::...(x.data<T>(), ...); }): dispatch_cuda,
// or the "built without CUDA" error in a CPU-only build, where the lambda (naming CUDA kernels) is not compiled.
#define ENGINE_DISPATCH_CUDA(op, dtype, ...) ::engine::detail::dispatch_cuda(op, dtype, __VA_ARGS__)
// ENGINE_CUDA_ONLY(op, statement): the statement (naming CUDA kernels), or the "built without CUDA" error.
#define ENGINE_CUDA_ONLY(op, ...)                                                                        \
    do {                                                                                                 \
        __VA_ARGS__;                                                                                     \
    } while (0)
#else
#define ENGINE_ON_CUDA(op, dtype, ...) ::engine::detail::fail_without_cuda(op)
#define ENGINE_DISPATCH_CUDA(op, dtype, ...) ::engine::detail::fail_without_cuda(op)
#define ENGINE_CUDA_ONLY(op, ...) ::engine::detail::fail_without_cuda(op)
#endif
