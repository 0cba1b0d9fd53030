// Elementwise helpers: fill, scale, axpy (CUDA twin of kernels/cpu/elementwise.cpp), with 128-bit accesses
// when the pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <int width>
static __global__ void fill_kernel(float* x, float value, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        Pack<count> pack;
        for (int k = 0; k < count; ++k) pack[k] = value;
        store_pack<count>(x + index, pack);
    });
}

template <int width>
static __global__ void scale_kernel(float* x, float alpha, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        Pack<count> pack = load_pack<count>(x + index);
        for (int k = 0; k < count; ++k) pack[k] *= alpha;
        store_pack<count>(x + index, pack);
    });
}

template <int width>
static __global__ void axpy_kernel(float* y, const float* x, float alpha, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> source = load_pack<count>(x + index);
        Pack<count> pack = load_pack<count>(y + index);
        for (int k = 0; k < count; ++k) pack[k] += alpha * source[k];
        store_pack<count>(y + index, pack);
    });
}

void fill(float* x, float value, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(fill_kernel, vector_aligned(x), N, block_size, stream, x, value, N);
}

void scale(float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(scale_kernel, vector_aligned(x), N, block_size, stream, x, alpha, N);
}

template <typename Scalar, typename Source, int width>
static __global__ void mixed_axpy_kernel(Scalar* y, const Source* x, float alpha, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> source = load_pack<count>(x + index);
        Pack<count> pack = load_pack<count>(y + index);
        for (int k = 0; k < count; ++k) pack[k] += alpha * source[k];
        store_pack<count>(y + index, pack);
    });
}

template <typename Scalar, typename Source>
void axpy(Scalar* y, const Source* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    if (vector_aligned(y, x))
        ENGINE_LAUNCH((mixed_axpy_kernel<Scalar, Source, vector_width>), elementwise_grid(N, block_size, vector_width),
                      block_size, 0, stream, y, x, alpha, N);
    else ENGINE_LAUNCH((mixed_axpy_kernel<Scalar, Source, 1>), elementwise_grid(N, block_size), block_size, 0, stream, y,
                       x, alpha, N);
}
template void axpy<bfloat16, bfloat16>(bfloat16*, const bfloat16*, float, int64_t, cudaStream_t);
template void axpy<float, bfloat16>(float*, const bfloat16*, float, int64_t, cudaStream_t);
template void axpy<bfloat16, float>(bfloat16*, const float*, float, int64_t, cudaStream_t);

void axpy(float* y, const float* x, float alpha, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(axpy_kernel, vector_aligned(y, x), N, block_size, stream, y, x, alpha, N);
}

} // namespace engine::kernels::cuda
