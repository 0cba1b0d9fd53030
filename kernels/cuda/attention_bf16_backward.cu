// Causal attention backward in bf16 on tensor cores (wmma 16x16x16 bf16, f32 accumulators): the twin of
// kernels/cpu/attention_bf16_backward.cpp. Deterministic without atomics, as the f32 kernels: D_i =
// rowsum(dout_i * out_i); one block per (64 keys, kv head) sums dK and dV over the query heads of its group
// (grouped-query attention) in ascending order and, for each, over the queries at and after its keys; one block
// per (64 queries, query head) sums dQ over the keys up to them. P and dS = scale·P·(dP - D) are computed in f32
// and rounded to bf16 as the operands of their products; each gradient is added into dqkv with one rounding.
// Packed documents: each P is masked to the query's document; the key/value pass stops at the first query step
// that starts its document after the block's keys, the query pass starts at the key step holding its first row's
// document start.
#include <cmath>

#include "kernels/cuda/attention_bf16_tiles.cuh"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {
using namespace attention_bf16;

// Both passes: [own rows A, B (rows, head_stride) bf16] [streamed tiles A, B (step, head_stride) bf16] [per warp:
// two f32 stripes (16, step + 4), two bf16 stripes (16, step + 8)] [row statistics: two (statistic_rows) f32]
// [document starts (statistic_rows) int]. Key/value pass: own = keys, values; streamed = queries, douts;
// statistics per step. Query pass: own = queries, douts; streamed = keys, values; statistics per own row.
struct BackwardBf16Layout {
    int head_stride, float_stride, bf16_stride, statistic_rows;
    __host__ __device__ BackwardBf16Layout(int padded_head, bool key_pass)
        : head_stride(padded_head + bf16_padding), float_stride(backward_step + float_padding),
          bf16_stride(backward_step + bf16_padding), statistic_rows(key_pass ? backward_step : bf16_rows) {}
    __host__ __device__ size_t bytes() const {
        return 2 * aligned_bytes<bfloat16>(size_t(bf16_rows) * head_stride) +
               2 * aligned_bytes<bfloat16>(size_t(backward_step) * head_stride) +
               bf16_warps * 2 * aligned_bytes<float>(size_t(fragment_width) * float_stride) +
               bf16_warps * 2 * aligned_bytes<bfloat16>(size_t(fragment_width) * bf16_stride) +
               2 * aligned_bytes<float>(statistic_rows) + aligned_bytes<int>(statistic_rows);
    }
};

struct BackwardShared {
    bfloat16 *own_a, *own_b, *streamed_a, *streamed_b;
    float *float_stripes, *row_logsumexp, *row_dot;
    bfloat16* bf16_stripes;
    int* document_start; // of each query whose statistics are held
};
__device__ BackwardShared take_backward_shared(unsigned char* shared, const BackwardBf16Layout& layout) {
    ByteCursor cursor(shared);
    BackwardShared views;
    views.own_a = cursor.take<bfloat16>(size_t(bf16_rows) * layout.head_stride);
    views.own_b = cursor.take<bfloat16>(size_t(bf16_rows) * layout.head_stride);
    views.streamed_a = cursor.take<bfloat16>(size_t(backward_step) * layout.head_stride);
    views.streamed_b = cursor.take<bfloat16>(size_t(backward_step) * layout.head_stride);
    views.float_stripes = cursor.take<float>(size_t(bf16_warps) * 2 * fragment_width * layout.float_stride);
    views.bf16_stripes = cursor.take<bfloat16>(size_t(bf16_warps) * 2 * fragment_width * layout.bf16_stride);
    views.row_logsumexp = cursor.take<float>(layout.statistic_rows);
    views.row_dot = cursor.take<float>(layout.statistic_rows);
    views.document_start = cursor.take<int>(layout.statistic_rows);
    return views;
}

