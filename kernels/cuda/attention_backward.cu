// Causal attention backward on tensor cores, FlashAttention-2 style (twin of kernels/cpu/attention_backward.cpp).
// Three kernels, deterministic without atomics: D_i = rowsum(dout_i * out_i); then one block per (key
// tile, kv head) accumulates dK and dV over the query heads of its group (grouped-query attention), in
// ascending order, and for each over the query tiles at and after the diagonal; then one block per (query
// tile, query head) accumulates dQ over the key tiles up to the diagonal. Both recompute P from q, k and the
// logsumexp. Repeated K/V never exist: every block reads its kv head in place. With packed documents each P
// is masked to the query's document; the key/value pass stops at the first query step that starts its document
// after the block's keys, and the query pass starts at the key tile holding its first row's document start.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
using namespace attention_tiles;

// In TF32 up to a padded width of 64 each warp holds its operand rows (K and V in the key pass, Q and dout in
// the query pass) as matrix_a fragments across the loop: 64 registers next to 64 of accumulators. Wider
// heads, and 3xTF32 (its split operands doubled that and ptxas spilled), reload them from shared memory.
__host__ __device__ constexpr bool holds_operands(int max_width, bool tf32) { return tf32 && max_width <= 64; }
// Query rows per step of the key/value pass and key rows per step of the query pass: the (16, 32) S and dP
// of a step take 32 registers per warp lane; 64 rows pushed the query pass into spills.
inline constexpr int key_pass_query_rows = 32;
inline constexpr int query_pass_key_rows = 32;
// 4 warps (64 rows) per backward block: at 218-254 registers per thread an 8-warp block is alone on its SM
// and every __syncthreads idles the SM while the next tile loads; two 4-warp blocks per SM (same warps) let
// one block compute while the other waits.
inline constexpr int backward_warps = 4;
inline constexpr int backward_rows = backward_warps * fragment_width;

// Key/value pass: [key, value tiles: when not held] [query, dout steps] [per warp: P^T and dS^T stripes]
// [logsumexp, D of the step] [position table, then the step's document starts]. Held keys and values are staged
// through the warp's stripes.
struct KeyValueLayout {
    int head_stride, score_stride, rows;
    bool separate_operands;

    __host__ __device__ KeyValueLayout(int padded_head, int max_width, bool tf32)
        : head_stride(padded_head + row_padding), score_stride(key_pass_query_rows + row_padding),
          rows(backward_rows), separate_operands(!holds_operands(max_width, tf32)) {}
    __host__ __device__ size_t key_floats() const { return separate_operands ? size_t(rows) * head_stride : 0; }
    __host__ __device__ size_t query_floats() const { return size_t(key_pass_query_rows) * head_stride; }
    __host__ __device__ size_t stripe_floats() const { return size_t(fragment_width) * score_stride; }
    __host__ __device__ size_t bytes() const {
        return sizeof(float) * (2 * key_floats() + 2 * query_floats() + 2 * size_t(rows) * score_stride +
                                2 * key_pass_query_rows + position_table_floats);
    }
};

// Query pass: [query tile] [dout tile: when not held] [key, value tiles] [per warp: dS stripe]
// [logsumexp, D] [position table, then the rows' document starts]. Held queries and douts are staged in turn
// through the query tile.
struct QueryLayout {
    int head_stride, key_rows, score_stride, rows;
    bool separate_operands;

    __host__ __device__ QueryLayout(int padded_head, int max_width, bool tf32)
        : head_stride(padded_head + row_padding), key_rows(query_pass_key_rows),
          score_stride(key_rows + row_padding), rows(backward_rows),
          separate_operands(!holds_operands(max_width, tf32)) {}
    __host__ __device__ size_t query_floats() const { return size_t(rows) * head_stride; }
    __host__ __device__ size_t dout_floats() const { return separate_operands ? query_floats() : 0; }
    __host__ __device__ size_t key_floats() const { return size_t(key_rows) * head_stride; }
    __host__ __device__ size_t bytes() const {
        return sizeof(float) * (query_floats() + dout_floats() + 2 * key_floats() + size_t(rows) * score_stride +
                                2 * size_t(rows) + position_table_floats);
    }
};

// Both passes read the position table into registers once (load_positions); its space then holds the document
// starts of the rows in hand, so packed documents cost no shared memory.
static_assert(key_pass_query_rows <= position_table_floats && backward_rows <= position_table_floats);

