// Sums (CUDA twin of kernels/cpu/reduce.cpp). Both reductions are two-stage and deterministic: a fixed
// number of blocks (a function of N only) each write a double partial, then one block adds the partials in
// a fixed order. No atomics, so the same input always gives the same bits. The partials live in the
// caller's workspace (reduction_workspace_count doubles).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int max_partials = 1024; // enough blocks to cover every SM several times
constexpr int final_block_size = 1024;
} // namespace

int reduction_workspace_count(int64_t N) {
    const int blocks = ceil_div(N, block_size);
    return blocks < 1 ? 1 : (blocks > max_partials ? max_partials : blocks);
}

// The block's sum of one double per thread. The scratch is declared in this plain function rather than in
// the template kernel below: the emulated device (docs/CUDA.md) can poison the static shared memory of
// non-template functions only.
static __device__ double block_sum_of(double value) {
    __shared__ double scratch[warp_size];
    return block_sum(value, scratch);
}

// Input float or bf16 (widened exactly): the partials are double either way.
template <bool square, typename T>
static __global__ void partial_sum_kernel(double* partials, const T* inp, int64_t N) {
    double sum = 0.0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const double value = widen(inp[i]);
        sum += square ? value * value : value;
    }
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// The gradient norm's first stage over many tensors in one launch: every block walks every tensor of the
// list with the same grid stride, so each element's block and each block's order of additions depend on the
// shapes only. `accumulate` adds to the partials of an earlier launch (lists longer than one launch holds).
static __global__ void list_partial_sum_of_squares_kernel(double* partials, TensorList list, bool accumulate) {
    double sum = 0.0;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int tensor = 0; tensor < list.size; ++tensor) {
        const float* values = list.data[tensor];
        for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < list.count[tensor]; i += stride) {
            const double value = values[i];
            sum += value * value;
        }
    }
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = accumulate ? partials[blockIdx.x] + sum : sum;
}

static __global__ void final_sum_kernel(float* float_out, double* double_out, const double* partials, int count,
                                        double scale) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) {
        if (float_out != nullptr) float_out[0] = static_cast<float>(scale * sum);
        if (double_out != nullptr) double_out[0] = sum;
    }
}

template <typename T>
static __global__ void sum_backward_kernel(T* dinp, const float* dout, int64_t N, float scale) {
    const float gradient = scale * dout[0];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        dinp[i] = narrow<T>(widen(dinp[i]) + gradient);
    }
}

template <bool square, typename T>
static void two_stage_sum(float* float_out, double* double_out, double* partials, const T* inp, int64_t N,
                          double scale, cudaStream_t stream) {
    const int count = reduction_workspace_count(N);
    ENGINE_LAUNCH((partial_sum_kernel<square, T>), count, block_size, 0, stream, partials, inp, N);
    ENGINE_LAUNCH(final_sum_kernel, 1, final_block_size, 0, stream, float_out, double_out, partials, count, scale);
}

void sum_forward(float* out, double* partials_workspace, const float* inp, int64_t N, float scale,
                 cudaStream_t stream) {
    two_stage_sum<false>(out, nullptr, partials_workspace, inp, N, scale, stream);
}
void sum_forward(float* out, double* partials_workspace, const bfloat16* inp, int64_t N, float scale,
                 cudaStream_t stream) {
    two_stage_sum<false>(out, nullptr, partials_workspace, inp, N, scale, stream);
}

template <typename T>
static void launch_sum_backward(T* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(sum_backward_kernel<T>, elementwise_grid(N, block_size), block_size, 0, stream, dinp, dout, N, scale);
}
void sum_backward(float* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, N, scale, stream);
}
void sum_backward(bfloat16* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, N, scale, stream);
}

void sum_of_squares(double* out, double* partials_workspace, const float* inp, int64_t N, cudaStream_t stream) {
    two_stage_sum<true>(nullptr, out, partials_workspace, inp, N, 1.0, stream);
}

void sum_of_squares_list(double* out, double* partials_workspace, const float* const* tensors, const int64_t* counts,
                         int tensor_count, cudaStream_t stream) {
    int64_t largest = 0;
    for (int tensor = 0; tensor < tensor_count; ++tensor) largest = counts[tensor] > largest ? counts[tensor] : largest;
    // Sized by the largest tensor: smaller ones leave blocks idle, and a grid sized by the total would only
    // stretch the largest one's stride.
    const int blocks = reduction_workspace_count(largest);
    for (int first = 0; first == 0 || first < tensor_count; first += tensor_list_capacity) {
        TensorList list{};
        list.size = tensor_count - first < tensor_list_capacity ? tensor_count - first : tensor_list_capacity;
        for (int index = 0; index < list.size; ++index) {
            list.data[index] = tensors[first + index];
            list.count[index] = counts[first + index];
        }
        ENGINE_LAUNCH(list_partial_sum_of_squares_kernel, blocks, block_size, 0, stream, partials_workspace, list,
                      first > 0);
    }
    ENGINE_LAUNCH(final_sum_kernel, 1, final_block_size, 0, stream, nullptr, out, partials_workspace, blocks, 1.0);
}

} // namespace engine::kernels::cuda
