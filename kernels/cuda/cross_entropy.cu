// Softmax cross-entropy over the last dimension, one block per row (CUDA twin of
// kernels/cpu/cross_entropy.cpp). Max-subtraction keeps exp() in range for any logits. bf16 logits: statistics
// and losses in f32, the gradient rounded once on store.
#include <cfloat>
#include <cstdint>

#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;

struct RowStatistics {
    float max;
    float sum_exp; // sum of exp(logit - max)
};

template <typename T>
__device__ RowStatistics row_statistics(const T* row, int V, float* scratch) {
    float local_max = -FLT_MAX;
    for (int i = threadIdx.x; i < V; i += blockDim.x) local_max = fmaxf(local_max, widen(row[i]));
    const float row_max = block_max(local_max, scratch);
    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) local_sum += expf(widen(row[i]) - row_max);
    return RowStatistics{row_max, block_sum(local_sum, scratch)};
}

// Online softmax (Milakov & Gimelshein): a running maximum and the sum of exp(value - maximum), rescaled when
// the maximum grows, so one read of the row gives both.
struct OnlineSoftmax {
    float max = -FLT_MAX;
    float sum_exp = 0.0f;
    __device__ void add(float value) {
        if (value > max) {
            sum_exp = sum_exp * expf(max - value) + 1.0f;
            max = value;
        } else {
            sum_exp += expf(value - max);
        }
    }
};

// Packs of 4 (128-bit f32, 64-bit bf16 accesses, packs.cuh) need every row start aligned to a pack: padded_V a
// multiple of 4 and an aligned base.
template <typename T>
__device__ bool rows_are_vectorizable(const T* logits, int padded_V) {
    return padded_V % vector_width == 0 && reinterpret_cast<uintptr_t>(logits) % (vector_width * sizeof(T)) == 0;
}

// Each thread folds its own columns in a fixed order, then the block combines the threads' (max, sum) pairs:
// the maximum first, then every partial sum rescaled to it. Deterministic for any schedule.
template <typename T>
__device__ RowStatistics online_row_statistics(const T* row, int V, bool vectorized, float* scratch) {
    OnlineSoftmax local;
    if (vectorized) {
        for (int chunk = threadIdx.x; chunk * vector_width < V; chunk += blockDim.x) {
            const Pack<vector_width> values = load_pack<vector_width>(row + chunk * vector_width);
            for (int lane = 0; lane < vector_width && chunk * vector_width + lane < V; ++lane) local.add(values[lane]);
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) local.add(widen(row[i]));
    }
    const float row_max = block_max(local.max, scratch);
    // A thread with no columns has sum 0, and 0 * expf(-FLT_MAX - row_max) is 0, never NaN.
    const float row_sum = block_sum(local.sum_exp * expf(local.max - row_max), scratch);
    return RowStatistics{row_max, row_sum};
}

__device__ float fused_gradient(float logit, int column, int V, int target, const RowStatistics& statistics,
                                float inverse_sum, float dloss) {
    if (column >= V) return 0.0f; // padded columns are no class: zero gradient keeps their weights at zero
    const float probability = expf(logit - statistics.max) * inverse_sum;
    return (probability - (column == target ? 1.0f : 0.0f)) * dloss;
}
} // namespace

template <typename T>
static __global__ void cross_entropy_forward_kernel(float* losses, const T* logits, const int32_t* targets, int V,
                                                    int ignore_index) {
    __shared__ float scratch[warp_size];
    const int row = blockIdx.x;
    const int target = targets[row];
    if (target == ignore_index) { // uniform per block, so skipping the barriers is safe
        if (threadIdx.x == 0) losses[row] = 0.0f;
        return;
    }
    const T* x = logits + int64_t(row) * V;
    const RowStatistics statistics = row_statistics(x, V, scratch);
    if (threadIdx.x == 0) losses[row] = logf(statistics.sum_exp) + statistics.max - widen(x[target]);
}

template <typename T>
static __global__ void cross_entropy_backward_kernel(T* dlogits, const float* dlosses, const T* logits,
                                                     const int32_t* targets, int V, int ignore_index) {
    __shared__ float scratch[warp_size];
    const int row = blockIdx.x;
    const int target = targets[row];
    if (target == ignore_index) return;
    const T* x = logits + int64_t(row) * V;
    const RowStatistics statistics = row_statistics(x, V, scratch);
    const float dloss = dlosses[row];
    const float inverse_sum = 1.0f / statistics.sum_exp;
    T* dx = dlogits + int64_t(row) * V;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float probability = expf(widen(x[i]) - statistics.max) * inverse_sum;
        dx[i] = narrow<T>(widen(dx[i]) + (probability - (i == target ? 1.0f : 0.0f)) * dloss);
    }
}

