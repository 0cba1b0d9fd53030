// Elementwise helpers: fill, scale, axpy (CUDA twin of kernels/cpu/elementwise.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

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
    ENGINE_LAUNCH(fill_kernel, elementwise_grid(N, block_size), block_size, 0, stream, x, value, N);
}

void scale(float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(scale_kernel, elementwise_grid(N, block_size), block_size, 0, stream, x, alpha, N);
}

void axpy(float* y, const float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(axpy_kernel, elementwise_grid(N, block_size), block_size, 0, stream, y, x, alpha, N);
}

} // namespace engine::kernels::cuda
