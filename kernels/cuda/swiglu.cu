// Fused SwiGLU, silu(gate) * up, forward and backward (CUDA twin of kernels/cpu/swiglu.cpp), grid-stride over
// packs of 4. Memory-bound: forward reads gate and up and writes out (3 accesses per element, where silu then
// mul would make 5); backward reads dout, gate, up and both gradients and writes both (7).
#include "base/cuda/launch.h"
#include "kernels/common/pointwise_functions.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/llama_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

template <typename S, int width>
static __global__ void swiglu_forward_kernel(S* out, const S* gate, const S* up, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> g = load_pack<count>(gate + index), u = load_pack<count>(up + index);
        Pack<count> y;
        for (int k = 0; k < count; ++k) y[k] = unary_value<float>(UnaryFunction::silu, g[k]) * u[k];
        store_pack<count>(out + index, y);
    });
}

// A null gradient is skipped; the test is uniform across the grid, so no warp diverges on it.
template <typename S, int width>
static __global__ void swiglu_backward_kernel(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                              int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> g = load_pack<count>(gate + index), gradient = load_pack<count>(dout + index);
        if (dgate) {
            const Pack<count> u = load_pack<count>(up + index);
            Pack<count> sums = load_pack<count>(dgate + index);
            for (int k = 0; k < count; ++k) {
                const float slope = unary_derivative<float>(UnaryFunction::silu, g[k]);
                sums[k] += gradient[k] * u[k] * slope;
            }
            store_pack<count>(dgate + index, sums);
        }
        if (dup) {
            Pack<count> sums = load_pack<count>(dup + index);
            for (int k = 0; k < count; ++k) sums[k] += gradient[k] * unary_value<float>(UnaryFunction::silu, g[k]);
            store_pack<count>(dup + index, sums);
        }
    });
}

template <typename S>
static void launch_swiglu_forward(S* out, const S* gate, const S* up, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(swiglu_forward_kernel, S, vector_aligned(out, gate, up), N, block_size, stream, out,
                               gate, up, N);
}

template <typename S>
static void launch_swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, int64_t N,
                                   cudaStream_t stream) {
    if (N == 0 || (dgate == nullptr && dup == nullptr)) return;
    ENGINE_LAUNCH_PACKED_TYPED(swiglu_backward_kernel, S, vector_aligned(dgate, dup, dout, gate, up), N, block_size,
                               stream, dgate, dup, dout, gate, up, N);
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t N, cudaStream_t stream) {
    launch_swiglu_forward(out, gate, up, N, stream);
}
void swiglu_forward(bfloat16* out, const bfloat16* gate, const bfloat16* up, int64_t N, cudaStream_t stream) {
    launch_swiglu_forward(out, gate, up, N, stream);
}
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t N,
                     cudaStream_t stream) {
    launch_swiglu_backward(dgate, dup, dout, gate, up, N, stream);
}
void swiglu_backward(bfloat16* dgate, bfloat16* dup, const bfloat16* dout, const bfloat16* gate, const bfloat16* up,
                     int64_t N, cudaStream_t stream) {
    launch_swiglu_backward(dgate, dup, dout, gate, up, N, stream);
}

} // namespace engine::kernels::cuda
