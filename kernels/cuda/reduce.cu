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

template <bool square>
static __global__ void partial_sum_kernel(double* partials, const float* inp, int64_t N) {
    double sum = 0.0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const double value = inp[i];
        sum += square ? value * value : value;
    }
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
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

static __global__ void sum_backward_kernel(float* dinp, const float* dout, int64_t N, float scale) {
    const float gradient = scale * dout[0];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        dinp[i] += gradient;
    }
}

template <bool square>
static void two_stage_sum(float* float_out, double* double_out, double* partials, const float* inp, int64_t N,
                          double scale, cudaStream_t stream) {
    const int count = reduction_workspace_count(N);
    ENGINE_LAUNCH(partial_sum_kernel<square>, count, block_size, 0, stream, partials, inp, N);
    ENGINE_LAUNCH(final_sum_kernel, 1, final_block_size, 0, stream, float_out, double_out, partials, count, scale);
}

void sum_forward(float* out, double* partials_workspace, const float* inp, int64_t N, float scale,
                 cudaStream_t stream) {
    two_stage_sum<false>(out, nullptr, partials_workspace, inp, N, scale, stream);
}

void sum_backward(float* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(sum_backward_kernel, elementwise_grid(N, block_size), block_size, 0, stream, dinp, dout, N, scale);
}

void sum_of_squares(double* out, double* partials_workspace, const float* inp, int64_t N, cudaStream_t stream) {
    two_stage_sum<true>(nullptr, out, partials_workspace, inp, N, 1.0, stream);
}

} // namespace engine::kernels::cuda