// From the warp's f32 stripes S and dP (16, backward_step), writes P and dS rounded to bf16 into its bf16 stripes;
// P is zero outside the query's keys (its document's start up to itself) and for queries at or past T.
// key_pass: stripe rows are keys and columns queries (S^T); else rows are queries. Statistics and document starts
// are indexed by the query's place in `statistics_first` onward.
__device__ void probabilities_and_score_gradients(bfloat16* probability, bfloat16* dscore, const float* score,
                                                  const float* dprobability, const BackwardBf16Layout& layout,
                                                  bool key_pass, int first_row, int first_column, int T, float scale,
                                                  const float* row_logsumexp, const float* row_dot,
                                                  const int* query_start, int statistics_first) {
    for (int index = threadIdx.x % warp_size; index < fragment_width * backward_step; index += warp_size) {
        const int row = index / backward_step, column = index % backward_step;
        const int key_index = key_pass ? first_row + row : first_column + column;
        const int query_index = key_pass ? first_column + column : first_row + row;
        const int statistic = query_index - statistics_first;
        const bool visible = query_index < T && key_index <= query_index && key_index >= query_start[statistic];
        const float p =
            visible ? expf(score[row * layout.float_stride + column] * scale - row_logsumexp[statistic]) : 0.0f;
        const float ds = scale * p * (dprobability[row * layout.float_stride + column] - row_dot[statistic]);
        probability[row * layout.bf16_stride + column] = to_bfloat16(p);
        dscore[row * layout.bf16_stride + column] = to_bfloat16(ds);
    }
}

// The warp's S = A B^T and dP = A2 B2^T over backward_step columns (16-column fragments), stored as f32 into its
// stripes: K Q^T and V dout^T in the key pass, Q K^T and dout V^T in the query pass.
__device__ void score_products(float* score, float* dprobability, int float_stride, const bfloat16* a,
                               const bfloat16* b_rows, const bfloat16* a2, const bfloat16* b2_rows, int depth_steps,
                               int stride) {
    for (int f = 0; f < backward_step / fragment_width; ++f) {
        Accumulator16 s, dp;
        wmma::fill_fragment(s, 0.0f);
        wmma::fill_fragment(dp, 0.0f);
        add_transposed16(s, a, b_rows + f * fragment_width * stride, depth_steps, stride);
        add_transposed16(dp, a2, b2_rows + f * fragment_width * stride, depth_steps, stride);
        wmma::store_matrix_sync(score + f * fragment_width, s, float_stride, wmma::mem_row_major);
        wmma::store_matrix_sync(dprobability + f * fragment_width, dp, float_stride, wmma::mem_row_major);
    }
}

