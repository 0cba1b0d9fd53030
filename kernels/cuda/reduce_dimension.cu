// sum (scaled: sum, mean) and max over one dimension (CUDA twin of kernels/cpu/reduce_dimension.cpp). inner == 1:
// a warp per row with warp-shuffle reductions; inner > 1: a thread per (outer, inner) column looping the
// dimension, coalesced across inner. Sums run in float in a fixed order (lane-strided partials, then the
// shuffle tree), the CPU's in double. Bounded by memory bandwidth: each input element is read once.
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

template <typename T>
static __global__ void sum_rows_kernel(T* out, const T* inp, int64_t rows, int64_t size, float scale) {
    const int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return; // whole warps leave together
    const T* x = inp + row * size;
    float total = 0.0f;
    for (int64_t i = lane; i < size; i += warp_size) total += widen(x[i]);
    total = warp_sum(total);
    if (lane == 0) out[row] = narrow<T>(scale * total);
}

template <typename T>
static __global__ void sum_columns_kernel(T* out, const T* inp, int64_t outer, int64_t size, int64_t inner,
                                          float scale) {
    const int64_t columns = outer * inner;
    for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < columns;
         column += int64_t(gridDim.x) * blockDim.x) {
        const T* x = inp + (column / inner) * size * inner + column % inner;
        float total = 0.0f;
        for (int64_t i = 0; i < size; ++i) total += widen(x[i * inner]);
        out[column] = narrow<T>(scale * total);
    }
}

// A thread per input element: dinp[o,i,n] += scale * dout[o,n].
template <typename T>
static __global__ void sum_backward_kernel(T* dinp, const T* dout, int64_t count, int64_t size, int64_t inner,
                                           float scale) {
    for (int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        const int64_t source = (index / (size * inner)) * inner + index % inner;
        dinp[index] = narrow<T>(widen(dinp[index]) + scale * widen(dout[source]));
    }
}

// (value, index) b replaces a when it is greater, or equal at a smaller index; a NaN beats any number and the
// earlier NaN another NaN, so the result is the CPU's first-index argmax whatever the combining order.
static __device__ __forceinline__ bool replaces(float b, int b_index, float a, int a_index) {
    const bool a_nan = isnan(a), b_nan = isnan(b);
    if (a_nan || b_nan) return b_nan && (!a_nan || b_index < a_index);
    return b > a || (b == a && b_index < a_index);
}

template <typename T>
static __global__ void max_rows_kernel(T* out, int32_t* indices, const T* inp, int64_t rows, int64_t size) {
    const int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const T* x = inp + row * size;
    float best = -INFINITY;
    int best_index = int(size); // past the end: any element replaces it (size > 0: the op checked)
    for (int64_t i = lane; i < size; i += warp_size) {
        const float value = widen(x[i]);
        if (replaces(value, int(i), best, best_index)) best = value, best_index = int(i);
    }
    for (int offset = warp_size / 2; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(full_warp_mask, best, offset);
        const int other_index = __shfl_xor_sync(full_warp_mask, best_index, offset);
        if (replaces(other, other_index, best, best_index)) best = other, best_index = other_index;
    }
    if (lane == 0) {
        out[row] = narrow<T>(best);
        indices[row] = best_index;
    }
}

template <typename T>
static __global__ void max_columns_kernel(T* out, int32_t* indices, const T* inp, int64_t outer, int64_t size,
                                          int64_t inner) {
    const int64_t columns = outer * inner;
    for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < columns;
         column += int64_t(gridDim.x) * blockDim.x) {
        const T* x = inp + (column / inner) * size * inner + column % inner;
        float best = widen(x[0]);
        int best_index = 0;
        for (int64_t i = 1; i < size && !isnan(best); ++i) {
            const float value = widen(x[i * inner]);
            if (value > best || isnan(value)) best = value, best_index = int(i);
        }
        out[column] = narrow<T>(best);
        indices[column] = best_index;
    }
}

