// Causal attention backward on tensor cores, FlashAttention-2 style (twin of kernels/cpu/attention.cpp's
// backward). Three kernels, deterministic without atomics: D_i = rowsum(dout_i * out_i); then one block per
// key tile accumulates dK and dV over the query tiles at and after the diagonal; then one block per query
// tile accumulates dQ over the key tiles up to the diagonal. Both recompute P from q, k and the logsumexp.
#include <cmath>

#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
using namespace attention_tiles;

// Key/value kernel: key, value, dkey, dvalue tiles; query, dout tiles; probabilities, dscores; logsumexp, D.
__host__ __device__ SharedLayout key_value_layout(int padded_head) {
    return SharedLayout(padded_head, backward_query_rows, wide_tile_rows(padded_head));
}
constexpr int key_value_query_tiles = 2, key_value_key_tiles = 4;
// Query kernel: query, dout, dquery tiles; key, value tiles; probabilities, dscores; logsumexp, D.
__host__ __device__ SharedLayout query_layout(int padded_head) {
    return SharedLayout(padded_head, wide_tile_rows(padded_head), wide_tile_rows(padded_head));
}
constexpr int query_query_tiles = 3, query_key_tiles = 2;
constexpr int backward_score_tiles = 2, backward_statistics = 2;

// D_i = rowsum(dout_i * out_i) per (batch, head, row), one warp per row: the softmax Jacobian's shared term.
__global__ void attention_row_dot_kernel(float* row_dot, const float* dout, const float* out, int B, int T, int C,
                                         int NH) {
    const int head_size = C / NH, lane = threadIdx.x % warp_size;
    const int64_t row_index = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / warp_size; // into (B,NH,T)
    if (row_index >= int64_t(B) * NH * T) return; // whole warps leave; no barrier follows
    const int row = static_cast<int>(row_index % T), head = static_cast<int>((row_index / T) % NH);
    const int batch = static_cast<int>(row_index / (int64_t(T) * NH));
    const int64_t base = (int64_t(batch) * T + row) * C + int64_t(head) * head_size;
    float sum = 0.0f;
    for (int d = lane; d < head_size; d += warp_size) sum += dout[base + d] * out[base + d];
    sum = warp_sum(sum);
    if (lane == 0) row_dot[row_index] = sum;
}

// The (query tile, key tile) pair's probabilities and score gradients, both in shared memory:
//   probabilities = P = exp(scale * Q K^T - logsumexp), zero above the diagonal and on rows at or past T;
//   dscores = scale * P * (dout V^T - D), already scaled for dK = dS^T Q and dQ = dS K.
// Ends with a barrier, so the caller may read both tiles.
template <bool tf32>
__device__ void probabilities_and_score_gradients(float* probabilities, float* dscores, const float* query,
                                                  const float* dout, const float* key, const float* value,
                                                  const float* row_logsumexp, const float* row_dot,
                                                  const SharedLayout& layout, int padded_head, int first_query,
                                                  int first_key, int T, float scale) {
    tile_product<tf32, wmma::row_major, wmma::col_major>(probabilities, layout.score_stride, query, layout.head_stride,
                                                         key, layout.head_stride, layout.query_rows, layout.key_rows,
                                                         padded_head, false); // Q K^T
    tile_product<tf32, wmma::row_major, wmma::col_major>(dscores, layout.score_stride, dout, layout.head_stride, value,
                                                         layout.head_stride, layout.query_rows, layout.key_rows,
                                                         padded_head, false); // dP = dO V^T
    __syncthreads();
    for (int index = threadIdx.x; index < layout.query_rows * layout.key_rows; index += blockDim.x) {
        const int row = index / layout.key_rows, column = index % layout.key_rows;
        const int query_index = first_query + row, key_index = first_key + column;
        const int at = row * layout.score_stride + column;
        const float probability =
            query_index < T && key_index <= query_index ? expf(probabilities[at] * scale - row_logsumexp[row]) : 0.0f;
        probabilities[at] = probability;
        dscores[at] = scale * probability * (dscores[at] - row_dot[row]);
    }
    __syncthreads();
}