// dK_j += sum_{h in group} sum_{i>=j} dS_ij q_i and dV_j += sum_{h in group} sum_{i>=j} P_ij dout_i; each warp
// owns 16 keys of one kv head.
template <int max_width>
__global__ void __launch_bounds__(bf16_warps* warp_size)
    attention_backward_key_value_bf16_kernel(bfloat16* dqkv, const bfloat16* dout, const bfloat16* qkv,
                                             const float* logsumexp, const float* row_dot,
                                             const int32_t* document_positions, int T, int C, int NH, int KVH,
                                             bool vectorized) {
    constexpr int max_head_fragments = max_width / fragment_width;
    constexpr int pass_fragments = max_width > 128 ? max_head_fragments / 2 : max_head_fragments;
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / bf16_depth;
    const BackwardBf16Layout layout(padded_head, true);
    const QkvLayout packed(C, NH, KVH);
    const int stride = layout.head_stride, qkv_row = packed.row();
    const int kv_head = blockIdx.y, batch = blockIdx.z, warp = threadIdx.x / warp_size;
    const int first_head = kv_head * packed.group; // the query heads kv_head serves: first_head .. + group - 1
    const int first_key = blockIdx.x * bf16_rows, warp_first_key = first_key + warp * fragment_width;
    const int last_key = min(first_key + bf16_rows, T) - 1, warp_last_key = warp_first_key + fragment_width - 1;
    const float scale = 1.0f / sqrtf(static_cast<float>(head_size));
    const int32_t* row_positions = batch_positions(document_positions, batch, T);

    ENGINE_DYNAMIC_SHARED(unsigned char, shared);
    const BackwardShared views = take_backward_shared(shared, layout);
    bfloat16* key_stripe = views.own_a + warp * fragment_width * stride;
    bfloat16* value_stripe = views.own_b + warp * fragment_width * stride;
    bfloat16 *query = views.streamed_a, *dout_step = views.streamed_b;
    float* score = views.float_stripes + 2 * warp * fragment_width * layout.float_stride; // S^T
    float* dprobability = score + fragment_width * layout.float_stride;                 // dP^T
    bfloat16* probability = views.bf16_stripes + 2 * warp * fragment_width * layout.bf16_stride; // P^T
    bfloat16* dscore = probability + fragment_width * layout.bf16_stride;                        // dS^T
    load_bf16_tile(own_warp(), key_stripe, stride, token_slice(qkv, batch, T, qkv_row, packed.key_column(kv_head)),
                   qkv_row, warp_first_key, fragment_width, T, head_size, padded_head, vectorized);
    load_bf16_tile(own_warp(), value_stripe, stride, token_slice(qkv, batch, T, qkv_row, packed.value_column(kv_head)),
                   qkv_row, warp_first_key, fragment_width, T, head_size, padded_head, vectorized);
    // (T, head_size) slices of the (B,T,C+2*KVH*head_size) dqkv
    bfloat16* dkeys = token_slice(dqkv, batch, T, qkv_row, packed.key_column(kv_head));
    bfloat16* dvalues = token_slice(dqkv, batch, T, qkv_row, packed.value_column(kv_head));

    // dK and dV of a 256-wide head would need every register for themselves (ptxas spilled 548 bytes): there the
    // warp makes two passes over the queries, half of the columns each, recomputing P and dS, as the f32 kernel.
    for (int first_fragment = 0; first_fragment < head_fragments; first_fragment += pass_fragments) {
        const int fragments = min(pass_fragments, head_fragments - first_fragment);
        const int first_column = first_fragment * fragment_width;
        Accumulator16 dkey[pass_fragments], dvalue[pass_fragments];
        zero16(dkey);
        zero16(dvalue);
        // The group's query heads in ascending order, each over its query steps: the fixed order in which the f32
        // accumulators sum dK and dV of the kv head, rounded to bf16 once at the end (the CPU reference's point).
        for (int member = 0; member < packed.group; ++member) {
            const int head = first_head + member;
            const int64_t statistics = (int64_t(batch) * NH + head) * T;
            const bfloat16* queries = token_slice(qkv, batch, T, qkv_row, packed.query_column(head));
            const bfloat16* douts = token_slice(dout, batch, T, C, packed.query_column(head)); // rows C apart
            // Key blocks start at multiples of the query step, so the first step starts on the diagonal. Starts
            // never decrease: once a step's first query starts its document after the block's keys, the block
            // is done.
            for (int first_query = first_key; first_query < T && document_start(row_positions, first_query) <= last_key;
                 first_query += backward_step) {
                __syncthreads(); // every warp has finished reading the previous step's query and dout
                load_bf16_tile(whole_block(), query, stride, queries, qkv_row, first_query, backward_step, T, head_size,
                               padded_head, vectorized);
                load_bf16_tile(whole_block(), dout_step, stride, douts, C, first_query, backward_step, T, head_size,
                               padded_head, vectorized);
                load_row_statistics(views.row_logsumexp, views.row_dot, logsumexp + statistics, row_dot + statistics,
                                    first_query, backward_step, T);
                load_document_starts(views.document_start, row_positions, first_query, backward_step, T);
                __syncthreads();
                // A warp none of whose keys any query of this step sees has nothing to add.
                const int last_query = min(first_query + backward_step, T) - 1;
                if (!sees_any_key(first_query, last_query, warp_first_key, warp_last_key,
                                  [&](int query_index) { return views.document_start[query_index - first_query]; })) {
                    continue;
                }

                // S^T = K Q^T, dP^T = V dout^T
                score_products(score, dprobability, layout.float_stride, key_stripe, query, value_stripe, dout_step,
                               depth_steps, stride);
                __syncwarp();
                probabilities_and_score_gradients(probability, dscore, score, dprobability, layout, true,
                                                  warp_first_key, first_query, T, scale, views.row_logsumexp,
                                                  views.row_dot, views.document_start, first_query);
                __syncwarp();
                constexpr int steps = backward_step / bf16_depth;
                add_stripe16(dvalue, fragments, probability, layout.bf16_stride, steps, dout_step + first_column,
                             stride); // P^T dout
                add_stripe16(dkey, fragments, dscore, layout.bf16_stride, steps, query + first_column,
                             stride); // dS^T Q
            }
        }
        store_rounded(dkeys + first_column, qkv_row, dkey, fragments, score, layout.float_stride, warp_first_key, T,
                      head_size - first_column, true);
        store_rounded(dvalues + first_column, qkv_row, dvalue, fragments, score, layout.float_stride, warp_first_key, T,
                      head_size - first_column, true);
    }
}

