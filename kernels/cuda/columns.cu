// The first columns of each row, copied out and their gradient added back (CUDA twin of
// kernels/cpu/columns.cpp): one grid-stride thread per output element.
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void first_columns_forward_kernel(float* out, const float* inp, int64_t total, int columns,
                                                    int count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = inp[(i / count) * columns + i % count];
}

static __global__ void first_columns_backward_kernel(float* dinp, const float* dout, int64_t total, int columns,
                                                     int count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        dinp[(i / count) * columns + i % count] += dout[i];
}

void first_columns_forward(float* out, const float* inp, int64_t N, int columns, int count, cudaStream_t stream) {
    const int64_t total = N * count;
    if (total == 0) return;
    ENGINE_LAUNCH(first_columns_forward_kernel, elementwise_grid(total, block_size), block_size, 0, stream, out, inp,
                  total, columns, count);
}

void first_columns_backward(float* dinp, const float* dout, int64_t N, int columns, int count, cudaStream_t stream) {
    const int64_t total = N * count;
    if (total == 0) return;
    ENGINE_LAUNCH(first_columns_backward_kernel, elementwise_grid(total, block_size), block_size, 0, stream, dinp, dout,
                  total, columns, count);
}

} // namespace engine::kernels::cuda