// Rows first_query.. of the (B,NH,T) logsumexp and D; rows at or past T read as zero (their P is zero).
__device__ void load_row_statistics(float* row_logsumexp, float* row_dot, const float* logsumexp_head,
                                    const float* row_dot_head, int first_query, int rows, int T) {
    for (int row = threadIdx.x; row < rows; row += blockDim.x) {
        const bool inside = first_query + row < T;
        row_logsumexp[row] = inside ? logsumexp_head[first_query + row] : 0.0f;
        row_dot[row] = inside ? row_dot_head[first_query + row] : 0.0f;
    }
}

// The buffers every backward kernel reads, and where this block's head starts in each.
struct HeadViews {
    const float* queries; // (T, head_size) of (B,T,3C), rows 3C apart; keys and values likewise
    const float* keys;
    const float* values;
    const float* dout;      // (T, head_size) of (B,T,C), rows C apart
    const float* logsumexp; // (T) of (B,NH,T)
    const float* row_dot;   // (T) of (B,NH,T)
};

__device__ HeadViews head_views(const float* dout, const float* qkv, const float* logsumexp, const float* row_dot,
                                int batch, int head, int T, int C, int NH) {
    const int head_size = C / NH;
    const int64_t statistics = (int64_t(batch) * NH + head) * T;
    return HeadViews{head_slice(qkv, batch, 0, head, T, C, 3 * C, head_size),
                     head_slice(qkv, batch, 1, head, T, C, 3 * C, head_size),
                     head_slice(qkv, batch, 2, head, T, C, 3 * C, head_size),
                     head_slice(dout, batch, 0, head, T, C, C, head_size), logsumexp + statistics,
                     row_dot + statistics};
}

// dK_j += scale * sum_{i>=j} dS_ij q_i and dV_j += sum_{i>=j} P_ij dout_i for one key tile per block.
template <int padded_width, bool tf32>
__global__ void attention_backward_key_value_kernel(float* dqkv, const float* dout, const float* qkv,
                                                    const float* logsumexp, const float* row_dot, int T, int C, int NH,
                                                    bool vectorized) {
    const int head_size = C / NH;
    const int padded_head = padded_width ? padded_width : padded_head_size(head_size);
    const SharedLayout layout = key_value_layout(padded_head);
    const int head = blockIdx.y, batch = blockIdx.z;
    const int first_key = blockIdx.x * layout.key_rows; // the first tiles have the most query tiles: they go first
    const float scale = rsqrtf(static_cast<float>(head_size));
    const HeadViews views = head_views(dout, qkv, logsumexp, row_dot, batch, head, T, C, NH);

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* key = cursor.take(layout.key_tile_floats());             // (key_rows, head_stride)
    float* value = cursor.take(layout.key_tile_floats());           // (key_rows, head_stride)
    float* dkey = cursor.take(layout.key_tile_floats());            // (key_rows, head_stride)
    float* dvalue = cursor.take(layout.key_tile_floats());          // (key_rows, head_stride)
    float* query = cursor.take(layout.query_tile_floats());         // (query_rows, head_stride)
    float* dout_tile = cursor.take(layout.query_tile_floats());     // (query_rows, head_stride)
    float* probabilities = cursor.take(layout.score_tile_floats()); // (query_rows, score_stride)
    float* dscores = cursor.take(layout.score_tile_floats());       // (query_rows, score_stride)
    float* row_logsumexp = cursor.take(layout.query_rows);          // (query_rows)
    float* row_dot_tile = cursor.take(layout.query_rows);           // (query_rows)

    const int qkv_row = 3 * C;
    load_tile(key, layout.head_stride, views.keys, qkv_row, first_key, layout.key_rows, T, head_size, padded_head,
              vectorized);
    load_tile(value, layout.head_stride, views.values, qkv_row, first_key, layout.key_rows, T, head_size, padded_head,
              vectorized);
    zero_tile(dkey, layout.head_stride, layout.key_rows, padded_head);
    zero_tile(dvalue, layout.head_stride, layout.key_rows, padded_head);

    // Key tiles start at multiples of the query tile height, so the first query tile starts on the diagonal.
    for (int first_query = first_key; first_query < T; first_query += layout.query_rows) {
        __syncthreads(); // the previous step's products have finished reading query, dout and the scores
        load_tile(query, layout.head_stride, views.queries, qkv_row, first_query, layout.query_rows, T, head_size,
                  padded_head, vectorized);
        load_tile(dout_tile, layout.head_stride, views.dout, C, first_query, layout.query_rows, T, head_size,
                  padded_head, vectorized);
        load_row_statistics(row_logsumexp, row_dot_tile, views.logsumexp, views.row_dot, first_query,
                            layout.query_rows, T);
        __syncthreads();
        probabilities_and_score_gradients<tf32>(probabilities, dscores, query, dout_tile, key, value, row_logsumexp,
                                                row_dot_tile, layout, padded_head, first_query, first_key, T, scale);
        // The stored P and dS are (query, key); as col_major operands they read as P^T and dS^T.
        tile_product<tf32, wmma::col_major, wmma::row_major>(dvalue, layout.head_stride, probabilities,
                                                             layout.score_stride, dout_tile, layout.head_stride,
                                                             layout.key_rows, padded_head, layout.query_rows, true);
        tile_product<tf32, wmma::col_major, wmma::row_major>(dkey, layout.head_stride, dscores, layout.score_stride,
                                                             query, layout.head_stride, layout.key_rows, padded_head,
                                                             layout.query_rows, true);
    }
    __syncthreads();
    float* dkeys = head_slice(dqkv, batch, 1, head, T, C, qkv_row, head_size); // (T, head_size) of (B,T,3C)
    float* dvalues = head_slice(dqkv, batch, 2, head, T, C, qkv_row, head_size);
    add_tile(dkeys, qkv_row, dkey, layout.head_stride, first_key, layout.key_rows, T, head_size, vectorized);
    add_tile(dvalues, qkv_row, dvalue, layout.head_stride, first_key, layout.key_rows, T, head_size,
             vectorized);
}

