// Conversion between f32 and bf16 storage (CUDA twin of kernels/cpu/cast.cpp): the mixed-precision working
// copy's refresh and the cast op. Rounds to nearest even with the engine's one rounding rule.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

template <typename To, typename From, int width>
static __global__ void convert_kernel(To* out, const From* inp, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) { store_pack<count>(out + index, load_pack<count>(inp + index)); });
}

template <typename To, typename From>
void convert(To* out, const From* inp, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    if (vector_aligned(out, inp))
        ENGINE_LAUNCH((convert_kernel<To, From, vector_width>), elementwise_grid(N, block_size, vector_width),
                      block_size, 0, stream, out, inp, N);
    else ENGINE_LAUNCH((convert_kernel<To, From, 1>), elementwise_grid(N, block_size), block_size, 0, stream, out, inp, N);
}

template void convert<bfloat16, float>(bfloat16*, const float*, int64_t, cudaStream_t);
template void convert<float, bfloat16>(float*, const bfloat16*, int64_t, cudaStream_t);

} // namespace engine::kernels::cuda
