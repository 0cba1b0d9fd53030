// Token plus position embedding, forward and deterministic backward (CUDA twin of kernels/cpu/embedding.cpp);
// without a position table (null: Llama) the forward is the token lookup alone and backward skips dposition.
// The token-table gradient is parallel over (distinct token, channel tile), from positions the host grouped by
// token (group_positions_by_token); the position-table gradient over (t, channel), or for packed documents (rows
// positions[b,t]) as the token table's, from the positions grouped by position. Tables, out and dout are
// float or bf16 storage (T); the table gradients are float, accumulated without rounding to bf16.
#include <algorithm>

#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/packs.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int token_block_size = warp_size;                          // one warp per (token, tile)
constexpr int token_tile_channels = token_block_size * vector_width; // 4 channels per lane on either path
} // namespace

// with_positions is a template argument so that the GPT kernel (true) is the same code as before the plain
// lookup (false, a copy of the token's row) existed.
template <typename S, bool with_positions>
static __global__ void embedding_forward_kernel(S* out, const int32_t* tokens, const S* token_table,
                                                const S* position_table, const int32_t* positions, int T, int C,
                                                int64_t count) {
    for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        const int64_t position = index / C; // b*T + t
        const int channel = static_cast<int>(index % C);
        if constexpr (with_positions) {
            const int t = positions ? positions[position] : static_cast<int>(position % T);
            out[index] = narrow<S>(widen(token_table[int64_t(tokens[position]) * C + channel]) +
                                   widen(position_table[int64_t(t) * C + channel]));
        } else {
            out[index] = token_table[int64_t(tokens[position]) * C + channel];
        }
    }
}

// Block (group, tile) owns one distinct token's row of the table over 128 channels, so no two threads touch
// one element (no atomics). It sums the token's dout rows in ascending position order from zero and adds the sum
// to the table once, the CPU loop's order: the result is bitwise the CPU twin's.
template <typename S, int width>
static __global__ void embedding_backward_token_kernel(float* dtoken_table, const S* dout,
                                                       const int32_t* token_groups, int count, int distinct, int C) {
    const int32_t* positions = token_groups;                // (count)
    const int32_t* distinct_tokens = positions + count;     // (distinct)
    const int32_t* group_starts = distinct_tokens + distinct; // (distinct + 1)
    const int group = blockIdx.x, lane = threadIdx.x;
    const int tile_start = blockIdx.y * token_tile_channels;
    float* table_row = dtoken_table + int64_t(distinct_tokens[group]) * C + tile_start;
    if constexpr (width == vector_width) {
        const int channel = lane * vector_width;
        if (tile_start + channel >= C) return; // C % 4 == 0: a pack is wholly in or out
        Pack<vector_width> sums{};
        for (int index = group_starts[group]; index < group_starts[group + 1]; ++index) {
            const Pack<vector_width> values =
                load_pack<vector_width>(dout + int64_t(positions[index]) * C + tile_start + channel);
            for (int k = 0; k < vector_width; ++k) sums[k] += values[k];
        }
        Pack<vector_width> table = load_pack<vector_width>(table_row + channel);
        for (int k = 0; k < vector_width; ++k) table[k] += sums[k];
        store_pack<vector_width>(table_row + channel, table);
    } else {
        for (int k = 0; k < vector_width; ++k) {
            const int channel = lane_tile_offset<width>(lane, k);
            if (tile_start + channel >= C) continue;
            float sum = 0.0f;
            for (int index = group_starts[group]; index < group_starts[group + 1]; ++index)
                sum += widen(dout[int64_t(positions[index]) * C + tile_start + channel]);
            table_row[channel] += sum;
        }
    }
}

// Parallel over (t, channel) packs, summing over the batch in order from zero, then added to the table (the CPU's
// order).
template <typename S, int width>
static __global__ void embedding_backward_position_kernel(float* dposition_table, const S* dout, int B,
                                                          int64_t position_count) {
    for_each_pack<width>(position_count, [&]<int count>(int64_t index) {
        Pack<count> sums{};
        for (int b = 0; b < B; ++b) {
            const Pack<count> values = load_pack<count>(dout + int64_t(b) * position_count + index);
            for (int k = 0; k < count; ++k) sums[k] += values[k];
        }
        Pack<count> table = load_pack<count>(dposition_table + index);
        for (int k = 0; k < count; ++k) table[k] += sums[k];
        store_pack<count>(dposition_table + index, table);
    });
}

