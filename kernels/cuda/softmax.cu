// softmax and log_softmax over one dimension (CUDA twin of kernels/cpu/softmax.cpp). inner == 1: a warp per
// row, three passes (max, sum of exponentials, write) with warp-shuffle reductions; inner > 1: a thread per
// (outer, inner) column, adjacent threads on adjacent columns so each step of the loop over the dimension is
// one coalesced read. Both are bounded by memory bandwidth (the row is read three times; it stays in L1/L2
// for rows of up to a few thousand elements). Storage T is float or bf16; arithmetic is float.
#include <cmath>

#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int rows_per_block = block_size / warp_size;
} // namespace

template <typename T, bool logarithm>
static __global__ void softmax_rows_kernel(T* out, const T* inp, int64_t rows, int64_t size) {
    const int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return; // whole warps leave together: the shuffles below stay full-warp
    const T* x = inp + row * size;
    T* y = out + row * size;
    float maximum = -INFINITY;
    for (int64_t i = lane; i < size; i += warp_size) maximum = fmaxf(maximum, widen(x[i]));
    maximum = warp_max(maximum);
    float total = 0.0f;
    for (int64_t i = lane; i < size; i += warp_size) total += expf(widen(x[i]) - maximum);
    total = warp_sum(total);
    if constexpr (logarithm) {
        const float log_total = logf(total); // (x - max) - log(total), as the CPU twin
        for (int64_t i = lane; i < size; i += warp_size) y[i] = narrow<T>((widen(x[i]) - maximum) - log_total);
    } else {
        const float reciprocal = 1.0f / total;
        for (int64_t i = lane; i < size; i += warp_size) y[i] = narrow<T>(expf(widen(x[i]) - maximum) * reciprocal);
    }
}

template <typename T, bool logarithm>
static __global__ void softmax_columns_kernel(T* out, const T* inp, int64_t outer, int64_t size, int64_t inner) {
    const int64_t columns = outer * inner;
    for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < columns;
         column += int64_t(gridDim.x) * blockDim.x) {
        const int64_t base = (column / inner) * size * inner + column % inner;
        const T* x = inp + base;
        T* y = out + base;
        float maximum = -INFINITY;
        for (int64_t i = 0; i < size; ++i) maximum = fmaxf(maximum, widen(x[i * inner]));
        float total = 0.0f;
        for (int64_t i = 0; i < size; ++i) total += expf(widen(x[i * inner]) - maximum);
        if constexpr (logarithm) {
            const float log_total = logf(total);
            for (int64_t i = 0; i < size; ++i) y[i * inner] = narrow<T>((widen(x[i * inner]) - maximum) - log_total);
        } else {
            const float reciprocal = 1.0f / total;
            for (int64_t i = 0; i < size; ++i)
                y[i * inner] = narrow<T>(expf(widen(x[i * inner]) - maximum) * reciprocal);
        }
    }
}

// dinp += out * (dout - sum(dout * out)) (softmax) or dout - exp(out) * sum(dout) (log_softmax).
template <typename T, bool logarithm>
static __device__ __forceinline__ float softmax_local_gradient(float gradient, float value, float total) {
    if constexpr (logarithm) return gradient - expf(value) * total;
    else return value * (gradient - total);
}

template <typename T, bool logarithm>
static __global__ void softmax_backward_rows_kernel(T* dinp, const T* dout, const T* out, int64_t rows,
                                                    int64_t size) {
    const int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const T* dy = dout + row * size;
    const T* y = out + row * size;
    T* dx = dinp + row * size;
    float total = 0.0f;
    for (int64_t i = lane; i < size; i += warp_size)
        total += logarithm ? widen(dy[i]) : widen(dy[i]) * widen(y[i]);
    total = warp_sum(total);
    for (int64_t i = lane; i < size; i += warp_size)
        dx[i] = narrow<T>(widen(dx[i]) + softmax_local_gradient<T, logarithm>(widen(dy[i]), widen(y[i]), total));
}

template <typename T, bool logarithm>
static __global__ void softmax_backward_columns_kernel(T* dinp, const T* dout, const T* out, int64_t outer,
                                                       int64_t size, int64_t inner) {
    const int64_t columns = outer * inner;
    for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < columns;
         column += int64_t(gridDim.x) * blockDim.x) {
        const int64_t base = (column / inner) * size * inner + column % inner;
        const T* dy = dout + base;
        const T* y = out + base;
        T* dx = dinp + base;
        float total = 0.0f;
        for (int64_t i = 0; i < size; ++i)
            total += logarithm ? widen(dy[i * inner]) : widen(dy[i * inner]) * widen(y[i * inner]);
        for (int64_t i = 0; i < size; ++i)
            dx[i * inner] = narrow<T>(widen(dx[i * inner]) + softmax_local_gradient<T, logarithm>(
                                                                 widen(dy[i * inner]), widen(y[i * inner]), total));
    }
}

template <typename T, bool logarithm>
static void launch_softmax_forward(T* out, const T* inp, int64_t outer, int64_t size, int64_t inner,
                                   cudaStream_t stream) {
    if (outer * size * inner == 0) return;
    if (inner == 1)
        ENGINE_LAUNCH((softmax_rows_kernel<T, logarithm>), ceil_div(outer, rows_per_block), block_size, 0, stream,
                      out, inp, outer, size);
    else
        ENGINE_LAUNCH((softmax_columns_kernel<T, logarithm>), elementwise_grid(outer * inner, block_size), block_size,
                      0, stream, out, inp, outer, size, inner);
}

template <typename T, bool logarithm>
static void launch_softmax_backward(T* dinp, const T* dout, const T* out, int64_t outer, int64_t size, int64_t inner,
                                    cudaStream_t stream) {
    if (outer * size * inner == 0) return;
    if (inner == 1)
        ENGINE_LAUNCH((softmax_backward_rows_kernel<T, logarithm>), ceil_div(outer, rows_per_block), block_size, 0,
                      stream, dinp, dout, out, outer, size);
    else
        ENGINE_LAUNCH((softmax_backward_columns_kernel<T, logarithm>), elementwise_grid(outer * inner, block_size),
                      block_size, 0, stream, dinp, dout, out, outer, size, inner);
}

void softmax_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, cudaStream_t stream) {
    launch_softmax_forward<float, false>(out, inp, outer, size, inner, stream);
}
void softmax_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                     cudaStream_t stream) {
    launch_softmax_forward<bfloat16, false>(out, inp, outer, size, inner, stream);
}
void log_softmax_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner,
                         cudaStream_t stream) {
    launch_softmax_forward<float, true>(out, inp, outer, size, inner, stream);
}
void log_softmax_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                         cudaStream_t stream) {
    launch_softmax_forward<bfloat16, true>(out, inp, outer, size, inner, stream);
}
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t outer, int64_t size, int64_t inner,
                      cudaStream_t stream) {
    launch_softmax_backward<float, false>(dinp, dout, out, outer, size, inner, stream);
}
void softmax_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* out, int64_t outer, int64_t size,
                      int64_t inner, cudaStream_t stream) {
    launch_softmax_backward<bfloat16, false>(dinp, dout, out, outer, size, inner, stream);
}
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t outer, int64_t size,
                          int64_t inner, cudaStream_t stream) {
    launch_softmax_backward<float, true>(dinp, dout, out, outer, size, inner, stream);
}
void log_softmax_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* out, int64_t outer, int64_t size,
                          int64_t inner, cudaStream_t stream) {
    launch_softmax_backward<bfloat16, true>(dinp, dout, out, outer, size, inner, stream);
}

} // namespace engine::kernels::cuda
