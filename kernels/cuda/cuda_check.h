// Error checking for CUDA and cuBLAS calls: every failure becomes an engine::EngineError naming the call
// and its file:line, because library code never exits and tests must be able to EXPECT_THROW.
#pragma once

#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/error.h"

namespace engine::kernels::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
    // A failed runtime call also sets the runtime's last error; clear it, or the next CUDA_CHECK_LAUNCH would
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

// Grid sizes: the number of `denominator`-sized pieces that cover `numerator` items.
constexpr int ceil_div(int64_t numerator, int64_t denominator) {
    return static_cast<int>((numerator + denominator - 1) / denominator);
}

// Elementwise kernels loop grid-stride, so their grid is capped here rather than growing with N: the cap
// keeps grids valid for N beyond 2^31 and is large enough to fill every SM many times over.
inline constexpr int max_elementwise_blocks = 65535;
constexpr int elementwise_grid(int64_t count, int block_size) {
    const int blocks = ceil_div(count, block_size);
    return blocks < 1 ? 1 : (blocks > max_elementwise_blocks ? max_elementwise_blocks : blocks);
}

} // namespace engine::kernels::cuda

#define CUDA_CHECK(expr)                                                                                 \
    do {                                                                                                 \
        const cudaError_t cuda_check_status = (expr);                                                    \
        if (cuda_check_status != cudaSuccess) {                                                          \
            ::engine::kernels::cuda::throw_cuda_error(cuda_check_status, #expr, __FILE__, __LINE__);     \
        }                                                                                                \
    } while (0)

#define CUBLAS_CHECK(expr)                                                                               \
    do {                                                                                                 \
        const cublasStatus_t cublas_check_status = (expr);                                               \
        if (cublas_check_status != CUBLAS_STATUS_SUCCESS) {                                              \
            ::engine::kernels::cuda::throw_cublas_error(cublas_check_status, #expr, __FILE__, __LINE__); \
        }                                                                                                \
    } while (0)

// Follows every kernel launch: catches bad launch configurations where they happen.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
