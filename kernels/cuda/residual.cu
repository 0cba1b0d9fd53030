// Residual add and its pass-through gradient (CUDA twin of kernels/cpu/residual.cpp), with 128-bit accesses
// when the pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

template <int width>
static __global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> right = load_pack<count>(b + index);
        Pack<count> pack = load_pack<count>(a + index);
        for (int k = 0; k < count; ++k) pack[k] += right[k];
        store_pack<count>(out + index, pack);
    });
}

// Either gradient may be null (an input that needs none); the branch is uniform across the grid.
template <int width>
static __global__ void residual_backward_kernel(float* da, float* db, const float* dout, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> gradient = load_pack<count>(dout + index);
        auto accumulate = [&](float* destination) {
            if (destination == nullptr) return;
            Pack<count> pack = load_pack<count>(destination + index);
            for (int k = 0; k < count; ++k) pack[k] += gradient[k];
            store_pack<count>(destination + index, pack);
        };
        accumulate(da);
        accumulate(db);
    });
}

void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED(residual_forward_kernel, vector_aligned(out, a, b), N, block_size, stream, out, a, b, N);
}

void residual_backward(float* da, float* db, const float* dout, int64_t N, cudaStream_t stream) {
    if (N == 0 || (da == nullptr && db == nullptr)) return;
    ENGINE_LAUNCH_PACKED(residual_backward_kernel, vector_aligned(da, db, dout), N, block_size, stream, da, db, dout,
                         N);
}

} // namespace engine::kernels::cuda
