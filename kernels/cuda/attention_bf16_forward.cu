// Causal attention forward in bf16 on tensor cores (wmma 16x16x16 bf16, f32 accumulators), FlashAttention-2
// style: the twin of kernels/cpu/attention_bf16_forward.cpp, with the same rounding points (key tiles
// of attention_bf16_key_tile, P = exp(score - running max) rounded to bf16 before P·V, the output rounded once,
// the logsumexp in f32). Packed documents as there too: the tiles stay aligned at key 0, a row's keys in a tile are
// those of its document up to itself, and a tile holding none leaves the row exactly as it was.
#include <cmath>

#include "kernels/cuda/attention_bf16_tiles.cuh"

namespace engine::kernels::cuda {
namespace {
using namespace attention_bf16;

// [query (rows, head_stride) bf16] [key, value (key tile, head_stride) bf16] [scores (rows, score_stride) f32]
// [probabilities (rows, probability_stride) bf16] [position table] [per-row factors (rows) f32].
struct ForwardBf16Layout {
    int head_stride, score_stride, probability_stride;
    __host__ __device__ explicit ForwardBf16Layout(int padded_head)
        : head_stride(padded_head + bf16_padding), score_stride(forward_key_tile + float_padding),
          probability_stride(forward_key_tile + bf16_padding) {}
    __host__ __device__ size_t bytes() const {
        return aligned_bytes<bfloat16>(size_t(bf16_rows) * head_stride) +
               2 * aligned_bytes<bfloat16>(size_t(forward_key_tile) * head_stride) +
               aligned_bytes<float>(size_t(bf16_rows) * score_stride) +
               aligned_bytes<bfloat16>(size_t(bf16_rows) * probability_stride) +
               aligned_bytes<float>(position_table_floats) + aligned_bytes<float>(bf16_rows);
    }
};

// One block per (64-query tile, query head, batch); each warp owns 16 query rows and their output accumulators.
// Query head h reads the keys and values of kv head h / (NH / KVH) in place (grouped-query attention).
template <int max_width>
__global__ void __launch_bounds__(bf16_warps* warp_size)
    attention_forward_bf16_kernel(bfloat16* out, float* logsumexp, const bfloat16* qkv,
                                  const int32_t* document_positions, int T, int C, int NH, int KVH, bool vectorized) {
    constexpr int max_head_fragments = max_width / fragment_width, key_fragments = forward_key_tile / fragment_width;
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / bf16_depth;
    const ForwardBf16Layout layout(padded_head);
    const int stride = layout.head_stride;
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z; // long rows first
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int first_query = query_tile * bf16_rows, warp_first_query = first_query + warp * fragment_width;
    const float scale = 1.0f / sqrtf(static_cast<float>(head_size)); // IEEE sqrt and division: the CPU's value

    ENGINE_DYNAMIC_SHARED(unsigned char, shared);
    ByteCursor cursor(shared);
    bfloat16* query = cursor.take<bfloat16>(size_t(bf16_rows) * stride);
    bfloat16* key = cursor.take<bfloat16>(size_t(forward_key_tile) * stride);
    bfloat16* value = cursor.take<bfloat16>(size_t(forward_key_tile) * stride);
    float* scores = cursor.take<float>(size_t(bf16_rows) * layout.score_stride);
    bfloat16* probabilities = cursor.take<bfloat16>(size_t(bf16_rows) * layout.probability_stride);
    float* position_table = cursor.take<float>(position_table_floats);
    float* row_factor = cursor.take<float>(bf16_rows);
    bfloat16* query_stripe = query + warp * fragment_width * stride;
    float* score_stripe = scores + warp * fragment_width * layout.score_stride;
    bfloat16* probability_stripe = probabilities + warp * fragment_width * layout.probability_stride;
    float* warp_factor = row_factor + warp * fragment_width;

    const QkvLayout packed(C, NH, KVH);
    const int qkv_row = packed.row(), kv_head = head / packed.group;
    // (T, head_size) slices of the (B,T,C+2*KVH*head_size) qkv
    const bfloat16* queries = token_slice(qkv, batch, T, qkv_row, packed.query_column(head));
    const bfloat16* keys = token_slice(qkv, batch, T, qkv_row, packed.key_column(kv_head));
    const bfloat16* values = token_slice(qkv, batch, T, qkv_row, packed.value_column(kv_head));
    fill_position_table(position_table);
    load_bf16_tile(own_warp(), query_stripe, stride, queries, qkv_row, warp_first_query, fragment_width, T, head_size,
                   padded_head, vectorized);
    __syncthreads(); // the position table is complete
    const Accumulator16 element_rows = load_rows(position_table);
    Accumulator16 output[max_head_fragments]; // (16, padded_head), unnormalised
    zero16(output);

    // Softmax: lanes 2r and 2r + 1 own row r of the warp's stripe, each every other key, and hold its document's
    // first key.
    const int softmax_row = lane / 2, half = lane % 2, softmax_query = warp_first_query + softmax_row;
    const int32_t* row_positions = batch_positions(document_positions, batch, T);
    const int row_start = softmax_query < T ? document_start(row_positions, softmax_query) : 0;
    float running_max = -INFINITY, running_sum = 0.0f;
    // From the tile holding the block's first (earliest) document start; the CPU's tiles, aligned at key 0.
    const int last_query = min(first_query + bf16_rows, T) - 1;
    const int first_tile = tile_holding(document_start(row_positions, first_query), forward_key_tile);
    for (int first_key = first_tile; first_key <= last_query; first_key += forward_key_tile) {
        __syncthreads(); // every warp has finished with the previous tiles
        load_bf16_tile(whole_block(), key, stride, keys, qkv_row, first_key, forward_key_tile, T, head_size,
                       padded_head, vectorized);
        load_bf16_tile(whole_block(), value, stride, values, qkv_row, first_key, forward_key_tile, T, head_size,
                       padded_head, vectorized);
        __syncthreads();
        // A warp none of whose rows below T sees a key here (all precede the tile, or start their documents
        // after it) has nothing to add, as the CPU skips the tile for such rows.
        const int last_key = first_key + forward_key_tile - 1;
        if (!__any_sync(full_warp_mask, softmax_query < T && softmax_query >= first_key && row_start <= last_key)) {
            continue;
        }

        for (int f = 0; f < key_fragments; ++f) { // S = Q K^T, (16, key tile)
            Accumulator16 score;
            wmma::fill_fragment(score, 0.0f);
            add_transposed16(score, query_stripe, key + f * fragment_width * stride, depth_steps, stride);
            wmma::store_matrix_sync(score_stripe + f * fragment_width, score, layout.score_stride, wmma::mem_row_major);
        }
        __syncwarp();

        const float* score_row = score_stripe + softmax_row * layout.score_stride;
        bfloat16* probability_row = probability_stripe + softmax_row * layout.probability_stride;
        // The row's keys, its document's start up to itself; a row with none here gets P = 0 and a correction of
        // exactly 1 (the CPU skips the tile for it). P rounded to bf16 for the tensor cores; the running sum keeps
        // the f32 values.
        const int first_visible = max(0, row_start - first_key);
        const int end_visible = min(forward_key_tile, softmax_query - first_key + 1);
        const float correction = online_softmax_step(score_row, probability_row, first_visible, end_visible,
                                                     forward_key_tile, half, scale, running_max, running_sum);
        if (half == 0) warp_factor[softmax_row] = correction;
        __syncwarp();
        scale_rows16(output, head_fragments, element_rows, warp_factor);
        add_stripe16(output, head_fragments, probability_stripe, layout.probability_stride,
                     forward_key_tile / bf16_depth, value, stride); // O += P V
    }

    if (half == 0) warp_factor[softmax_row] = running_sum > 0.0f ? 1.0f / running_sum : 0.0f; // 0: rows past T
    __syncwarp();
    scale_rows16(output, head_fragments, element_rows, warp_factor);
    bfloat16* out_head = out + int64_t(batch) * T * C + int64_t(head) * head_size; // (T, head_size) of (B,T,C)
    store_rounded(out_head, C, output, head_fragments, score_stripe, layout.score_stride, warp_first_query, T,
                  head_size, false);
    float* logsumexp_head = logsumexp + (int64_t(batch) * NH + head) * T; // (T) of (B,NH,T)
    if (half == 0 && softmax_query < T) logsumexp_head[softmax_query] = running_max + logf(running_sum);
}

} // namespace

void attention_forward(bfloat16* out, float* logsumexp, const bfloat16* qkv, const int32_t* positions, int B, int T,
                       int C, int NH, int KVH, bool /*tf32: f32 only*/, cudaStream_t stream) {
    attention_tiles::check_shape(C, NH, KVH);
    if (int64_t(B) * NH * T == 0) return;
    const int head_size = C / NH;
    const bool vectorized = bf16_vectorizable(C, NH, {out, qkv});
    dispatch_head_size(head_size, [&]<int max_width>() {
        const size_t shared_bytes = ForwardBf16Layout(padded_head_size(head_size)).bytes();
        auto* kernel = attention_forward_bf16_kernel<max_width>;
        allow_shared_bytes(kernel, shared_bytes);
        const dim3 grid((T + bf16_rows - 1) / bf16_rows, NH, B);
        ENGINE_LAUNCH(kernel, grid, bf16_warps * warp_size, shared_bytes, stream, out, logsumexp, qkv, positions, T, C,
                      NH, KVH, vectorized);
    });
}

} // namespace engine::kernels::cuda
