// Error checking for CUDA, cuBLAS and cuBLASLt calls and kernel launches: every failure becomes an
// engine::EngineError naming the call (or kernel) and its file:line, because library code never exits and
// tests must be able to EXPECT_THROW. cuBLASLt returns cublasStatus_t too, so CUBLAS_CHECK serves it.
#pragma once

#include <string>

#include "base/cuda/headers.h"
#include "base/error.h"

namespace engine::base::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
    // A failed runtime call also sets the runtime's last error; clear it, or the next launch check would
    // report this failure against an unrelated kernel. (A sticky error stays: every later call reports it.)
    (void)cudaGetLastError();
    throw_error(file, line,
                std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                    ") in " + call);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                            int line) {
    throw_error(file, line, std::string("cuBLAS error ") + cublasGetStatusString(status) + " in " + call);
}

} // namespace engine::base::cuda

#define CUDA_CHECK(expr)                                                                                 \
    do {                                                                                                 \
        const cudaError_t cuda_check_status = (expr);                                                    \
        if (cuda_check_status != cudaSuccess) {                                                          \
            ::engine::base::cuda::throw_cuda_error(cuda_check_status, #expr, __FILE__, __LINE__);        \
        }                                                                                                \
    } while (0)

#define CUBLAS_CHECK(expr)                                                                               \
    do {                                                                                                 \
        const cublasStatus_t cublas_check_status = (expr);                                               \
        if (cublas_check_status != CUBLAS_STATUS_SUCCESS) {                                              \
            ::engine::base::cuda::throw_cublas_error(cublas_check_status, #expr, __FILE__, __LINE__);    \
        }                                                                                                \
    } while (0)
