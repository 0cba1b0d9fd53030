// Residual add and its pass-through gradient (CUDA twin of kernels/cpu/residual.cpp), with 128-bit accesses
// when the pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

// Templated on the storage type T: packs widen on load and round once on store (kernels/cuda/packs.cuh).
template <typename T, int width>
static __global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> right = load_pack<count>(b + index);
        Pack<count> pack = load_pack<count>(a + index);
        for (int k = 0; k < count; ++k) pack[k] += right[k];
        store_pack<count>(out + index, pack);
    });
}

// Either gradient may be null (an input that needs none); the branch is uniform across the grid.
template <typename T, int width>
static __global__ void residual_backward_kernel(T* da, T* db, const T* dout, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> gradient = load_pack<count>(dout + index);
        auto accumulate = [&](T* destination) {
            if (destination == nullptr) return;
            Pack<count> pack = load_pack<count>(destination + index);
            for (int k = 0; k < count; ++k) pack[k] += gradient[k];
            store_pack<count>(destination + index, pack);
        };
        accumulate(da);
        accumulate(db);
    });
}

template <typename T>
static void launch_residual_forward(T* out, const T* a, const T* b, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(residual_forward_kernel, T, vector_aligned(out, a, b), N, block_size, stream, out, a, b,
                               N);
}

template <typename T>
static void launch_residual_backward(T* da, T* db, const T* dout, int64_t N, cudaStream_t stream) {
    if (N == 0 || (da == nullptr && db == nullptr)) return;
    ENGINE_LAUNCH_PACKED_TYPED(residual_backward_kernel, T, vector_aligned(da, db, dout), N, block_size, stream, da,
                               db, dout, N);
}

void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream) {
    launch_residual_forward(out, a, b, N, stream);
}
void residual_forward(bfloat16* out, const bfloat16* a, const bfloat16* b, int64_t N, cudaStream_t stream) {
    launch_residual_forward(out, a, b, N, stream);
}
void residual_backward(float* da, float* db, const float* dout, int64_t N, cudaStream_t stream) {
    launch_residual_backward(da, db, dout, N, stream);
}
void residual_backward(bfloat16* da, bfloat16* db, const bfloat16* dout, int64_t N, cudaStream_t stream) {
    launch_residual_backward(da, db, dout, N, stream);
}

} // namespace engine::kernels::cuda
