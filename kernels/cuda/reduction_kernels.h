// CUDA twins of kernels/cpu/reduction_kernels.h (conventions: kernels/cuda/cuda_kernels.h). Included by cuda_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "engine/bfloat16.h"

namespace engine::kernels::cuda {

} // namespace engine::kernels::cuda