// dQ_i += sum_{j<=i} dS_ij k_j; each warp owns 16 queries.
template <int max_width>
__global__ void __launch_bounds__(bf16_warps* warp_size)
    attention_backward_query_bf16_kernel(bfloat16* dqkv, const bfloat16* dout, const bfloat16* qkv,
                                         const float* logsumexp, const float* row_dot,
                                         const int32_t* document_positions, int T, int C, int NH, int KVH,
                                         bool vectorized) {
    constexpr int max_head_fragments = max_width / fragment_width;
    const int head_size = C / NH, padded_head = padded_head_size(head_size);
    const int head_fragments = padded_head / fragment_width, depth_steps = padded_head / bf16_depth;
    const BackwardBf16Layout layout(padded_head, false);
    const QkvLayout packed(C, NH, KVH);
    const int stride = layout.head_stride, qkv_row = packed.row();
    const int query_tile = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z; // long rows first
    const int kv_head = head / packed.group;
    const int warp = threadIdx.x / warp_size;
    const int first_query = query_tile * bf16_rows, warp_first_query = first_query + warp * fragment_width;
    const float scale = 1.0f / sqrtf(static_cast<float>(head_size));
    const int64_t statistics = (int64_t(batch) * NH + head) * T;

    ENGINE_DYNAMIC_SHARED(unsigned char, shared);
    const BackwardShared views = take_backward_shared(shared, layout);
    bfloat16* query_stripe = views.own_a + warp * fragment_width * stride;
    bfloat16* dout_stripe = views.own_b + warp * fragment_width * stride;
    bfloat16 *key = views.streamed_a, *value = views.streamed_b;
    float* score = views.float_stripes + 2 * warp * fragment_width * layout.float_stride;
    float* dprobability = score + fragment_width * layout.float_stride;
    bfloat16* probability = views.bf16_stripes + 2 * warp * fragment_width * layout.bf16_stride; // unused but P
    bfloat16* dscore = probability + fragment_width * layout.bf16_stride;
    load_bf16_tile(own_warp(), query_stripe, stride, token_slice(qkv, batch, T, qkv_row, packed.query_column(head)),
                   qkv_row, warp_first_query, fragment_width, T, head_size, padded_head, vectorized);
    load_bf16_tile(own_warp(), dout_stripe, stride, token_slice(dout, batch, T, C, packed.query_column(head)), C,
                   warp_first_query, fragment_width, T, head_size, padded_head, vectorized);
    load_row_statistics(views.row_logsumexp, views.row_dot, logsumexp + statistics, row_dot + statistics, first_query,
                    bf16_rows, T);
    const int32_t* row_positions = batch_positions(document_positions, batch, T);
    load_document_starts(views.document_start, row_positions, first_query, bf16_rows, T);
    Accumulator16 dquery[max_head_fragments];
    zero16(dquery);

    // Key steps from the one holding the block's first (earliest) document start up to the diagonal.
    const int last_query = min(first_query + bf16_rows, T) - 1;
    const int warp_last_query = min(warp_first_query + fragment_width, T) - 1;
    const int first_step = tile_holding(document_start(row_positions, first_query), backward_step);
    for (int first_key = first_step; first_key <= last_query; first_key += backward_step) {
        __syncthreads(); // every warp has finished reading the previous key and value tiles (and the statistics)
        load_bf16_tile(whole_block(), key, stride, token_slice(qkv, batch, T, qkv_row, packed.key_column(kv_head)),
                       qkv_row, first_key, backward_step, T, head_size, padded_head, vectorized);
        load_bf16_tile(whole_block(), value, stride, token_slice(qkv, batch, T, qkv_row, packed.value_column(kv_head)),
                       qkv_row, first_key, backward_step, T, head_size, padded_head, vectorized);
        __syncthreads();
        // A warp none of whose queries below T sees a key of this step has nothing to add.
        if (!sees_any_key(warp_first_query, warp_last_query, first_key, first_key + backward_step - 1,
                          [&](int query_index) { return views.document_start[query_index - first_query]; })) {
            continue;
        }

        // S = Q K^T, dP = dout V^T
        score_products(score, dprobability, layout.float_stride, query_stripe, key, dout_stripe, value, depth_steps,
                       stride);
        __syncwarp();
        probabilities_and_score_gradients(probability, dscore, score, dprobability, layout, false, warp_first_query,
                                          first_key, T, scale, views.row_logsumexp, views.row_dot, views.document_start,
                                          first_query);
        __syncwarp();
        add_stripe16(dquery, head_fragments, dscore, layout.bf16_stride, backward_step / bf16_depth, key,
                     stride); // dQ += dS K
    }
    store_rounded(token_slice(dqkv, batch, T, qkv_row, packed.query_column(head)), qkv_row, dquery, head_fragments,
                  score, layout.float_stride, warp_first_query, T, head_size, true);
}

} // namespace