// The buffers every backward kernel reads, and where this block's head starts in each.
struct HeadViews {
    const float* queries; // (T, head_size) of the (B,T,C+2*KVH*head_size) qkv; keys and values (its kv head's) likewise
    const float* keys;
    const float* values;
    const float* dout;      // (T, head_size) of (B,T,C), rows C apart
    const float* logsumexp; // (T) of (B,NH,T)
    const float* row_dot;   // (T) of (B,NH,T)
};

// `head` is a query head; its keys and values are those of kv head head / group.
__device__ HeadViews head_views(const float* dout, const float* qkv, const float* logsumexp, const float* row_dot,
                                int batch, int head, int T, int NH, const QkvLayout& packed) {
    const int kv_head = head / packed.group, qkv_row = packed.row();
    const int64_t statistics = (int64_t(batch) * NH + head) * T;
    return HeadViews{token_slice(qkv, batch, T, qkv_row, packed.query_column(head)),
                     token_slice(qkv, batch, T, qkv_row, packed.key_column(kv_head)),
                     token_slice(qkv, batch, T, qkv_row, packed.value_column(kv_head)),
                     token_slice(dout, batch, T, packed.C, packed.query_column(head)), logsumexp + statistics,
                     row_dot + statistics};
}

// P = exp(scale * S - logsumexp) (zero outside the query's keys, its document's start up to itself, and for
// queries at or past T) over `score`, and dS = scale * P * (dP - D) over `dprobability`, in registers:
// `positions` names each element's place. key_pass: rows are keys and columns queries (S^T); else rows are
// queries. first_row / first_column: the sequence positions of element (0, 0) of fragment 0; statistics and
// document starts are indexed by query within the step.
template <int count>
__device__ void probabilities_and_score_gradients(Accumulator (&score)[count], Accumulator (&dprobability)[count],
                                                  const ElementPositions& positions, bool key_pass, int first_row,
                                                  int first_column, int T, float scale, const float* row_logsumexp,
                                                  const float* row_dot, const int* query_start) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        for (int i = 0; i < score[f].num_elements; ++i) {
            const int row = static_cast<int>(positions.row.x[i]);
            const int column = f * fragment_width + static_cast<int>(positions.column.x[i]);
            const int key_index = key_pass ? first_row + row : first_column + column;
            const int query_local = key_pass ? column : row;
            const int query_index = key_pass ? first_column + column : first_row + row;
            const bool visible = query_index < T && key_index <= query_index && key_index >= query_start[query_local];
            const float probability = visible ? expf(score[f].x[i] * scale - row_logsumexp[query_local]) : 0.0f;
            score[f].x[i] = probability;
            dprobability[f].x[i] = scale * probability * (dprobability[f].x[i] - row_dot[query_local]);
        }
    }
}

// Loads a warp's 16 rows from `source` into `stripe` (warp-private) and then into held fragments; the
// trailing __syncwarp lets the caller reuse the stripe.
template <int count>
__device__ void hold_rows(RowOperand (&held)[count], int fragments, float* stripe, int stride, const float* source,
                          int row_length, int first_row, int T, int head_size, int padded_head, bool vectorized) {
    load_tile(own_warp(), stripe, stride, source, row_length, first_row, fragment_width, T, head_size, padded_head,
              vectorized);
    __syncwarp();
    load_row_operands(held, fragments, stripe, stride);
    __syncwarp();
}

