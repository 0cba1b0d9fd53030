// The one way libengine includes the CUDA runtime, bf16, wmma (mma.h), cuBLAS and cuBLASLt headers. In the emulated build
// (ENGINE_CUDA=EMULATE) the emulator's header comes first, so that it owns __global__, __shared__ and the
// other CUDA keywords before the toolkit's headers would define them; nothing else differs.
#pragma once

#if ENGINE_CUDA_EMULATED
#include "emulator/cuda_emulation.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#endif