// dQ_i += scale * sum_{j<=i} dS_ij k_j for one query tile per block.
template <int padded_width, bool tf32>
__global__ void attention_backward_query_kernel(float* dqkv, const float* dout, const float* qkv,
                                                const float* logsumexp, const float* row_dot, int T, int C, int NH,
                                                bool vectorized) {
    const int head_size = C / NH;
    const int padded_head = padded_width ? padded_width : padded_head_size(head_size);
    const SharedLayout layout = query_layout(padded_head);
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z; // long rows first
    const int first_query = query_tile * layout.query_rows;
    const float scale = rsqrtf(static_cast<float>(head_size));
    const HeadViews views = head_views(dout, qkv, logsumexp, row_dot, batch, head, T, C, NH);

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* query = cursor.take(layout.query_tile_floats());         // (query_rows, head_stride)
    float* dout_tile = cursor.take(layout.query_tile_floats());     // (query_rows, head_stride)
    float* dquery = cursor.take(layout.query_tile_floats());        // (query_rows, head_stride)
    float* key = cursor.take(layout.key_tile_floats());             // (key_rows, head_stride)
    float* value = cursor.take(layout.key_tile_floats());           // (key_rows, head_stride)
    float* probabilities = cursor.take(layout.score_tile_floats()); // (query_rows, score_stride)
    float* dscores = cursor.take(layout.score_tile_floats());       // (query_rows, score_stride)
    float* row_logsumexp = cursor.take(layout.query_rows);          // (query_rows)
    float* row_dot_tile = cursor.take(layout.query_rows);           // (query_rows)

    const int qkv_row = 3 * C;
    load_tile(query, layout.head_stride, views.queries, qkv_row, first_query, layout.query_rows, T, head_size,
              padded_head, vectorized);
    load_tile(dout_tile, layout.head_stride, views.dout, C, first_query, layout.query_rows, T, head_size, padded_head,
              vectorized);
    load_row_statistics(row_logsumexp, row_dot_tile, views.logsumexp, views.row_dot, first_query, layout.query_rows,
                        T);
    zero_tile(dquery, layout.head_stride, layout.query_rows, padded_head);

    const int last_query = min(first_query + layout.query_rows, T) - 1;
    for (int first_key = 0; first_key <= last_query; first_key += layout.key_rows) {
        __syncthreads(); // the previous step's product has finished reading the keys
        load_tile(key, layout.head_stride, views.keys, qkv_row, first_key, layout.key_rows, T, head_size, padded_head,
                  vectorized);
        load_tile(value, layout.head_stride, views.values, qkv_row, first_key, layout.key_rows, T, head_size,
                  padded_head, vectorized);
        __syncthreads();
        probabilities_and_score_gradients<tf32>(probabilities, dscores, query, dout_tile, key, value, row_logsumexp,
                                                row_dot_tile, layout, padded_head, first_query, first_key, T, scale);
        tile_product<tf32, wmma::row_major, wmma::row_major>(dquery, layout.head_stride, dscores, layout.score_stride,
                                                             key, layout.head_stride, layout.query_rows, padded_head,
                                                             layout.key_rows, true); // dQ += dS K
    }
    __syncthreads();
    float* dqueries = head_slice(dqkv, batch, 0, head, T, C, qkv_row, head_size); // (T, head_size) of (B,T,3C)
    add_tile(dqueries, qkv_row, dquery, layout.head_stride, first_query, layout.query_rows, T, head_size,
             vectorized);
}