template <typename S>
static void launch_embedding_forward(S* out, const int32_t* tokens, const S* token_table, const S* position_table,
                                     const int32_t* positions, int B, int T, int C, cudaStream_t stream) {
    const int64_t count = int64_t(B) * T * C;
    if (count == 0) return;
    if (position_table != nullptr)
        ENGINE_LAUNCH((embedding_forward_kernel<S, true>), elementwise_grid(count, block_size), block_size, 0, stream,
                      out, tokens, token_table, position_table, positions, T, C, count);
    else
        ENGINE_LAUNCH((embedding_forward_kernel<S, false>), elementwise_grid(count, block_size), block_size, 0, stream,
                      out, tokens, token_table, position_table, nullptr, T, C, count);
}

void embedding_forward(float* out, const int32_t* tokens, const float* token_table, const float* position_table,
                       const int32_t* positions, int B, int T, int C, cudaStream_t stream) {
    launch_embedding_forward(out, tokens, token_table, position_table, positions, B, T, C, stream);
}
void embedding_forward(bfloat16* out, const int32_t* tokens, const bfloat16* token_table,
                       const bfloat16* position_table, const int32_t* positions, int B, int T, int C,
                       cudaStream_t stream) {
    launch_embedding_forward(out, tokens, token_table, position_table, positions, B, T, C, stream);
}

template <typename S>
static void launch_embedding_backward(float* dtoken_table, float* dposition_table, const S* dout,
                                      const int32_t* token_groups, int distinct, const int32_t* position_groups,
                                      int position_distinct, int B, int T, int C, cudaStream_t stream) {
    if (int64_t(B) * T * C == 0) return;
    const bool vectorized = C % vector_width == 0 && vector_aligned(dtoken_table, dposition_table, dout);
    const dim3 token_grid(distinct, ceil_div(C, token_tile_channels));
    if (vectorized)
        ENGINE_LAUNCH((embedding_backward_token_kernel<S, vector_width>), token_grid, token_block_size, 0, stream,
                      dtoken_table, dout, token_groups, B * T, distinct, C);
    else
        ENGINE_LAUNCH((embedding_backward_token_kernel<S, 1>), token_grid, token_block_size, 0, stream, dtoken_table,
                      dout, token_groups, B * T, distinct, C);
    if (dposition_table == nullptr) return; // no position table
    if (position_groups != nullptr) {       // packed documents: rows by position, as the tokens' by token
        const dim3 position_grid(position_distinct, ceil_div(C, token_tile_channels));
        if (vectorized)
            ENGINE_LAUNCH((embedding_backward_token_kernel<S, vector_width>), position_grid, token_block_size, 0,
                          stream, dposition_table, dout, position_groups, B * T, position_distinct, C);
        else
            ENGINE_LAUNCH((embedding_backward_token_kernel<S, 1>), position_grid, token_block_size, 0, stream,
                          dposition_table, dout, position_groups, B * T, position_distinct, C);
        return;
    }
    ENGINE_LAUNCH_PACKED_TYPED(embedding_backward_position_kernel, S, vectorized, int64_t(T) * C, block_size, stream,
                               dposition_table, dout, B, int64_t(T) * C);
}

void embedding_backward(float* dtoken_table, float* dposition_table, const float* dout, const int32_t* token_groups,
                        int distinct, const int32_t* position_groups, int position_distinct, int B, int T, int C,
                        cudaStream_t stream) {
    launch_embedding_backward(dtoken_table, dposition_table, dout, token_groups, distinct, position_groups,
                              position_distinct, B, T, C, stream);
}
void embedding_backward(float* dtoken_table, float* dposition_table, const bfloat16* dout, const int32_t* token_groups,
                        int distinct, const int32_t* position_groups, int position_distinct, int B, int T, int C,
                        cudaStream_t stream) {
    launch_embedding_backward(dtoken_table, dposition_table, dout, token_groups, distinct, position_groups,
                              position_distinct, B, T, C, stream);
}

} // namespace engine::kernels::cuda
