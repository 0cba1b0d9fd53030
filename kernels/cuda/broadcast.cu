// The broadcasting binary functions (CUDA twin of kernels/cpu/broadcast.cpp). Memory-bound: forward reads
// each operand element once per output element that uses it (cached when broadcast) and writes the output;
// operands of the output's own shape take the 128-bit path.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int warps_per_block = block_size / warp_size;
} // namespace

// Both operands have the output's shape (a merged layout of rank 1 with unit strides).
template <typename T, int width>
static __global__ void binary_same_shape_kernel(T* out, const T* a, const T* b, int64_t N, BinaryFunction function) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> left = load_pack<count>(a + index), right = load_pack<count>(b + index);
        Pack<count> pack;
        for (int k = 0; k < count; ++k) pack[k] = binary_value<float>(function, left[k], right[k]);
        store_pack<count>(out + index, pack);
    });
}

template <typename T>
static __global__ void binary_broadcast_kernel(T* out, const T* a, const T* b, BroadcastLayout layout,
                                               BinaryFunction function) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < layout.count; i += stride) {
        int64_t a_offset, b_offset;
        broadcast_offsets(i, layout.rank, layout.sizes, layout.strides[0], layout.strides[1], a_offset, b_offset);
        out[i] = narrow<T>(binary_value<float>(function, widen(a[a_offset]), widen(b[b_offset])));
    }
}

// The term one output element adds to the gradient of operand `which`.
template <typename T>
static __device__ __forceinline__ float gradient_term(const T* dout, const T* other, float self_value,
                                                      int64_t output_offset, int64_t other_offset, bool reads_other,
                                                      int which, BinaryFunction function) {
    const float other_value = reads_other ? widen(other[other_offset]) : 0.0f;
    const float partial = which == 0 ? binary_partial<float>(function, 0, self_value, other_value)
                                     : binary_partial<float>(function, 1, other_value, self_value);
    return partial * widen(dout[output_offset]);
}

// One thread per operand element, summing its output elements in order: neighbouring threads own neighbouring
// elements of the kept innermost dimension, so each step of the loop reads one contiguous run of dout.
template <typename T>
static __global__ void binary_backward_by_thread_kernel(T* doperand, const T* dout, const T* self, const T* other,
                                                        GradientLayout gradient, bool reads_self, bool reads_other,
                                                        BinaryFunction function) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < gradient.kept_count; j += stride) {
        int64_t output_base, other_base;
        broadcast_offsets(j, gradient.kept_rank, gradient.kept_sizes, gradient.kept_output_strides,
                          gradient.kept_other_strides, output_base, other_base);
        const float self_value = reads_self ? widen(self[j]) : 0.0f;
        float total = 0.0f;
        for (int64_t r = 0; r < gradient.reduced_count; ++r) {
            int64_t output_offset, other_offset;
            broadcast_offsets(r, gradient.reduced_rank, gradient.reduced_sizes, gradient.reduced_output_strides,
                              gradient.reduced_other_strides, output_offset, other_offset);
            total += gradient_term(dout, other, self_value, output_base + output_offset, other_base + other_offset,
                                   reads_other, gradient.which, function);
        }
        doperand[j] = narrow<T>(widen(doperand[j]) + total);
    }
}

