// The first columns of each row, copied out and their gradient added back (CUDA twin of
// kernels/cpu/columns.cpp): one grid-stride thread per output element, float or bf16 storage (the gradient
// adds in float and rounds once on store).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <typename T>
static __global__ void first_columns_forward_kernel(T* out, const T* inp, int64_t total, int columns, int count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = inp[(i / count) * columns + i % count];
}

template <typename T>
static __global__ void first_columns_backward_kernel(T* dinp, const T* dout, int64_t total, int columns, int count) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        T& destination = dinp[(i / count) * columns + i % count];
        destination = narrow<T>(widen(destination) + widen(dout[i]));
    }
}

template <typename T>
static void launch_first_columns_forward(T* out, const T* inp, int64_t N, int columns, int count,
                                         cudaStream_t stream) {
    const int64_t total = N * count;
    if (total == 0) return;
    ENGINE_LAUNCH(first_columns_forward_kernel<T>, elementwise_grid(total, block_size), block_size, 0, stream, out, inp,
                  total, columns, count);
}

template <typename T>
static void launch_first_columns_backward(T* dinp, const T* dout, int64_t N, int columns, int count,
                                          cudaStream_t stream) {
    const int64_t total = N * count;
    if (total == 0) return;
    ENGINE_LAUNCH(first_columns_backward_kernel<T>, elementwise_grid(total, block_size), block_size, 0, stream, dinp,
                  dout, total, columns, count);
}

void first_columns_forward(float* out, const float* inp, int64_t N, int columns, int count, cudaStream_t stream) {
    launch_first_columns_forward(out, inp, N, columns, count, stream);
}
void first_columns_forward(bfloat16* out, const bfloat16* inp, int64_t N, int columns, int count,
                           cudaStream_t stream) {
    launch_first_columns_forward(out, inp, N, columns, count, stream);
}
void first_columns_backward(float* dinp, const float* dout, int64_t N, int columns, int count, cudaStream_t stream) {
    launch_first_columns_backward(dinp, dout, N, columns, count, stream);
}
void first_columns_backward(bfloat16* dinp, const bfloat16* dout, int64_t N, int columns, int count,
                            cudaStream_t stream) {
    launch_first_columns_backward(dinp, dout, N, columns, count, stream);
}

} // namespace engine::kernels::cuda