// dK_j += scale * sum_{h in group} sum_{i>=j} dS_ij q_i and dV_j += sum_{h in group} sum_{i>=j} P_ij dout_i;
// each warp owns 16 keys of one kv head.
template <int max_width, bool tf32>
__global__ void attention_backward_key_value_kernel(float* dqkv, const float* dout, const float* qkv,
                                                    const float* logsumexp, const float* row_dot,
                                                    const int32_t* document_positions, int T, int C, int NH, int KVH,
                                                    bool vectorized) {
    constexpr bool hold = holds_operands(max_width, tf32);
    constexpr int max_head_fragments = max_width / fragment_width, max_depth_steps = max_width / fragment_depth;
    constexpr int query_fragments = key_pass_query_rows / fragment_width;
    constexpr int pass_fragments = max_width > 128 ? max_head_fragments / 2 : max_head_fragments;
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / fragment_depth;
    const KeyValueLayout layout(padded_head, max_width, tf32);
    const int stride = layout.head_stride;
    const int kv_head = blockIdx.y, batch = blockIdx.z, warp = threadIdx.x / warp_size;
    const int first_key = blockIdx.x * layout.rows; // the first tiles have the most query steps: they go first
    const int warp_first_key = first_key + warp * fragment_width;
    const float scale = rsqrtf(static_cast<float>(head_size));
    const QkvLayout packed(C, NH, KVH);
    const int first_head = kv_head * packed.group; // the query heads kv_head serves: first_head .. + group - 1
    const HeadViews kv_views = head_views(dout, qkv, logsumexp, row_dot, batch, first_head, T, NH, packed);

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* key = cursor.take(layout.key_floats());                        // (rows, head_stride), when not held
    float* value = cursor.take(layout.key_floats());                      // (rows, head_stride), when not held
    float* query = cursor.take(layout.query_floats());                    // (query rows, head_stride)
    float* dout_step = cursor.take(layout.query_floats());                // (query rows, head_stride)
    float* stripes = cursor.take(2 * layout.rows * size_t(layout.score_stride)); // per warp: P^T, dS^T
    float* row_logsumexp = cursor.take(key_pass_query_rows);              // (query rows)
    float* row_dot_step = cursor.take(key_pass_query_rows);               // (query rows)
    float* position_table = cursor.take(position_table_floats);
    int* step_start = reinterpret_cast<int*>(position_table); // (query rows), once the table is in registers
    float* probability_stripe = stripes + 2 * warp * layout.stripe_floats();
    float* dscore_stripe = probability_stripe + layout.stripe_floats();
    // Where the warp's keys and values live: held ones are staged in the stripes (16 x head_stride fits in
    // two stripes up to a padded width of 64).
    float* key_stripe = hold ? probability_stripe : key + warp * fragment_width * stride;
    float* value_stripe = hold ? probability_stripe : value + warp * fragment_width * stride;

    const int qkv_row = packed.row();
    const int32_t* row_positions = batch_positions(document_positions, batch, T);
    const int last_key = min(first_key + layout.rows, T) - 1, warp_last_key = warp_first_key + fragment_width - 1;
    fill_position_table(position_table);
    RowOperand held_key[hold ? max_depth_steps : 1], held_value[hold ? max_depth_steps : 1];
    if constexpr (hold) {
        hold_rows(held_key, depth_steps, key_stripe, stride, kv_views.keys, qkv_row, warp_first_key, T, head_size,
                  padded_head, vectorized);
        hold_rows(held_value, depth_steps, value_stripe, stride, kv_views.values, qkv_row, warp_first_key, T,
                  head_size, padded_head, vectorized);
    } else {
        load_tile(own_warp(), key_stripe, stride, kv_views.keys, qkv_row, warp_first_key, fragment_width, T,
                  head_size, padded_head, vectorized);
        load_tile(own_warp(), value_stripe, stride, kv_views.values, qkv_row, warp_first_key, fragment_width, T,
                  head_size, padded_head, vectorized);
    }
    __syncthreads(); // the position table is complete
    const ElementPositions positions = load_positions(position_table);
    // (T, head_size) slices of the (B,T,C+2*KVH*head_size) dqkv
    float* dkeys = token_slice(dqkv, batch, T, qkv_row, packed.key_column(kv_head));
    float* dvalues = token_slice(dqkv, batch, T, qkv_row, packed.value_column(kv_head));

    // dK and dV of a 256-wide head would need all 255 registers for themselves: there the warp makes two
    // passes over the queries, each for half of the columns, recomputing P and dS (no spills, 1.5x the work).
    for (int first_fragment = 0; first_fragment < head_fragments; first_fragment += pass_fragments) {
        const int fragments = min(pass_fragments, head_fragments - first_fragment);
        const int first_column = first_fragment * fragment_width;
        Accumulator dkey[pass_fragments], dvalue[pass_fragments];
        zero_accumulators(dkey);
        zero_accumulators(dvalue);

        // The group's query heads in ascending order, each over its query steps in ascending order: dK and dV
        // of a kv head sum in this fixed order, in the warp's accumulators, with no atomics and no repeated K/V.
        for (int member = 0; member < packed.group; ++member) {
            const HeadViews views =
                head_views(dout, qkv, logsumexp, row_dot, batch, first_head + member, T, NH, packed);
            // Key blocks start at multiples of the query step, so the first step starts on the diagonal. Starts
            // never decrease: once a step's first query starts its document after the block's keys, so do all
            // later ones, and the block is done.
            for (int first_query = first_key; first_query < T && document_start(row_positions, first_query) <= last_key;
                 first_query += key_pass_query_rows) {
                __syncthreads(); // every warp has finished reading the previous step (and holds the position table)
                load_tile(whole_block(), query, stride, views.queries, qkv_row, first_query, key_pass_query_rows, T,
                          head_size, padded_head, vectorized);
                load_tile(whole_block(), dout_step, stride, views.dout, C, first_query, key_pass_query_rows, T,
                          head_size, padded_head, vectorized);
                load_row_statistics(row_logsumexp, row_dot_step, views.logsumexp, views.row_dot, first_query,
                                    key_pass_query_rows, T);
                load_document_starts(step_start, row_positions, first_query, key_pass_query_rows, T);
                __syncthreads();
                // A warp none of whose keys any query of this step sees (causal: the keys follow the queries, or
                // lie past T; or the queries' documents start after them) has nothing to add.
                const int last_query = min(first_query + key_pass_query_rows, T) - 1;
                if (!sees_any_key(first_query, last_query, warp_first_key, warp_last_key,
                                  [&](int query_index) { return step_start[query_index - first_query]; })) {
                    continue;
                }

                Accumulator score[query_fragments], dprobability[query_fragments]; // S^T = K Q^T, dP^T = V dout^T
                zero_accumulators(score);
                zero_accumulators(dprobability);
                add_transposed_product<tf32, hold, max_depth_steps>(score, held_key, key_stripe, query, depth_steps,
                                                                    stride);
                add_transposed_product<tf32, hold, max_depth_steps>(dprobability, held_value, value_stripe, dout_step,
                                                                    depth_steps, stride);
                probabilities_and_score_gradients(score, dprobability, positions, true, warp_first_key, first_query, T,
                                                  scale, row_logsumexp, row_dot_step, step_start);
                store_accumulators(probability_stripe, layout.score_stride, score, query_fragments);
                store_accumulators(dscore_stripe, layout.score_stride, dprobability, query_fragments);
                __syncwarp();
                // The stripes hold P^T and dS^T (keys, queries): dV += P^T dout, dK += dS^T Q.
                constexpr int query_steps = key_pass_query_rows / fragment_depth;
                add_stripe_product<tf32>(dvalue, fragments, probability_stripe, layout.score_stride, query_steps,
                                         dout_step + first_column, stride);
                add_stripe_product<tf32>(dkey, fragments, dscore_stripe, layout.score_stride, query_steps,
                                         query + first_column, stride);
            }
        }
        // Out through the warp's P^T stripe, a 16 x 16 fragment at a time: the key and value stripes may still
        // be read by the next column pass.
        ATTENTION_UNROLL
        for (int f = 0; f < pass_fragments; ++f) {
            if (f >= fragments) break;
            const int column = first_column + f * fragment_width, columns = min(fragment_width, head_size - column);
            __syncwarp(); // the stripe's last readers are this warp's lanes
            wmma::store_matrix_sync(probability_stripe, dkey[f], layout.score_stride, wmma::mem_row_major);
            __syncwarp();
            add_tile(own_warp(), dkeys + column, qkv_row, probability_stripe, layout.score_stride, warp_first_key,
                     fragment_width, T, columns, vectorized);
            __syncwarp();
            wmma::store_matrix_sync(probability_stripe, dvalue[f], layout.score_stride, wmma::mem_row_major);
            __syncwarp();
            add_tile(own_warp(), dvalues + column, qkv_row, probability_stripe, layout.score_stride, warp_first_key,
                     fragment_width, T, columns, vectorized);
        }
    }
}