template <bool tf32>
void launch_backward(float* dqkv, float* row_dot_workspace, const float* dout, const float* qkv, const float* out,
                     const float* logsumexp, int B, int T, int C, int NH, cudaStream_t stream) {
    const int head_size = C / NH;
    const bool vectorized = float4_aligned(C, NH, {dqkv, dout, qkv});
    ENGINE_LAUNCH(attention_row_dot_kernel, ceil_div(int64_t(B) * NH * T, warps_per_block),
                  threads_per_block, 0, stream, row_dot_workspace, dout, out, B, T, C, NH);
    dispatch_head_size(head_size, [&]<int padded_width>() {
        const int padded_head = padded_head_size(head_size);
        const SharedLayout key_value = key_value_layout(padded_head), query = query_layout(padded_head);
        const size_t key_value_bytes =
            key_value.bytes(key_value_query_tiles, key_value_key_tiles, backward_score_tiles, backward_statistics);
        const size_t query_bytes =
            query.bytes(query_query_tiles, query_key_tiles, backward_score_tiles, backward_statistics);
        auto* key_value_kernel = attention_backward_key_value_kernel<padded_width, tf32>;
        auto* query_kernel = attention_backward_query_kernel<padded_width, tf32>;
        allow_shared_bytes(key_value_kernel, key_value_bytes);
        allow_shared_bytes(query_kernel, query_bytes);
        const dim3 key_value_grid((T + key_value.key_rows - 1) / key_value.key_rows, NH, B);
        const dim3 query_grid((T + query.query_rows - 1) / query.query_rows, NH, B);
        ENGINE_LAUNCH(key_value_kernel, key_value_grid, threads_per_block, key_value_bytes, stream, dqkv, dout, qkv,
                      logsumexp, row_dot_workspace, T, C, NH, vectorized);
        ENGINE_LAUNCH(query_kernel, query_grid, threads_per_block, query_bytes, stream, dqkv, dout, qkv, logsumexp,
                      row_dot_workspace, T, C, NH, vectorized);
    });
}
} // namespace

size_t attention_backward_shared_bytes(int head_size) {
    const int padded_head = padded_head_size(head_size);
    const size_t key_value_bytes = key_value_layout(padded_head)
                                       .bytes(key_value_query_tiles, key_value_key_tiles, backward_score_tiles,
                                              backward_statistics);
    const size_t query_bytes =
        query_layout(padded_head).bytes(query_query_tiles, query_key_tiles, backward_score_tiles, backward_statistics);
    return key_value_bytes > query_bytes ? key_value_bytes : query_bytes;
}

void attention_backward(float* dqkv, float* row_dot_workspace, const float* dout, const float* qkv, const float* out,
                        const float* logsumexp, int B, int T, int C, int NH, bool tf32, cudaStream_t stream) {
    attention_tiles::check_shape(C, NH);
    if (int64_t(B) * NH * T == 0) return;
    if (tf32) launch_backward<true>(dqkv, row_dot_workspace, dout, qkv, out, logsumexp, B, T, C, NH, stream);
    else launch_backward<false>(dqkv, row_dot_workspace, dout, qkv, out, logsumexp, B, T, C, NH, stream);
}

} // namespace engine::kernels::cuda
