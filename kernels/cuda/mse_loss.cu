// Mean squared error (CUDA twin of kernels/cpu/mse_loss.cpp): elementwise kernels, grid-stride, bounded by
// memory bandwidth; the reduced loss sums the f32 squared errors with sum_forward's deterministic two-stage
// reduction in double (kernels/cuda/reduce.cu), so it needs no reduction of its own.
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

template <typename Out, typename T>
static __global__ void squared_error_kernel(Out* out, const T* inp, const T* target, int64_t N) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float difference = widen(inp[i]) - widen(target[i]);
        out[i] = narrow<Out>(difference * difference);
    }
}

// g = 2 (inp - target) dout(i); dinp += g, dtarget -= g. dout_stride 0: one scalar dout (times scale) for all.
template <typename T, typename Gradient>
static __global__ void squared_error_backward_kernel(T* dinp, T* dtarget, const Gradient* dout, int64_t dout_stride,
                                                     const T* inp, const T* target, int64_t N, float scale) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const float gradient = dout_stride == 0 ? scale * widen(dout[0]) : widen(dout[i]);
        const float g = 2.0f * (widen(inp[i]) - widen(target[i])) * gradient;
        if (dinp) dinp[i] = narrow<T>(widen(dinp[i]) + g);
        if (dtarget) dtarget[i] = narrow<T>(widen(dtarget[i]) - g);
    }
}

template <typename Out, typename T>
static void launch_squared_error(Out* out, const T* inp, const T* target, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH((squared_error_kernel<Out, T>), elementwise_grid(N, block_size), block_size, 0, stream, out, inp,
                  target, N);
}

template <typename T, typename Gradient>
static void launch_squared_error_backward(T* dinp, T* dtarget, const Gradient* dout, int64_t dout_stride,
                                          const T* inp, const T* target, int64_t N, float scale, cudaStream_t stream) {
    if (N == 0 || (!dinp && !dtarget)) return;
    ENGINE_LAUNCH((squared_error_backward_kernel<T, Gradient>), elementwise_grid(N, block_size), block_size, 0, stream,
                  dinp, dtarget, dout, dout_stride, inp, target, N, scale);
}

template <typename T>
static void launch_mse_loss_forward(float* out, float* squares_workspace, double* partials_workspace, const T* inp,
                                    const T* target, int64_t N, float scale, cudaStream_t stream) {
    launch_squared_error(squares_workspace, inp, target, N, stream);
    sum_forward(out, partials_workspace, squares_workspace, N, scale, stream);
}

void squared_error_forward(float* out, const float* inp, const float* target, int64_t N, cudaStream_t stream) {
    launch_squared_error(out, inp, target, N, stream);
}
void squared_error_forward(bfloat16* out, const bfloat16* inp, const bfloat16* target, int64_t N,
                           cudaStream_t stream) {
    launch_squared_error(out, inp, target, N, stream);
}
void mse_loss_forward(float* out, float* squares_workspace, double* partials_workspace, const float* inp,
                      const float* target, int64_t N, float scale, cudaStream_t stream) {
    launch_mse_loss_forward(out, squares_workspace, partials_workspace, inp, target, N, scale, stream);
}
void mse_loss_forward(float* out, float* squares_workspace, double* partials_workspace, const bfloat16* inp,
                      const bfloat16* target, int64_t N, float scale, cudaStream_t stream) {
    launch_mse_loss_forward(out, squares_workspace, partials_workspace, inp, target, N, scale, stream);
}
void squared_error_backward(float* dinp, float* dtarget, const float* dout, const float* inp, const float* target,
                            int64_t N, cudaStream_t stream) {
    launch_squared_error_backward(dinp, dtarget, dout, 1, inp, target, N, 1.0f, stream);
}
void squared_error_backward(bfloat16* dinp, bfloat16* dtarget, const bfloat16* dout, const bfloat16* inp,
                            const bfloat16* target, int64_t N, cudaStream_t stream) {
    launch_squared_error_backward(dinp, dtarget, dout, 1, inp, target, N, 1.0f, stream);
}
void mse_loss_backward(float* dinp, float* dtarget, const float* dout, const float* inp, const float* target,
                       int64_t N, float scale, cudaStream_t stream) {
    launch_squared_error_backward(dinp, dtarget, dout, 0, inp, target, N, scale, stream);
}
void mse_loss_backward(bfloat16* dinp, bfloat16* dtarget, const float* dout, const bfloat16* inp,
                       const bfloat16* target, int64_t N, float scale, cudaStream_t stream) {
    launch_squared_error_backward(dinp, dtarget, dout, 0, inp, target, N, scale, stream);
}

} // namespace engine::kernels::cuda