// dQ_i += scale * sum_{j<=i} dS_ij k_j; each warp owns 16 queries.
template <int max_width, bool tf32>
__global__ void attention_backward_query_kernel(float* dqkv, const float* dout, const float* qkv,
                                                const float* logsumexp, const float* row_dot,
                                                const int32_t* document_positions, int T, int C, int NH, int KVH,
                                                bool vectorized) {
    constexpr bool hold = holds_operands(max_width, tf32);
    constexpr int max_head_fragments = max_width / fragment_width, max_depth_steps = max_width / fragment_depth;
    constexpr int key_rows = query_pass_key_rows, key_fragments = key_rows / fragment_width;
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / fragment_depth;
    const QueryLayout layout(padded_head, max_width, tf32);
    const int stride = layout.head_stride;
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z; // long rows first
    const int warp = threadIdx.x / warp_size;
    const int first_query = query_tile * layout.rows, warp_first_query = first_query + warp * fragment_width;
    const float scale = rsqrtf(static_cast<float>(head_size));
    const QkvLayout packed(C, NH, KVH);
    const HeadViews views = head_views(dout, qkv, logsumexp, row_dot, batch, head, T, NH, packed);

    ENGINE_DYNAMIC_SHARED(float, shared);
    SharedCursor cursor(shared);
    float* query = cursor.take(layout.query_floats());                    // (rows, head_stride)
    float* dout_tile = cursor.take(layout.dout_floats());                 // (rows, head_stride), when not held
    float* key = cursor.take(layout.key_floats());                        // (key_rows, head_stride)
    float* value = cursor.take(layout.key_floats());                      // (key_rows, head_stride)
    float* dscores = cursor.take(size_t(layout.rows) * layout.score_stride); // per warp: dS (16, score_stride)
    float* row_logsumexp = cursor.take(layout.rows);                      // (rows)
    float* row_dot_tile = cursor.take(layout.rows);                       // (rows)
    float* position_table = cursor.take(position_table_floats);
    int* row_start = reinterpret_cast<int*>(position_table); // (rows), once the table is in registers
    float* dscore_stripe = dscores + warp * fragment_width * layout.score_stride;
    // The warp's queries and douts, and later its dQ; held douts are staged where the queries were.
    float* query_stripe = query + warp * fragment_width * stride;
    float* dout_stripe = hold ? query_stripe : dout_tile + warp * fragment_width * stride;
    const float* warp_logsumexp = row_logsumexp + warp * fragment_width;
    const float* warp_row_dot = row_dot_tile + warp * fragment_width;
    const int* warp_row_start = row_start + warp * fragment_width;

    const int qkv_row = packed.row();
    fill_position_table(position_table);
    load_row_statistics(row_logsumexp, row_dot_tile, views.logsumexp, views.row_dot, first_query, layout.rows, T);
    RowOperand held_query[hold ? max_depth_steps : 1], held_dout[hold ? max_depth_steps : 1];
    if constexpr (hold) {
        hold_rows(held_query, depth_steps, query_stripe, stride, views.queries, qkv_row, warp_first_query, T,
                  head_size, padded_head, vectorized);
        hold_rows(held_dout, depth_steps, dout_stripe, stride, views.dout, C, warp_first_query, T, head_size,
                  padded_head, vectorized);
    } else {
        load_tile(own_warp(), query_stripe, stride, views.queries, qkv_row, warp_first_query, fragment_width, T,
                  head_size, padded_head, vectorized);
        load_tile(own_warp(), dout_stripe, stride, views.dout, C, warp_first_query, fragment_width, T, head_size,
                  padded_head, vectorized);
    }
    __syncthreads(); // the position table and the row statistics are complete
    const ElementPositions positions = load_positions(position_table);
    __syncthreads(); // every warp holds the table: its space takes the document starts
    const int32_t* row_positions = batch_positions(document_positions, batch, T);
    load_document_starts(row_start, row_positions, first_query, layout.rows, T);
    Accumulator dquery[max_head_fragments];
    zero_accumulators(dquery);

    // Key tiles from the one holding the block's first document start (the earliest of its rows') up to the
    // diagonal.
    const int last_query = min(first_query + layout.rows, T) - 1;
    const int warp_last_query = min(warp_first_query + fragment_width, T) - 1;
    const int first_tile = tile_holding(document_start(row_positions, first_query), key_rows);
    for (int first_key = first_tile; first_key <= last_query; first_key += key_rows) {
        __syncthreads(); // every warp has finished reading the previous key and value tiles (the starts are written)
        load_tile(whole_block(), key, stride, views.keys, qkv_row, first_key, key_rows, T, head_size, padded_head,
                  vectorized);
        load_tile(whole_block(), value, stride, views.values, qkv_row, first_key, key_rows, T, head_size, padded_head,
                  vectorized);
        __syncthreads();
        // A warp none of whose queries below T sees a key of this tile (all precede it, or start their documents
        // after it) has nothing to add.
        if (!sees_any_key(warp_first_query, warp_last_query, first_key, first_key + key_rows - 1,
                          [&](int query_index) { return row_start[query_index - first_query]; })) {
            continue;
        }

        Accumulator score[key_fragments], dprobability[key_fragments]; // S = Q K^T, dP = dout V^T
        zero_accumulators(score);
        zero_accumulators(dprobability);
        add_transposed_product<tf32, hold, max_depth_steps>(score, held_query, query_stripe, key, depth_steps, stride);
        add_transposed_product<tf32, hold, max_depth_steps>(dprobability, held_dout, dout_stripe, value, depth_steps,
                                                            stride);
        probabilities_and_score_gradients(score, dprobability, positions, false, warp_first_query, first_key, T, scale,
                                          warp_logsumexp, warp_row_dot, warp_row_start);
        store_accumulators(dscore_stripe, layout.score_stride, dprobability, key_fragments);
        __syncwarp();
        add_stripe_product<tf32>(dquery, head_fragments, dscore_stripe, layout.score_stride, key_rows / fragment_depth,
                                 key, stride); // dQ += dS K
        __syncwarp(); // the next step's dS overwrites the stripe
    }
    __syncwarp();

    float* dqueries = token_slice(dqkv, batch, T, qkv_row, packed.query_column(head)); // (T, head_size) of dqkv
    store_accumulators(query_stripe, stride, dquery, head_fragments);
    __syncwarp();
    add_tile(own_warp(), dqueries, qkv_row, query_stripe, stride, warp_first_query, fragment_width, T, head_size,
             vectorized);
}

