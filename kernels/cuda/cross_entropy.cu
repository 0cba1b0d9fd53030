// Softmax cross-entropy over the last dimension, one block per row (CUDA twin of
// kernels/cpu/cross_entropy.cpp). Max-subtraction keeps exp() in range for any logits.
#include <cfloat>

#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;

struct RowStatistics {
    float max;
    float sum_exp; // sum of exp(logit - max)
};

__device__ RowStatistics row_statistics(const float* row, int V, float* scratch) {
    float local_max = -FLT_MAX;
    for (int i = threadIdx.x; i < V; i += blockDim.x) local_max = fmaxf(local_max, row[i]);
    const float row_max = block_max(local_max, scratch);
    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) local_sum += expf(row[i] - row_max);
    return RowStatistics{row_max, block_sum(local_sum, scratch)};
}
} // namespace

static __global__ void cross_entropy_forward_kernel(float* losses, const float* logits, const int32_t* targets,
                                                    int V, int ignore_index) {
    __shared__ float scratch[warp_size];
    const int row = blockIdx.x;
    const int target = targets[row];
    if (target == ignore_index) { // uniform per block, so skipping the barriers is safe
        if (threadIdx.x == 0) losses[row] = 0.0f;
        return;
    }
    const float* x = logits + int64_t(row) * V;
    const RowStatistics statistics = row_statistics(x, V, scratch);
    if (threadIdx.x == 0) losses[row] = logf(statistics.sum_exp) + statistics.max - x[target];
}

static __global__ void cross_entropy_backward_kernel(float* dlogits, const float* dlosses, const float* logits,
                                                     const int32_t* targets, int V, int ignore_index) {
    __shared__ float scratch[warp_size];
    const int row = blockIdx.x;
    const int target = targets[row];
    if (target == ignore_index) return;
    const float* x = logits + int64_t(row) * V;
    const RowStatistics statistics = row_statistics(x, V, scratch);
    const float dloss = dlosses[row];
    const float inverse_sum = 1.0f / statistics.sum_exp;
    float* dx = dlogits + int64_t(row) * V;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float probability = expf(x[i] - statistics.max) * inverse_sum;
        dx[i] += (probability - (i == target ? 1.0f : 0.0f)) * dloss;
    }
}

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                           int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(cross_entropy_forward_kernel, N, block_size, 0, stream, losses, logits, targets, V, ignore_index);
}

void cross_entropy_backward(float* dlogits, const float* dlosses, const float* logits, const int32_t* targets,
                            int N, int V, int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(cross_entropy_backward_kernel, N, block_size, 0, stream, dlogits, dlosses, logits, targets, V,
                  ignore_index);
}

} // namespace engine::kernels::cuda
