// The emulated CUDA device (ENGINE_CUDA=EMULATE): the header that lets the unchanged kernels/cuda/*.cu
// sources compile as host C++ and run on the CPU. It must come before any CUDA header (base/cuda/headers.h
// is the one place that includes it), because it defines __global__, __shared__ and the other keywords
// first; the toolkit's headers keep definitions they find. Execution model: docs/CUDA.md, "Emulation".
#pragma once

#if defined(__CUDACC__)
#error "the emulated CUDA build compiles CUDA sources with the host compiler, not nvcc"
#endif
#if defined(__HOST_DEFINES_H__) || defined(__CUDA_RUNTIME_H__)
#error "emulator/cuda_emulation.h must precede every CUDA header: include base/cuda/headers.h instead"
#endif

#define __global__
#define __device__
#define __host__
#define __managed__
#define __constant__ static
// Static shared memory is one copy for the whole block: a static. Those of non-template functions land in
// one section, which the emulator poisons before every block (GCC ignores the attribute on statics of
// function templates; see docs/CUDA.md).
#define __shared__ static __attribute__((section("engine_emulated_shared"), aligned(16)))
#define __launch_bounds__(...)
#define __grid_constant__

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "emulator/device_functions.h"
#include "emulator/launch.h"
#include "emulator/wmma.h"
