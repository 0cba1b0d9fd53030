// slice and concat block copies over (outer, size, inner) (CUDA twin of kernels/cpu/slice.cpp): one
// grid-stride walk over the narrow side's elements, 128-bit accesses when every row and offset allows them.
// Bounded by memory bandwidth: one read and one write per element (two reads when accumulating).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

// narrow (outer, length, inner) and wide (outer, size, inner) at [start, start+length): to_wide copies narrow
// into wide, else wide into narrow; accumulate adds. `width` divides length * inner and start * inner, so a
// pack never straddles two rows.
template <bool to_wide, bool accumulate, typename T, int width>
static __global__ void copy_blocks_kernel(T* destination, const T* source, int64_t outer, int64_t size,
                                          int64_t inner, int64_t start, int64_t length) {
    const int64_t row = length * inner, packs = outer * row / width;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t pack = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; pack < packs; pack += stride) {
        const int64_t narrow_index = pack * width, o = narrow_index / row, i = narrow_index - o * row;
        const int64_t wide_index = (o * size + start) * inner + i;
        const int64_t destination_index = to_wide ? wide_index : narrow_index;
        Pack<width> values = load_pack<width>(source + (to_wide ? narrow_index : wide_index));
        if constexpr (accumulate) {
            const Pack<width> existing = load_pack<width>(destination + destination_index);
            for (int k = 0; k < width; ++k) values[k] += existing[k];
        }
        store_pack<width>(destination + destination_index, values);
    }
}

template <bool to_wide, bool accumulate, typename T>
static void launch_copy_blocks(T* destination, const T* source, int64_t outer, int64_t size, int64_t inner,
                               int64_t start, int64_t length, cudaStream_t stream) {
    const int64_t count = outer * length * inner;
    if (count == 0) return;
    const bool vectorized = vector_aligned(destination, source) && (length * inner) % vector_width == 0 &&
                            (start * inner) % vector_width == 0 && (size * inner) % vector_width == 0;
    if (vectorized)
        ENGINE_LAUNCH((copy_blocks_kernel<to_wide, accumulate, T, vector_width>),
                      elementwise_grid(count, block_size, vector_width), block_size, 0, stream, destination, source,
                      outer, size, inner, start, length);
    else
        ENGINE_LAUNCH((copy_blocks_kernel<to_wide, accumulate, T, 1>), elementwise_grid(count, block_size), block_size,
                      0, stream, destination, source, outer, size, inner, start, length);
}

#define ENGINE_SLICE_KERNEL(name, to_wide, accumulate, T)                                                    \
    void name(T* destination, const T* source, int64_t outer, int64_t size, int64_t inner, int64_t start,    \
              int64_t length, cudaStream_t stream) {                                                         \
        launch_copy_blocks<to_wide, accumulate>(destination, source, outer, size, inner, start, length, stream); \
    }
ENGINE_SLICE_KERNEL(slice_forward, false, false, float)
ENGINE_SLICE_KERNEL(slice_forward, false, false, bfloat16)
ENGINE_SLICE_KERNEL(slice_backward, true, true, float)
ENGINE_SLICE_KERNEL(slice_backward, true, true, bfloat16)
ENGINE_SLICE_KERNEL(concat_forward, true, false, float)
ENGINE_SLICE_KERNEL(concat_forward, true, false, bfloat16)
ENGINE_SLICE_KERNEL(concat_backward, false, true, float)
ENGINE_SLICE_KERNEL(concat_backward, false, true, bfloat16)
#undef ENGINE_SLICE_KERNEL

} // namespace engine::kernels::cuda
