// Causal attention forward on tensor cores, FlashAttention-2 style (twin of kernels/cpu/attention.cpp's
// forward): one block per (query tile, head, batch) streams key/value tiles through shared memory with an
// online softmax, so no T x T matrix exists anywhere; it saves the per-row logsumexp for the backward.
#include <cmath>

#include "kernels/cuda/attention_tiles.cuh"

namespace engine::kernels::cuda {
namespace {
using namespace attention_tiles;

// Query tile, key/value tile (keys, then values: one buffer), output accumulator, scores; running max, sum.
__host__ __device__ SharedLayout forward_layout(int padded_head) {
    return SharedLayout(padded_head, wide_tile_rows(padded_head), wide_tile_rows(padded_head));
}
constexpr int forward_query_tiles = 2, forward_key_tiles = 1, forward_score_tiles = 1, forward_statistics = 2;

// One online-softmax step for rows of the score tile: scale, causal mask, new running max, probabilities
// written over the scores, running sum updated and the output row rescaled by exp(old max - new max). A
// thread owns whole rows, because the wmma fragment layout is unspecified: rows are only visible in shared.
__device__ void online_softmax_step(float* scores, float* output, float* running_max, float* running_sum,
                                    const SharedLayout& layout, int first_query, int first_key, int padded_head,
                                    float scale) {
    for (int row = threadIdx.x; row < layout.query_rows; row += blockDim.x) {
        float* score_row = scores + row * layout.score_stride;
        const int keys = min(layout.key_rows, first_query + row - first_key + 1); // causal: keys <= query
        float new_max = running_max[row];
        for (int key = 0; key < keys; ++key) new_max = fmaxf(new_max, score_row[key] * scale);
        // Every row of a visited tile has at least one key (tiles start at or before the diagonal), so
        // new_max is finite and the correction is exp(-inf) = 0 on the first tile.
        float sum = 0.0f;
        for (int key = 0; key < layout.key_rows; ++key) {
            const float probability = key < keys ? expf(score_row[key] * scale - new_max) : 0.0f;
            score_row[key] = probability;
            sum += probability;
        }
        const float correction = expf(running_max[row] - new_max);
        running_sum[row] = running_sum[row] * correction + sum;
        running_max[row] = new_max;
        float* output_row = output + row * layout.head_stride;
        for (int column = 0; column < padded_head; ++column) output_row[column] *= correction;
    }
}

// padded_width: the padded head size when compiled for one (64, 128), else 0 and read from C / NH.
template <int padded_width, bool tf32>
__global__ void attention_forward_kernel(float* out, float* logsumexp, const float* qkv, int T, int C, int NH,
                                         bool vectorized) {
    const int head_size = C / NH;
    const int padded_head = padded_width ? padded_width : padded_head_size(head_size);
    const SharedLayout layout = forward_layout(padded_head);
    // The longest rows (most key tiles) go first, so the short ones fill the tail of the grid.
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int first_query = query_tile * layout.query_rows;
    const float scale = rsqrtf(static_cast<float>(head_size));

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* query = cursor.take(layout.query_tile_floats());      // (query_rows, head_stride)
    float* output = cursor.take(layout.query_tile_floats());     // (query_rows, head_stride), unnormalised
    float* key_value = cursor.take(layout.key_tile_floats());    // (key_rows, head_stride): keys, then values
    float* scores = cursor.take(layout.score_tile_floats());     // (query_rows, score_stride)
    float* running_max = cursor.take(layout.query_rows);         // (query_rows)
    float* running_sum = cursor.take(layout.query_rows);         // (query_rows)

    const int qkv_row = 3 * C;
    const float* queries = head_slice(qkv, batch, 0, head, T, C, qkv_row, head_size); // (T, head_size) of (B,T,3C)
    const float* keys = head_slice(qkv, batch, 1, head, T, C, qkv_row, head_size);
    const float* values = head_slice(qkv, batch, 2, head, T, C, qkv_row, head_size);
    load_tile(query, layout.head_stride, queries, qkv_row, first_query, layout.query_rows, T, head_size, padded_head,
              vectorized);
    zero_tile(output, layout.head_stride, layout.query_rows, padded_head);
    for (int row = threadIdx.x; row < layout.query_rows; row += blockDim.x) {
        running_max[row] = -INFINITY;
        running_sum[row] = 0.0f;
    }

    // Key tiles up to the diagonal; the last query row of the tile (or of the sequence) decides.
    const int last_query = min(first_query + layout.query_rows, T) - 1;
    for (int first_key = 0; first_key <= last_query; first_key += layout.key_rows) {
        __syncthreads(); // the previous tile's product has finished reading the values
        load_tile(key_value, layout.head_stride, keys, qkv_row, first_key, layout.key_rows, T, head_size, padded_head,
                  vectorized);
        __syncthreads();
        tile_product<tf32, wmma::row_major, wmma::col_major>(scores, layout.score_stride, query, layout.head_stride,
                                                             key_value, layout.head_stride, layout.query_rows,
                                                             layout.key_rows, padded_head, false); // Q K^T
        __syncthreads();
        online_softmax_step(scores, output, running_max, running_sum, layout, first_query, first_key, padded_head,
                            scale);
        load_tile(key_value, layout.head_stride, values, qkv_row, first_key, layout.key_rows, T, head_size,
                  padded_head, vectorized);
        __syncthreads();
        tile_product<tf32, wmma::row_major, wmma::row_major>(output, layout.head_stride, scores, layout.score_stride,
                                                             key_value, layout.head_stride, layout.query_rows,
                                                             padded_head, layout.key_rows, true); // O += P V
    }
    __syncthreads();

    float* out_head = out + int64_t(batch) * T * C + int64_t(head) * head_size; // (T, head_size) of (B,T,C)
    for_each_group(layout.query_rows, head_size, vectorized ? 4 : 1, [&](int row, int column) {
        if (first_query + row >= T) return;
        const float inverse_sum = 1.0f / running_sum[row];
        const float* from = output + row * layout.head_stride + column;
        float* to = out_head + int64_t(first_query + row) * C + column;
        if (vectorized) {
            *reinterpret_cast<float4*>(to) =
                make_float4(from[0] * inverse_sum, from[1] * inverse_sum, from[2] * inverse_sum, from[3] * inverse_sum);
        } else {
            *to = *from * inverse_sum;
        }
    });
    float* logsumexp_head = logsumexp + (int64_t(batch) * NH + head) * T; // (T) of (B,NH,T)
    for (int row = threadIdx.x; row < layout.query_rows && first_query + row < T; row += blockDim.x) {
        logsumexp_head[first_query + row] = running_max[row] + logf(running_sum[row]);
    }
}

template <bool tf32>
void launch_forward(float* out, float* logsumexp, const float* qkv, int B, int T, int C, int NH,
                    cudaStream_t stream) {
    const int head_size = C / NH;
    const bool vectorized = float4_aligned(C, NH, {out, qkv});
    dispatch_head_size(head_size, [&]<int padded_width>() {
        const SharedLayout layout = forward_layout(padded_head_size(head_size));
        const size_t shared_bytes =
            layout.bytes(forward_query_tiles, forward_key_tiles, forward_score_tiles, forward_statistics);
        auto* forward_kernel = attention_forward_kernel<padded_width, tf32>;
        allow_shared_bytes(forward_kernel, shared_bytes);
        const dim3 grid((T + layout.query_rows - 1) / layout.query_rows, NH, B);
        ENGINE_LAUNCH(forward_kernel, grid, threads_per_block, shared_bytes, stream, out, logsumexp, qkv, T, C, NH,
                      vectorized);
    });
}
} // namespace

size_t attention_forward_shared_bytes(int head_size) {
    return forward_layout(padded_head_size(head_size))
        .bytes(forward_query_tiles, forward_key_tiles, forward_score_tiles, forward_statistics);
}

void attention_forward(float* out, float* logsumexp, const float* qkv, int B, int T, int C, int NH, bool tf32,
                       cudaStream_t stream) {
    attention_tiles::check_shape(C, NH);
    if (int64_t(B) * NH * T == 0) return;
    if (tf32) launch_forward<true>(out, logsumexp, qkv, B, T, C, NH, stream);
    else launch_forward<false>(out, logsumexp, qkv, B, T, C, NH, stream);
}

} // namespace engine::kernels::cuda
