// Bias broadcast add and its column-sum gradient (CUDA twin of kernels/cpu/bias.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void bias_add_forward_kernel(float* out, const float* bias, int OC, int64_t count) {
    for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        out[index] += bias[index % OC];
    }
}

// One thread per column walking the rows: adjacent threads read adjacent columns (coalesced) and the sum is
// deterministic. As in the CPU twin, the column is summed in double from zero and added to dbias once, so
// the two differ only by the final rounding, not by N float roundings.
static __global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= OC) return;
    double sum = 0.0;
    for (int row = 0; row < N; ++row) sum += dout[int64_t(row) * OC + column];
    dbias[column] += static_cast<float>(sum);
}

void bias_add_forward(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
    const int64_t count = int64_t(N) * OC;
    if (count == 0) return;
    ENGINE_LAUNCH(bias_add_forward_kernel, elementwise_grid(count, block_size), block_size, 0, stream, out, bias, OC,
                  count);
}

void bias_backward(float* dbias, const float* dout, int N, int OC, cudaStream_t stream) {
    if (OC == 0) return;
    ENGINE_LAUNCH(bias_backward_kernel, ceil_div(OC, block_size), block_size, 0, stream, dbias, dout, N, OC);
}

} // namespace engine::kernels::cuda
