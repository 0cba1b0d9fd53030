// The unary pointwise functions (CUDA twin of kernels/cpu/unary.cpp), with 128-bit accesses when the pointers
// allow them. Memory-bound: one read and one write per element forward, three reads and a write backward.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

template <typename T, int width>
static __global__ void unary_forward_kernel(T* out, const T* inp, int64_t N, UnaryFunction function) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        Pack<count> pack = load_pack<count>(inp + index);
        for (int k = 0; k < count; ++k) pack[k] = unary_value<float>(function, pack[k]);
        store_pack<count>(out + index, pack);
    });
}

template <typename T, int width>
static __global__ void unary_backward_kernel(T* dinp, const T* dout, const T* saved, int64_t N,
                                             UnaryFunction function) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> values = load_pack<count>(saved + index), gradient = load_pack<count>(dout + index);
        Pack<count> pack = load_pack<count>(dinp + index);
        for (int k = 0; k < count; ++k) pack[k] += unary_derivative<float>(function, values[k]) * gradient[k];
        store_pack<count>(dinp + index, pack);
    });
}

template <typename T>
static void launch_unary_forward(T* out, const T* inp, int64_t N, UnaryFunction function, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(unary_forward_kernel, T, vector_aligned(out, inp), N, block_size, stream, out, inp, N,
                               function);
}

template <typename T>
static void launch_unary_backward(T* dinp, const T* dout, const T* saved, int64_t N, UnaryFunction function,
                                  cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(unary_backward_kernel, T, vector_aligned(dinp, dout, saved), N, block_size, stream,
                               dinp, dout, saved, N, function);
}

void unary_forward(float* out, const float* inp, int64_t N, UnaryFunction function, cudaStream_t stream) {
    launch_unary_forward(out, inp, N, function, stream);
}
void unary_forward(bfloat16* out, const bfloat16* inp, int64_t N, UnaryFunction function, cudaStream_t stream) {
    launch_unary_forward(out, inp, N, function, stream);
}
void unary_backward(float* dinp, const float* dout, const float* saved, int64_t N, UnaryFunction function,
                    cudaStream_t stream) {
    launch_unary_backward(dinp, dout, saved, N, function, stream);
}
void unary_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* saved, int64_t N, UnaryFunction function,
                    cudaStream_t stream) {
    launch_unary_backward(dinp, dout, saved, N, function, stream);
}

} // namespace engine::kernels::cuda
