// GELU, tanh approximation as in GPT-2 (CUDA twin of kernels/cpu/gelu.cpp), with 128-bit accesses when the
// pointers allow them.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr float sqrt_2_over_pi = 0.7978845608028654f;
constexpr float cubic_coefficient = 0.044715f;
} // namespace

static __device__ __forceinline__ float gelu_value(float x) {
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * (x + cubic_coefficient * x * x * x)));
}

static __device__ __forceinline__ float gelu_local_gradient(float x) {
    const float tanh_argument = sqrt_2_over_pi * (x + cubic_coefficient * x * x * x);
    const float tanh_value = tanhf(tanh_argument);
    const float sech_squared = 1.0f - tanh_value * tanh_value;
    return 0.5f * (1.0f + tanh_value) +
           0.5f * x * sech_squared * sqrt_2_over_pi * (1.0f + 3.0f * cubic_coefficient * x * x);
}

// Templated on the storage type T: packs widen on load and round once on store (kernels/cuda/packs.cuh).
template <typename T, int width>
static __global__ void gelu_forward_kernel(T* out, const T* inp, int64_t N) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        Pack<count> pack = load_pack<count>(inp + index);
        for (int k = 0; k < count; ++k) pack[k] = gelu_value(pack[k]);
        store_pack<count>(out + index, pack);
    });
}

template <typename T, int width>
static __global__ void gelu_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t N, bool accumulate) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        const Pack<count> x = load_pack<count>(inp + index), gradient = load_pack<count>(dout + index);
        // The write form (a fresh gradient buffer) adds into zeros without reading them: the same bits.
        Pack<count> pack = accumulate ? load_pack<count>(dinp + index) : Pack<count>{};
        for (int k = 0; k < count; ++k) pack[k] += gelu_local_gradient(x[k]) * gradient[k];
        store_pack<count>(dinp + index, pack);
    });
}

template <typename T>
static void launch_gelu_forward(T* out, const T* inp, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(gelu_forward_kernel, T, vector_aligned(out, inp), N, block_size, stream, out, inp, N);
}

template <typename T>
static void launch_gelu_backward(T* dinp, const T* dout, const T* inp, int64_t N, bool accumulate,
                                 cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH_PACKED_TYPED(gelu_backward_kernel, T, vector_aligned(dinp, dout, inp), N, block_size, stream, dinp,
                               dout, inp, N, accumulate);
}

void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream) {
    launch_gelu_forward(out, inp, N, stream);
}
void gelu_forward(bfloat16* out, const bfloat16* inp, int64_t N, cudaStream_t stream) {
    launch_gelu_forward(out, inp, N, stream);
}
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t N, bool accumulate, cudaStream_t stream) {
    launch_gelu_backward(dinp, dout, inp, N, accumulate, stream);
}
void gelu_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* inp, int64_t N, bool accumulate,
                   cudaStream_t stream) {
    launch_gelu_backward(dinp, dout, inp, N, accumulate, stream);
}

} // namespace engine::kernels::cuda