// One warp per operand element whose output elements include the innermost dimension (a row sum): lane l
// takes reduced indices l, l+32, ..., consecutive in memory across the warp, then a fixed xor tree adds the
// lanes, so the result is the same under any schedule.
template <typename T>
static __global__ void binary_backward_by_warp_kernel(T* doperand, const T* dout, const T* self, const T* other,
                                                      GradientLayout gradient, bool reads_self, bool reads_other,
                                                      BinaryFunction function) {
    const int lane = threadIdx.x % warp_size;
    const int64_t warp_stride = int64_t(gridDim.x) * warps_per_block;
    for (int64_t j = blockIdx.x * int64_t(warps_per_block) + threadIdx.x / warp_size; j < gradient.kept_count;
         j += warp_stride) {
        int64_t output_base, other_base;
        broadcast_offsets(j, gradient.kept_rank, gradient.kept_sizes, gradient.kept_output_strides,
                          gradient.kept_other_strides, output_base, other_base);
        const float self_value = reads_self ? widen(self[j]) : 0.0f;
        float total = 0.0f;
        for (int64_t r = lane; r < gradient.reduced_count; r += warp_size) {
            int64_t output_offset, other_offset;
            broadcast_offsets(r, gradient.reduced_rank, gradient.reduced_sizes, gradient.reduced_output_strides,
                              gradient.reduced_other_strides, output_offset, other_offset);
            total += gradient_term(dout, other, self_value, output_base + output_offset, other_base + other_offset,
                                   reads_other, gradient.which, function);
        }
        total = warp_sum(total);
        if (lane == 0) doperand[j] = narrow<T>(widen(doperand[j]) + total);
    }
}

template <typename T>
static void launch_binary_forward(T* out, const T* a, const T* b, const BroadcastLayout& layout,
                                  BinaryFunction function, cudaStream_t stream) {
    if (layout.count == 0) return;
    const bool same_shape = layout.rank == 1 && layout.strides[0][0] == 1 && layout.strides[1][0] == 1;
    if (same_shape) {
        ENGINE_LAUNCH_PACKED_TYPED(binary_same_shape_kernel, T, vector_aligned(out, a, b), layout.count, block_size,
                                   stream, out, a, b, layout.count, function);
    } else {
        ENGINE_LAUNCH(binary_broadcast_kernel<T>, elementwise_grid(layout.count, block_size), block_size, 0, stream,
                      out, a, b, layout, function);
    }
}

template <typename T>
static void launch_binary_backward(T* doperand, const T* dout, const T* a, const T* b, const GradientLayout& gradient,
                                   BinaryFunction function, cudaStream_t stream) {
    if (gradient.kept_count == 0 || gradient.reduced_count == 0) return;
    const int which = gradient.which;
    const bool reads_a = binary_partial_reads_a(function, which), reads_b = binary_partial_reads_b(function, which);
    const T* self = which == 0 ? a : b;
    const T* other = which == 0 ? b : a;
    const bool reads_self = which == 0 ? reads_a : reads_b, reads_other = which == 0 ? reads_b : reads_a;
    if (gradient.innermost_reduced && gradient.reduced_count > 1) {
        const int blocks = ceil_div(gradient.kept_count, warps_per_block);
        ENGINE_LAUNCH(binary_backward_by_warp_kernel<T>, blocks < max_elementwise_blocks ? blocks : max_elementwise_blocks,
                      block_size, 0, stream, doperand, dout, self, other, gradient, reads_self, reads_other, function);
    } else {
        ENGINE_LAUNCH(binary_backward_by_thread_kernel<T>, elementwise_grid(gradient.kept_count, block_size), block_size,
                      0, stream, doperand, dout, self, other, gradient, reads_self, reads_other, function);
    }
}

void binary_forward(float* out, const float* a, const float* b, const BroadcastLayout& layout,
                    BinaryFunction function, cudaStream_t stream) {
    launch_binary_forward(out, a, b, layout, function, stream);
}
void binary_forward(bfloat16* out, const bfloat16* a, const bfloat16* b, const BroadcastLayout& layout,
                    BinaryFunction function, cudaStream_t stream) {
    launch_binary_forward(out, a, b, layout, function, stream);
}
void binary_backward(float* doperand, const float* dout, const float* a, const float* b,
                     const GradientLayout& gradient, BinaryFunction function, cudaStream_t stream) {
    launch_binary_backward(doperand, dout, a, b, gradient, function, stream);
}
void binary_backward(bfloat16* doperand, const bfloat16* dout, const bfloat16* a, const bfloat16* b,
                     const GradientLayout& gradient, BinaryFunction function, cudaStream_t stream) {
    launch_binary_backward(doperand, dout, a, b, gradient, function, stream);
}

} // namespace engine::kernels::cuda
