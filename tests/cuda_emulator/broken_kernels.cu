// Kernels with one deliberate bug each, for tests/cuda_emulator/test_detection.cpp: each test asserts that
// the emulated device catches its bug. Built in the emulated configuration only, never for a GPU.
#include "base/cuda/launch.h"
#include "tests/cuda_emulator/test_kernels.h"

namespace engine::test::emulated {
namespace {
constexpr unsigned full_mask = 0xffffffffu;

__device__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(full_mask, value, offset);
    return value;
}

// The bug: no __syncthreads() before `scratch` is written, so when this runs twice in a row a warp that
// is ahead overwrites the first call's partial sums before slower warps have read them.
__device__ float block_sum_missing_barrier(float value, float* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_sum(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    const float partial = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
    return warp_sum(partial);
}
} // namespace

static __global__ void two_block_sums_kernel(float* out, const float* in) {
    __shared__ float scratch[32];
    const float value = in[blockIdx.x * blockDim.x + threadIdx.x];
    const float sum = block_sum_missing_barrier(value, scratch);
    const float sum_of_squares = block_sum_missing_barrier(value * value, scratch);
    if (threadIdx.x == 0) {
        out[4 * blockIdx.x] = sum;
        out[4 * blockIdx.x + 1] = sum_of_squares;
    }
    if (threadIdx.x == blockDim.x - 1) {
        out[4 * blockIdx.x + 2] = sum;
        out[4 * blockIdx.x + 3] = sum_of_squares;
    }
}

// The bug: the bound check is on i, but the read is of i + 1.
static __global__ void shift_left_kernel(float* out, const float* in, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i + 1];
}

// The bug: the mask names all 32 lanes, but the block's last warp may have fewer.
static __global__ void full_mask_warp_sum_kernel(float* out, const float* in) {
    const float sum = warp_sum(in[threadIdx.x]);
    if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = sum;
}

void two_block_sums_missing_barrier(float* out, const float* in, int blocks, int threads, cudaStream_t stream) {
    ENGINE_LAUNCH(two_block_sums_kernel, blocks, threads, 0, stream, out, in);
}

void shift_left_off_by_one(float* out, const float* in, int n, cudaStream_t stream) {
    ENGINE_LAUNCH(shift_left_kernel, (n + 255) / 256, 256, 0, stream, out, in, n);
}

void full_mask_warp_sum(float* out, const float* in, int threads, cudaStream_t stream) {
    ENGINE_LAUNCH(full_mask_warp_sum_kernel, 1, threads, 0, stream, out, in);
}

} // namespace engine::test::emulated
