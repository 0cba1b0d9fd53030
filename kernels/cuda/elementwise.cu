// Elementwise helpers: fill, scale, axpy (CUDA twin of kernels/cpu/elementwise.cpp).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void fill_kernel(float* x, float value, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] = value;
    }
}

static __global__ void scale_kernel(float* x, float alpha, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        x[i] *= alpha;
    }
}

static __global__ void axpy_kernel(float* y, const float* x, float alpha, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        y[i] += alpha * x[i];
    }
}

void fill(float* x, float value, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    fill_kernel<<<elementwise_grid(N, block_size), block_size, 0, stream>>>(x, value, N);
    CUDA_CHECK_LAUNCH();
}

void scale(float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    scale_kernel<<<elementwise_grid(N, block_size), block_size, 0, stream>>>(x, alpha, N);
    CUDA_CHECK_LAUNCH();
}

void axpy(float* y, const float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    axpy_kernel<<<elementwise_grid(N, block_size), block_size, 0, stream>>>(y, x, alpha, N);
    CUDA_CHECK_LAUNCH();
}

} // namespace engine::kernels::cuda
