// Causal attention forward on tensor cores, FlashAttention-2 style (twin of kernels/cpu/attention_forward.cpp):
// one block per (query tile, query head, batch) streams the key/value tiles of its kv head (grouped-query
// attention: query head h reads kv head h / (NH / KVH) in place) through shared memory with an online
// softmax, so no T x T matrix exists anywhere; it saves the per-row logsumexp for the backward. With packed
// documents a block streams only the tiles from the one holding its first row's document start (FlashAttention's
// varlen idea inside a row) and masks each row's keys to its own document.
#include <cmath>

#include "kernels/cuda/attention_tiles.cuh"

namespace engine::kernels::cuda {
namespace {
using namespace attention_tiles;

// 8 warps (128 query rows) per block, so other warps hide one warp's softmax and loads; four at the widest
// heads, whose per-warp stripes would not fit shared memory eight times.
__host__ __device__ constexpr int forward_warps(int max_width) { return max_width <= 128 ? 8 : 4; }
// Up to a padded width of 128 (64 in 3xTF32, whose split operands take twice the registers: ptxas spilled at
// 128) each warp holds its 16 query rows as matrix_a fragments for the whole loop; wider heads reload them
// from shared memory per key tile.
__host__ __device__ constexpr bool holds_query(int max_width, bool tf32) { return max_width <= (tf32 ? 128 : 64); }
// Rows of a streamed key/value tile: 64, or 32 at the widest heads so that shared memory fits sm_90.
__host__ __device__ constexpr int forward_key_rows(int max_width) { return max_width <= 128 ? 64 : 32; }

// The forward's shared memory: [query tile, only when not held] [key tile] [value tile] [per-warp score
// stripes] [position table] [per-row factors]. When the query is held it is staged through the key and
// value tiles (together exactly the block's rows), and so is the output at the end.
struct ForwardLayout {
    int head_stride, key_rows, score_stride, rows;
    bool separate_query;