void attention_backward(bfloat16* dqkv, float* row_dot_workspace, const bfloat16* dout, const bfloat16* qkv,
                        const bfloat16* out, const float* logsumexp, const int32_t* positions, int B, int T, int C,
                        int NH, int KVH, bool /*tf32: f32 only*/, cudaStream_t stream) {
    attention_tiles::check_shape(C, NH, KVH);
    if (int64_t(B) * NH * T == 0) return;
    const int head_size = C / NH;
    const bool vectorized = bf16_vectorizable(C, NH, {dqkv, dout, qkv});
    ENGINE_LAUNCH(attention_row_dot_kernel<bfloat16>, ceil_div(int64_t(B) * NH * T, row_dot_warps),
                  row_dot_warps * warp_size, 0, stream, row_dot_workspace, dout, out, B, T, C, NH);
    dispatch_head_size(head_size, [&]<int max_width>() {
        const int padded_head = padded_head_size(head_size);
        const size_t key_value_bytes = BackwardBf16Layout(padded_head, true).bytes();
        const size_t query_bytes = BackwardBf16Layout(padded_head, false).bytes();
        auto* key_value_kernel = attention_backward_key_value_bf16_kernel<max_width>;
        auto* query_kernel = attention_backward_query_bf16_kernel<max_width>;
        allow_shared_bytes(key_value_kernel, key_value_bytes);
        allow_shared_bytes(query_kernel, query_bytes);
        const int tiles = (T + bf16_rows - 1) / bf16_rows;
        const dim3 key_value_grid(tiles, KVH, B), query_grid(tiles, NH, B); // one kv head, one query head per block
        ENGINE_LAUNCH(key_value_kernel, key_value_grid, bf16_warps * warp_size, key_value_bytes, stream, dqkv, dout,
                      qkv, logsumexp, row_dot_workspace, positions, T, C, NH, KVH, vectorized);
        ENGINE_LAUNCH(query_kernel, query_grid, bf16_warps * warp_size, query_bytes, stream, dqkv, dout, qkv, logsumexp,
                      row_dot_workspace, positions, T, C, NH, KVH, vectorized);
    });
}

} // namespace engine::kernels::cuda