// One block per row. Ignored rows write zeros (the buffer becomes the gradient, so every element is written).
template <typename T>
static __global__ void cross_entropy_fused_forward_kernel(float* losses, T* logits, const int32_t* targets,
                                                          float dloss, int V, int padded_V, int ignore_index) {
    __shared__ float scratch[warp_size];
    const int row = blockIdx.x;
    const int target = targets[row];
    T* x = logits + int64_t(row) * padded_V;
    const bool vectorized = rows_are_vectorizable(logits, padded_V);
    if (target == ignore_index) { // uniform per block, so skipping the barriers is safe
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (vectorized) {
            const Pack<vector_width> zeros{};
            for (int chunk = threadIdx.x; chunk < padded_V / vector_width; chunk += blockDim.x)
                store_pack<vector_width>(x + chunk * vector_width, zeros);
        } else {
            for (int i = threadIdx.x; i < padded_V; i += blockDim.x) x[i] = narrow<T>(0.0f);
        }
        return;
    }
    // Read before the reductions' barriers, so before any thread overwrites it.
    const float target_logit = widen(x[target]);
    const RowStatistics statistics = online_row_statistics(x, V, vectorized, scratch);
    if (threadIdx.x == 0) losses[row] = logf(statistics.sum_exp) + statistics.max - target_logit;
    const float inverse_sum = 1.0f / statistics.sum_exp;
    // Each thread rewrites exactly the elements it alone reads, so the in-place write needs no barrier.
    if (vectorized) {
        for (int chunk = threadIdx.x; chunk < padded_V / vector_width; chunk += blockDim.x) {
            const int column = chunk * vector_width;
            Pack<vector_width> values = load_pack<vector_width>(x + column);
            for (int lane = 0; lane < vector_width; ++lane)
                values[lane] = fused_gradient(values[lane], column + lane, V, target, statistics, inverse_sum, dloss);
            store_pack<vector_width>(x + column, values); // bf16: each value rounded once
        }
    } else {
        for (int i = threadIdx.x; i < padded_V; i += blockDim.x)
            x[i] = narrow<T>(fused_gradient(widen(x[i]), i, V, target, statistics, inverse_sum, dloss));
    }
}

// dout[0] is read on the device, so backward needs no host synchronisation to decide.
template <typename T>
static __global__ void cross_entropy_fused_rescale_kernel(T* dlogits, const float* dout, float expected_dout,
                                                          int64_t count) {
    const float ratio = dout[0] / expected_dout;
    if (ratio == 1.0f) return;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        dlogits[i] = narrow<T>(widen(dlogits[i]) * ratio);
}

template <typename T>
void cross_entropy_forward(float* losses, const T* logits, const int32_t* targets, int N, int V, int ignore_index,
                           cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(cross_entropy_forward_kernel<T>, N, block_size, 0, stream, losses, logits, targets, V, ignore_index);
}

template <typename T>
void cross_entropy_backward(T* dlogits, const float* dlosses, const T* logits, const int32_t* targets, int N, int V,
                            int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(cross_entropy_backward_kernel<T>, N, block_size, 0, stream, dlogits, dlosses, logits, targets, V,
                  ignore_index);
}

template <typename T>
void cross_entropy_fused_forward(float* losses, T* logits, const int32_t* targets, float dloss, int N, int V,
                                 int padded_V, int ignore_index, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(cross_entropy_fused_forward_kernel<T>, N, block_size, 0, stream, losses, logits, targets, dloss, V,
                  padded_V, ignore_index);
}

template <typename T>
void cross_entropy_fused_rescale(T* dlogits, const float* dout, float expected_dout, int64_t count,
                                 cudaStream_t stream) {
    if (count == 0) return;
    ENGINE_LAUNCH(cross_entropy_fused_rescale_kernel<T>, elementwise_grid(count, block_size), block_size, 0, stream,
                  dlogits, dout, expected_dout, count);
}

#define ENGINE_CROSS_ENTROPY_INSTANCES(T)                                                                          \
    template void cross_entropy_forward<T>(float*, const T*, const int32_t*, int, int, int, cudaStream_t);        \
    template void cross_entropy_backward<T>(T*, const float*, const T*, const int32_t*, int, int, int,            \
                                            cudaStream_t);                                                         \
    template void cross_entropy_fused_forward<T>(float*, T*, const int32_t*, float, int, int, int, int,            \
                                                 cudaStream_t);                                                    \
    template void cross_entropy_fused_rescale<T>(T*, const float*, float, int64_t, cudaStream_t);
ENGINE_CROSS_ENTROPY_INSTANCES(float)
ENGINE_CROSS_ENTROPY_INSTANCES(bfloat16)
#undef ENGINE_CROSS_ENTROPY_INSTANCES

} // namespace engine::kernels::cuda