template <bool tf32>
void launch_backward(float* dqkv, float* row_dot_workspace, const float* dout, const float* qkv, const float* out,
                     const float* logsumexp, const int32_t* positions, int B, int T, int C, int NH, int KVH,
                     cudaStream_t stream) {
    const int head_size = C / NH;
    const bool vectorized = float4_aligned(C, NH, {dqkv, dout, qkv});
    ENGINE_LAUNCH(attention_row_dot_kernel<float>, ceil_div(int64_t(B) * NH * T, row_dot_warps), row_dot_warps * warp_size,
                  0, stream, row_dot_workspace, dout, out, B, T, C, NH);
    dispatch_head_size(head_size, [&]<int max_width>() {
        const int padded_head = padded_head_size(head_size);
        const KeyValueLayout key_value(padded_head, max_width, tf32);
        const QueryLayout query(padded_head, max_width, tf32);
        auto* key_value_kernel = attention_backward_key_value_kernel<max_width, tf32>;
        auto* query_kernel = attention_backward_query_kernel<max_width, tf32>;
        allow_shared_bytes(key_value_kernel, key_value.bytes());
        allow_shared_bytes(query_kernel, query.bytes());
        const int threads = backward_warps * warp_size;
        const dim3 key_value_grid((T + key_value.rows - 1) / key_value.rows, KVH, B); // one kv head per block
        const dim3 query_grid((T + query.rows - 1) / query.rows, NH, B);
        ENGINE_LAUNCH(key_value_kernel, key_value_grid, threads, key_value.bytes(), stream, dqkv, dout, qkv, logsumexp,
                      row_dot_workspace, positions, T, C, NH, KVH, vectorized);
        ENGINE_LAUNCH(query_kernel, query_grid, threads, query.bytes(), stream, dqkv, dout, qkv, logsumexp,
                      row_dot_workspace, positions, T, C, NH, KVH, vectorized);
    });
}
} // namespace

size_t attention_backward_shared_bytes(int head_size) {
    const int padded_head = padded_head_size(head_size), max_width = max_width_for(head_size);
    size_t bytes = 0;
    for (const bool tf32 : {false, true}) {
        const size_t key_value_bytes = KeyValueLayout(padded_head, max_width, tf32).bytes();
        const size_t query_bytes = QueryLayout(padded_head, max_width, tf32).bytes();
        bytes = std::max({bytes, key_value_bytes, query_bytes});
    }
    return bytes;
}

void attention_backward(float* dqkv, float* row_dot_workspace, const float* dout, const float* qkv, const float* out,
                        const float* logsumexp, const int32_t* positions, int B, int T, int C, int NH, int KVH,
                        bool tf32, cudaStream_t stream) {
    attention_tiles::check_shape(C, NH, KVH);
    if (int64_t(B) * NH * T == 0) return;
    if (tf32) {
        launch_backward<true>(dqkv, row_dot_workspace, dout, qkv, out, logsumexp, positions, B, T, C, NH, KVH, stream);
    } else {
        launch_backward<false>(dqkv, row_dot_workspace, dout, qkv, out, logsumexp, positions, B, T, C, NH, KVH, stream);
    }
}

} // namespace engine::kernels::cuda