// A thread per output element; distinct outputs scatter into distinct input elements, so no two threads meet.
template <typename T>
static __global__ void max_backward_kernel(T* dinp, const T* dout, const int32_t* indices, int64_t outer,
                                           int64_t size, int64_t inner) {
    const int64_t columns = outer * inner;
    for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < columns;
         column += int64_t(gridDim.x) * blockDim.x) {
        T* dx = dinp + ((column / inner) * size + indices[column]) * inner + column % inner;
        *dx = narrow<T>(widen(*dx) + widen(dout[column]));
    }
}

template <typename T>
static void launch_sum_forward(T* out, const T* inp, int64_t outer, int64_t size, int64_t inner, float scale,
                               cudaStream_t stream) {
    if (outer * inner == 0) return;
    if (inner == 1)
        ENGINE_LAUNCH(sum_rows_kernel<T>, ceil_div(outer, rows_per_block), block_size, 0, stream, out, inp, outer, size,
                      scale);
    else
        ENGINE_LAUNCH(sum_columns_kernel<T>, elementwise_grid(outer * inner, block_size), block_size, 0, stream, out,
                      inp, outer, size, inner, scale);
}

template <typename T>
static void launch_sum_backward(T* dinp, const T* dout, int64_t outer, int64_t size, int64_t inner, float scale,
                                cudaStream_t stream) {
    const int64_t count = outer * size * inner;
    if (count == 0) return;
    ENGINE_LAUNCH(sum_backward_kernel<T>, elementwise_grid(count, block_size), block_size, 0, stream, dinp, dout, count,
                  size, inner, scale);
}

template <typename T>
static void launch_max_forward(T* out, int32_t* indices, const T* inp, int64_t outer, int64_t size, int64_t inner,
                               cudaStream_t stream) {
    if (outer * inner == 0 || size == 0) return;
    if (inner == 1)
        ENGINE_LAUNCH(max_rows_kernel<T>, ceil_div(outer, rows_per_block), block_size, 0, stream, out, indices, inp,
                      outer, size);
    else
        ENGINE_LAUNCH(max_columns_kernel<T>, elementwise_grid(outer * inner, block_size), block_size, 0, stream, out,
                      indices, inp, outer, size, inner);
}

template <typename T>
static void launch_max_backward(T* dinp, const T* dout, const int32_t* indices, int64_t outer, int64_t size,
                                int64_t inner, cudaStream_t stream) {
    if (outer * inner == 0 || size == 0) return;
    ENGINE_LAUNCH(max_backward_kernel<T>, elementwise_grid(outer * inner, block_size), block_size, 0, stream, dinp,
                  dout, indices, outer, size, inner);
}

void sum_over_dimension_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, float scale,
                                cudaStream_t stream) {
    launch_sum_forward(out, inp, outer, size, inner, scale, stream);
}
void sum_over_dimension_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner,
                                float scale, cudaStream_t stream) {
    launch_sum_forward(out, inp, outer, size, inner, scale, stream);
}
void sum_over_dimension_backward(float* dinp, const float* dout, int64_t outer, int64_t size, int64_t inner,
                                 float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, outer, size, inner, scale, stream);
}
void sum_over_dimension_backward(bfloat16* dinp, const bfloat16* dout, int64_t outer, int64_t size, int64_t inner,
                                 float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, outer, size, inner, scale, stream);
}
void max_over_dimension_forward(float* out, int32_t* indices, const float* inp, int64_t outer, int64_t size,
                                int64_t inner, cudaStream_t stream) {
    launch_max_forward(out, indices, inp, outer, size, inner, stream);
}
void max_over_dimension_forward(bfloat16* out, int32_t* indices, const bfloat16* inp, int64_t outer, int64_t size,
                                int64_t inner, cudaStream_t stream) {
    launch_max_forward(out, indices, inp, outer, size, inner, stream);
}
void max_over_dimension_backward(float* dinp, const float* dout, const int32_t* indices, int64_t outer, int64_t size,
                                 int64_t inner, cudaStream_t stream) {
    launch_max_backward(dinp, dout, indices, outer, size, inner, stream);
}
void max_over_dimension_backward(bfloat16* dinp, const bfloat16* dout, const int32_t* indices, int64_t outer,
                                 int64_t size, int64_t inner, cudaStream_t stream) {
    launch_max_backward(dinp, dout, indices, outer, size, inner, stream);
}

} // namespace engine::kernels::cuda