    __host__ __device__ ForwardLayout(int padded_head, int max_width, bool tf32)
        : head_stride(padded_head + row_padding), key_rows(forward_key_rows(max_width)),
          score_stride(key_rows + row_padding), rows(forward_warps(max_width) * fragment_width),
          separate_query(!holds_query(max_width, tf32)) {}
    __host__ __device__ size_t query_floats() const { return separate_query ? size_t(rows) * head_stride : 0; }
    __host__ __device__ size_t key_floats() const { return size_t(key_rows) * head_stride; }
    __host__ __device__ size_t score_floats() const { return size_t(rows) * score_stride; }
    __host__ __device__ size_t bytes() const {
        return sizeof(float) * (query_floats() + 2 * key_floats() + score_floats() + position_table_floats + rows);
    }
};

// Blocks per SM that the register budget must allow: two for TF32 at head size 64 (at most 128 registers per
// thread), else whatever ptxas needs (one 8-warp block).
__host__ __device__ constexpr int forward_blocks_per_sm(int max_width, bool tf32) {
    return tf32 && max_width <= 64 ? 2 : 1;
}

// max_width: the compiled maximum padded head size (64, 128, 256); the run-time one is C / NH padded.
template <int max_width, bool tf32>
__global__ void __launch_bounds__(forward_warps(max_width) * warp_size, forward_blocks_per_sm(max_width, tf32))
    attention_forward_kernel(float* out, float* logsumexp, const float* qkv, const int32_t* document_positions, int T,
                             int C, int NH, int KVH, bool vectorized) {
    constexpr bool hold_query = holds_query(max_width, tf32);
    constexpr int max_head_fragments = max_width / fragment_width, max_depth_steps = max_width / fragment_depth;
    constexpr int key_rows = forward_key_rows(max_width), key_fragments = key_rows / fragment_width;
    static_assert(!hold_query || 2 * key_rows == forward_warps(max_width) * fragment_width,
                  "a held query is staged in the key and value tiles, which must span the block's rows");
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / fragment_depth;
    const ForwardLayout layout(padded_head, max_width, tf32);
    const int stride = layout.head_stride;
    // The longest rows (most key tiles) go first, so the short ones fill the tail of the grid.
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const QkvLayout packed(C, NH, KVH);
    const int kv_head = head / packed.group;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int first_query = query_tile * layout.rows, warp_first_query = first_query + warp * fragment_width;
    const float scale = rsqrtf(static_cast<float>(head_size));

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* query = cursor.take(layout.query_floats());        // (rows, head_stride), when not held
    float* key = cursor.take(layout.key_floats());            // (key_rows, head_stride)
    float* value = cursor.take(layout.key_floats());          // (key_rows, head_stride), right after key
    float* scores = cursor.take(layout.score_floats());       // (rows, score_stride): S, then P
    float* position_table = cursor.take(position_table_floats);
    float* row_factor = cursor.take(layout.rows);              // (rows): per-row scale of the output
    // This warp's 16 rows: query staging (or the query itself), finally the output.
    float* stripe = (hold_query ? key : query) + warp * fragment_width * stride;
    float* score_stripe = scores + warp * fragment_width * layout.score_stride;
    float* warp_factor = row_factor + warp * fragment_width;

    const int qkv_row = packed.row();
    // (T, head_size) slices of the (B,T,C+2*KVH*head_size) qkv
    const float* queries = token_slice(qkv, batch, T, qkv_row, packed.query_column(head));
    const float* keys = token_slice(qkv, batch, T, qkv_row, packed.key_column(kv_head));
    const float* values = token_slice(qkv, batch, T, qkv_row, packed.value_column(kv_head));
    fill_position_table(position_table);
    load_tile(own_warp(), stripe, stride, queries, qkv_row, warp_first_query, fragment_width, T, head_size,
              padded_head, vectorized);
    __syncthreads(); // the table is complete and every warp's stripe written
    const ElementPositions positions = load_positions(position_table);
    RowOperand held_query[hold_query ? max_depth_steps : 1];
    if constexpr (hold_query) load_row_operands(held_query, depth_steps, stripe, stride);
    Accumulator output[max_head_fragments]; // (16, padded_head), unnormalised
    zero_accumulators(output);

    // Softmax: lanes 2r and 2r + 1 own row r of the warp's stripe, each every other key (2-way bank conflicts
    // at most), and keep its running max and sum, and its document's first key, in registers.
    const int softmax_row = lane / 2, half = lane % 2, softmax_query = warp_first_query + softmax_row;
    const int32_t* row_positions = batch_positions(document_positions, batch, T);
    const int row_start = softmax_query < T ? document_start(row_positions, softmax_query) : 0;
    float running_max = -INFINITY, running_sum = 0.0f;

    // Key tiles from the one holding the block's first document start (the earliest of its rows': starts never
    // decrease) up to the diagonal, where the last query row of the tile (or of the sequence) decides.
    const int last_query = min(first_query + layout.rows, T) - 1;
    const int first_tile = tile_holding(document_start(row_positions, first_query), key_rows);
    for (int first_key = first_tile; first_key <= last_query; first_key += key_rows) {
        __syncthreads(); // every warp has finished with the previous tiles (or its query staged in them)
        load_tile(whole_block(), key, stride, keys, qkv_row, first_key, key_rows, T, head_size, padded_head,
                  vectorized);
        load_tile(whole_block(), value, stride, values, qkv_row, first_key, key_rows, T, head_size, padded_head,
                  vectorized);
        __syncthreads();
        // A warp none of whose rows below T sees a key here (all rows precede the tile, or start their documents
        // after it) has nothing to add; no block barrier follows before the next iteration's, so it may skip.
        const int last_key = first_key + key_rows - 1;
        if (!__any_sync(full_warp_mask, softmax_query < T && softmax_query >= first_key && row_start <= last_key)) {
            continue;
        }

        // S = Q K^T, (16, key_rows), one 16-key fragment at a time: the fewest live score registers, which is
        // what lets two blocks' worth of registers fit at head size 64 without spills.
        ATTENTION_UNROLL
        for (int f = 0; f < key_fragments; ++f) {
            Accumulator score[1];
            zero_accumulators(score);
            const int first_column = f * fragment_width;
            add_transposed_product<tf32, hold_query, max_depth_steps>(score, held_query, stripe,
                                                                      key + first_column * stride, depth_steps, stride);
            store_accumulators(score_stripe + first_column, layout.score_stride, score, 1);
        }
        __syncwarp();

        float* score_row = score_stripe + softmax_row * layout.score_stride;
        // The row's keys: from its document's start to itself. A row with none here gets P = 0 and a correction
        // of exactly 1, so this tile leaves it as it was. P overwrites S in place.
        const int first_visible = max(0, row_start - first_key);
        const int end_visible = min(key_rows, softmax_query - first_key + 1);
        const float correction = online_softmax_step(score_row, score_row, first_visible, end_visible, key_rows, half,
                                                     scale, running_max, running_sum);
        if (half == 0) warp_factor[softmax_row] = correction;
        __syncwarp();
        scale_rows(output, head_fragments, positions, warp_factor);

        add_stripe_product<tf32>(output, head_fragments, score_stripe, layout.score_stride, key_rows / fragment_depth,
                                 value, stride); // O += P V
    }
    __syncthreads(); // the key/value tiles are free: the output may be staged in them

    if (half == 0) warp_factor[softmax_row] = running_sum > 0.0f ? 1.0f / running_sum : 0.0f; // 0: rows past T
    __syncwarp();
    scale_rows(output, head_fragments, positions, warp_factor);
    store_accumulators(stripe, stride, output, head_fragments);
    __syncwarp();
    float* out_head = out + int64_t(batch) * T * C + int64_t(head) * head_size; // (T, head_size) of (B,T,C)
    for_each_group(own_warp(), fragment_width, head_size, vectorized ? 4 : 1, [&](int row, int column) {
        if (warp_first_query + row >= T) return;
        const float* from = stripe + row * stride + column;
        float* to = out_head + int64_t(warp_first_query + row) * C + column;
        if (vectorized) *reinterpret_cast<float4*>(to) = *reinterpret_cast<const float4*>(from);
        else *to = *from;
    });
    float* logsumexp_head = logsumexp + (int64_t(batch) * NH + head) * T; // (T) of (B,NH,T)
    if (half == 0 && softmax_query < T) logsumexp_head[softmax_query] = running_max + logf(running_sum);
}

template <bool tf32>
void launch_forward(float* out, float* logsumexp, const float* qkv, const int32_t* positions, int B, int T, int C,
                    int NH, int KVH, cudaStream_t stream) {
    const int head_size = C / NH;
    const bool vectorized = float4_aligned(C, NH, {out, qkv});
    dispatch_head_size(head_size, [&]<int max_width>() {
        const ForwardLayout layout(padded_head_size(head_size), max_width, tf32);
        const size_t shared_bytes = layout.bytes();
        auto* forward_kernel = attention_forward_kernel<max_width, tf32>;
        allow_shared_bytes(forward_kernel, shared_bytes);
        const dim3 grid((T + layout.rows - 1) / layout.rows, NH, B);
        ENGINE_LAUNCH(forward_kernel, grid, forward_warps(max_width) * warp_size, shared_bytes, stream, out, logsumexp,
                      qkv, positions, T, C, NH, KVH, vectorized);
    });
}
} // namespace

size_t attention_forward_shared_bytes(int head_size) {
    const int padded_head = padded_head_size(head_size), max_width = max_width_for(head_size);
    const size_t tf32_bytes = ForwardLayout(padded_head, max_width, true).bytes();
    const size_t fp32_bytes = ForwardLayout(padded_head, max_width, false).bytes();
    return tf32_bytes > fp32_bytes ? tf32_bytes : fp32_bytes;
}

void attention_forward(float* out, float* logsumexp, const float* qkv, const int32_t* positions, int B, int T, int C,
                       int NH, int KVH, bool tf32, cudaStream_t stream) {
    attention_tiles::check_shape(C, NH, KVH);
    if (int64_t(B) * NH * T == 0) return;
    if (tf32)
        launch_forward<true>(out, logsumexp, qkv, positions, B, T, C, NH, KVH, stream);
    else
        launch_forward<false>(out, logsumexp, qkv, positions, B, T, C, NH, KVH, stream);
}

} // namespace engine::kernels::cuda
