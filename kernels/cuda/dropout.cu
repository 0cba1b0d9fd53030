// Dropout with the shared Philox stream (kernels/common/philox.h), so that masks are bit-identical to the
// CPU twin (kernels/cpu/dropout.cpp) for the same (seed, offset). The mask is redrawn, never stored. Storage
// float or bf16; the scaling is in float and a bf16 value rounds once on store.
#include "base/cuda/check.h"
#include "base/cuda/launch.h"
#include "kernels/common/philox.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <typename T>
static __global__ void dropout_forward_kernel(T* out, const T* inp, float p, float keep_scale, uint64_t seed,
                                              uint64_t offset, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const bool keep = philox_uniform(seed, offset, static_cast<uint64_t>(i)) >= p;
        out[i] = narrow<T>(keep ? widen(inp[i]) * keep_scale : 0.0f);
    }
}

template <typename T>
static __global__ void dropout_backward_kernel(T* dinp, const T* dout, float p, float keep_scale, uint64_t seed,
                                               uint64_t offset, int64_t N) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const bool keep = philox_uniform(seed, offset, static_cast<uint64_t>(i)) >= p;
        if (keep) dinp[i] = narrow<T>(widen(dinp[i]) + widen(dout[i]) * keep_scale);
    }
}

// The scale is computed once on the host so that both devices multiply by the same float.
static float keep_scale_for(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

template <typename T>
static void launch_dropout_forward(T* out, const T* inp, float p, uint64_t seed, uint64_t offset, int64_t N,
                                   cudaStream_t stream) {
    if (N == 0) return;
    if (p == 0.0f) { // identity, as in the CPU twin; also skips drawing N random numbers
        if (out != inp) CUDA_CHECK(cudaMemcpyAsync(out, inp, N * sizeof(T), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    ENGINE_LAUNCH(dropout_forward_kernel<T>, elementwise_grid(N, block_size), block_size, 0, stream, out, inp, p,
                  keep_scale_for(p), seed, offset, N);
}

template <typename T>
static void launch_dropout_backward(T* dinp, const T* dout, float p, uint64_t seed, uint64_t offset, int64_t N,
                                    cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(dropout_backward_kernel<T>, elementwise_grid(N, block_size), block_size, 0, stream, dinp, dout, p,
                  keep_scale_for(p), seed, offset, N);
}

void dropout_forward(float* out, const float* inp, float p, uint64_t seed, uint64_t offset, int64_t N,
                     cudaStream_t stream) {
    launch_dropout_forward(out, inp, p, seed, offset, N, stream);
}
void dropout_forward(bfloat16* out, const bfloat16* inp, float p, uint64_t seed, uint64_t offset, int64_t N,
                     cudaStream_t stream) {
    launch_dropout_forward(out, inp, p, seed, offset, N, stream);
}
void dropout_backward(float* dinp, const float* dout, float p, uint64_t seed, uint64_t offset, int64_t N,
                      cudaStream_t stream) {
    launch_dropout_backward(dinp, dout, p, seed, offset, N, stream);
}
void dropout_backward(bfloat16* dinp, const bfloat16* dout, float p, uint64_t seed, uint64_t offset, int64_t N,
                      cudaStream_t stream) {
    launch_dropout_backward(dinp, dout, p, seed, offset, N, stream);
}

} // namespace engine::kernels::cuda
