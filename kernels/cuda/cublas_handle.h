// The cuBLAS handle owned by the device layer (engine/cuda/runtime.cpp). Declared here, beside the kernels
// that use it, because engine/cuda/runtime.h is deliberately free of CUDA headers.
#pragma once

#include <cublas_v2.h>

namespace engine::cuda {

// Initializes the device layer on first use; the handle is created bound to the compute stream.
cublasHandle_t cublas_handle();

} // namespace engine::cuda
