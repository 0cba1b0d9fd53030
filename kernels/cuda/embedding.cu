// Token plus position embedding, forward and deterministic backward (CUDA twin of kernels/cpu/embedding.cpp).
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
}

static __global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* token_table,
                                                const float* position_table, int T, int C, int64_t count) {
    for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        const int64_t position = index / C; // b*T + t
        const int channel = static_cast<int>(index % C);
        const int t = static_cast<int>(position % T);
        out[index] = token_table[int64_t(tokens[position]) * C + channel] + position_table[int64_t(t) * C + channel];
    }
}

// The contract gives no vocabulary size, so parallelism is over channels: each thread owns one column of
// the table and walks the positions in order. No two threads touch the same element (no atomics), and the
// additions happen in the CPU loop's order starting from the existing value, so the result is
// deterministic and equal to the CPU's. Only C threads run: simple, but slow for long sequences.
static __global__ void embedding_backward_token_kernel(float* dtoken_table, const float* dout,
                                                       const int32_t* tokens, int positions, int C) {
    const int channel = blockIdx.x * blockDim.x + threadIdx.x;
    if (channel >= C) return;
    for (int position = 0; position < positions; ++position) {
        dtoken_table[int64_t(tokens[position]) * C + channel] += dout[int64_t(position) * C + channel];
    }
}

// One thread per (t, channel), summing over the batch in order.
static __global__ void embedding_backward_position_kernel(float* dposition_table, const float* dout, int B, int T,
                                                          int C) {
    const int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (index >= int64_t(T) * C) return;
    float accumulated = dposition_table[index];
    for (int b = 0; b < B; ++b) accumulated += dout[int64_t(b) * T * C + index];
    dposition_table[index] = accumulated;
}

void embedding_forward(float* out, const int32_t* tokens, const float* token_table, const float* position_table,
                       int B, int T, int C, cudaStream_t stream) {
    const int64_t count = int64_t(B) * T * C;
    if (count == 0) return;
    ENGINE_LAUNCH(embedding_forward_kernel, elementwise_grid(count, block_size), block_size, 0, stream, out, tokens,
                  token_table, position_table, T, C, count);
}

void embedding_backward(float* dtoken_table, float* dposition_table, const float* dout, const int32_t* tokens,
                        int B, int T, int C, cudaStream_t stream) {
    if (int64_t(B) * T * C == 0) return;
    ENGINE_LAUNCH(embedding_backward_token_kernel, ceil_div(C, block_size), block_size, 0, stream, dtoken_table, dout,
                  tokens, B * T, C);
    ENGINE_LAUNCH(embedding_backward_position_kernel, ceil_div(int64_t(T) * C, block_size), block_size, 0, stream,
                  dposition_table, dout, B, T, C);
}

} // namespace engine::kernels::cuda
