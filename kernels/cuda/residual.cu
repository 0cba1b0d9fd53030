// Residual add and its pass-through gradient (CUDA twin of kernels/cpu/residual.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        out[i] = a[i] + b[i];
    }
}

// Either gradient may be null (an input that needs none); the branch is uniform across the grid.
static __global__ void residual_backward_kernel(float* da, float* db, const float* dout, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float gradient = dout[i];
        if (da != nullptr) da[i] += gradient;
        if (db != nullptr) db[i] += gradient;
    }
}

void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(residual_forward_kernel, elementwise_grid(N, block_size), block_size, 0, stream, out, a, b, N);
}

void residual_backward(float* da, float* db, const float* dout, int64_t N, cudaStream_t stream) {
    if (N == 0 || (da == nullptr && db == nullptr)) return;
    ENGINE_LAUNCH(residual_backward_kernel, elementwise_grid(N, block_size), block_size, 0, stream, da, db, dout, N);
}

} // namespace engine::kernels::cuda
