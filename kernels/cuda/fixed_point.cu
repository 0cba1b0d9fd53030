// The batch-invariant mode's gradient fold on the device: CUDA twin of kernels/cpu/fixed_point.cpp, which says why the
// double sum stays exact. Both passes stream their tensors once (fold: 4 + 8 bytes read, 4 + 8 written per element;
// round: 8 read, 4 written), so they run at memory bandwidth.
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void fixed_point_fold_kernel(double* sum, uint32_t* largest, float* gradient, double up, double down,
                                               int64_t N) {
    uint32_t local = 0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float value = gradient[i];
        const uint32_t bits = __float_as_uint(fabsf(value));
        local = bits > local ? bits : local;
        sum[i] += rint(static_cast<double>(value) * up) * down; // ties to even, as the CPU's nearbyint
        gradient[i] = 0.0f;
    }
    // The largest |g|'s bits: a max is exact in any order, so the atomic leaves the same value whatever the schedule.
    for (int offset = warp_size / 2; offset > 0; offset /= 2) {
        const uint32_t other = __shfl_xor_sync(full_warp_mask, local, offset);
        local = other > local ? other : local;
    }
    if (threadIdx.x % warp_size == 0 && local != 0) atomicMax(largest, local);
}

void fixed_point_fold(double* sum, uint32_t* largest, float* gradient, int exponent, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(fixed_point_fold_kernel, elementwise_grid(N, block_size), block_size, 0, stream, sum, largest,
                  gradient, ldexp(1.0, exponent), ldexp(1.0, -exponent), N);
}

static __global__ void fixed_point_round_kernel(float* gradient, const double* sum, int64_t N) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x)
        gradient[i] = static_cast<float>(sum[i]); // __double2float_rn
}

void fixed_point_round(float* gradient, const double* sum, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(fixed_point_round_kernel, elementwise_grid(N, block_size), block_size, 0, stream, gradient, sum, N);
}

} // namespace engine::kernels::cuda
