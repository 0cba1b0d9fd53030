// Causal multi-head self-attention, flash style (CUDA twin of kernels/cpu/attention.cpp): one warp per
// (batch, head, row) with an online softmax over keys in chunks of 32, so no T x T matrix ever reaches
// global memory. Forward saves logsumexp; backward recomputes the probabilities from q, k and logsumexp.
// Every output element is written by exactly one warp, so both directions are deterministic.
#include <cmath>

#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int warps_per_block = 4;
constexpr int block_size = warps_per_block * warp_size;
constexpr int values_per_lane = attention_max_head_size / warp_size; // head dimensions each lane accumulates

// The warp's (batch, head, row); rows vary fastest so neighbouring warps share keys and values in cache.
struct RowCoordinates {
    int batch, head, row;
    int64_t statistic_index; // into (B,NH,T) logsumexp and D
};

__device__ RowCoordinates row_coordinates(int64_t warp_index, int T, int NH) {
    RowCoordinates coordinates;
    coordinates.row = static_cast<int>(warp_index % T);
    coordinates.head = static_cast<int>((warp_index / T) % NH);
    coordinates.batch = static_cast<int>(warp_index / (int64_t(T) * NH));
    coordinates.statistic_index = warp_index;
    return coordinates;
}

// Column `part` (0 = q, 1 = k, 2 = v) of head `head` at token (batch, t) in the packed (B,T,3C) buffer.
template <typename Pointer>
__device__ Pointer packed_head(Pointer qkv, int batch, int t, int part, int head, int T, int C, int head_size) {
    return qkv + (int64_t(batch) * T + t) * 3 * C + int64_t(part) * C + int64_t(head) * head_size;
}

// A lane's dot product of a whole head vector held in shared memory with one in global memory.
__device__ float dot_head(const float* shared_vector, const float* global_vector, int head_size) {
    float sum = 0.0f;
    for (int d = 0; d < head_size; ++d) sum += shared_vector[d] * global_vector[d];
    return sum;
}
} // namespace

static __global__ void attention_forward_kernel(float* out, float* logsumexp, const float* qkv, int B, int T, int C,
                                                int NH) {
    ENGINE_DYNAMIC_SHARED(float, shared);
    const int head_size = C / NH, lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int64_t warp_index = int64_t(blockIdx.x) * warps_per_block + warp;
    if (warp_index >= int64_t(B) * NH * T) return; // whole warps leave; no block barrier follows
    const RowCoordinates at = row_coordinates(warp_index, T, NH);
    const float scale = rsqrtf(static_cast<float>(head_size));

    float* query = shared + warp * head_size; // every lane needs the whole query for its own key
    const float* query_global = packed_head(qkv, at.batch, at.row, 0, at.head, T, C, head_size);
    for (int d = lane; d < head_size; d += warp_size) query[d] = query_global[d];
    __syncwarp();

    float running_max = -INFINITY, running_sum = 0.0f;
    float accumulator[values_per_lane] = {};
    for (int chunk = 0; chunk <= at.row; chunk += warp_size) {
        const int key = chunk + lane;
        float score = -INFINITY;
        if (key <= at.row) {
            score = scale * dot_head(query, packed_head(qkv, at.batch, key, 1, at.head, T, C, head_size), head_size);
        }
        // Lane 0's key is always valid, so the chunk maximum is finite and the corrections below are too.
        const float new_max = fmaxf(running_max, warp_max(score));
        const float correction = expf(running_max - new_max);
        const float probability = key <= at.row ? expf(score - new_max) : 0.0f;
        running_sum = running_sum * correction + warp_sum(probability);
        for (int i = 0; i < values_per_lane; ++i) accumulator[i] *= correction;
        const int valid_keys = min(warp_size, at.row - chunk + 1);
        for (int k = 0; k < valid_keys; ++k) {
            const float weight = __shfl_sync(full_warp_mask, probability, k);
            const float* value = packed_head(qkv, at.batch, chunk + k, 2, at.head, T, C, head_size);
            for (int i = 0; i < values_per_lane; ++i) {
                const int d = lane + i * warp_size;
                if (d < head_size) accumulator[i] += weight * value[d];
            }
        }
        running_max = new_max;
    }
    float* out_row = out + (int64_t(at.batch) * T + at.row) * C + int64_t(at.head) * head_size;
    for (int i = 0; i < values_per_lane; ++i) {
        const int d = lane + i * warp_size;
        if (d < head_size) out_row[d] = accumulator[i] / running_sum;
    }
    if (lane == 0) logsumexp[at.statistic_index] = running_max + logf(running_sum);
}

// D_i = rowsum(dout_i * out_i) per (batch, head, row): the softmax-Jacobian term both gradient passes need.
static __global__ void attention_row_dot_kernel(float* row_dot, const float* dout, const float* out, int B, int T,
                                                int C, int NH) {
    const int head_size = C / NH, lane = threadIdx.x % warp_size;
    const int64_t warp_index = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / warp_size;
    if (warp_index >= int64_t(B) * NH * T) return;
    const RowCoordinates at = row_coordinates(warp_index, T, NH);
    const int64_t base = (int64_t(at.batch) * T + at.row) * C + int64_t(at.head) * head_size;
    float sum = 0.0f;
    for (int d = lane; d < head_size; d += warp_size) sum += dout[base + d] * out[base + d];
    sum = warp_sum(sum);
    if (lane == 0) row_dot[at.statistic_index] = sum;
}

// dq_i = scale * sum_{j<=i} ds_ij k_j, one warp per query row; lanes take keys, then head dimensions.
static __global__ void attention_backward_query_kernel(float* dqkv, const float* dout, const float* qkv,
                                                       const float* logsumexp, const float* row_dot, int B, int T,
                                                       int C, int NH) {
    ENGINE_DYNAMIC_SHARED(float, shared);
    const int head_size = C / NH, lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int64_t warp_index = int64_t(blockIdx.x) * warps_per_block + warp;
    if (warp_index >= int64_t(B) * NH * T) return;
    const RowCoordinates at = row_coordinates(warp_index, T, NH);
    const float scale = rsqrtf(static_cast<float>(head_size));

    float* query = shared + 2 * warp * head_size;
    float* dout_row = query + head_size;
    const float* query_global = packed_head(qkv, at.batch, at.row, 0, at.head, T, C, head_size);
    const float* dout_global = dout + (int64_t(at.batch) * T + at.row) * C + int64_t(at.head) * head_size;
    for (int d = lane; d < head_size; d += warp_size) {
        query[d] = query_global[d];
        dout_row[d] = dout_global[d];
    }
    __syncwarp();
    const float row_logsumexp = logsumexp[at.statistic_index], row_d = row_dot[at.statistic_index];

    float accumulator[values_per_lane] = {};
    for (int chunk = 0; chunk <= at.row; chunk += warp_size) {
        const int key = chunk + lane;
        float dscore = 0.0f;
        if (key <= at.row) {
            const float score =
                scale * dot_head(query, packed_head(qkv, at.batch, key, 1, at.head, T, C, head_size), head_size);
            const float probability = expf(score - row_logsumexp);
            const float dprobability =
                dot_head(dout_row, packed_head(qkv, at.batch, key, 2, at.head, T, C, head_size), head_size);
            dscore = probability * (dprobability - row_d);
        }
        const int valid_keys = min(warp_size, at.row - chunk + 1);
        for (int k = 0; k < valid_keys; ++k) {
            const float weight = __shfl_sync(full_warp_mask, dscore, k);
            const float* key_vector = packed_head(qkv, at.batch, chunk + k, 1, at.head, T, C, head_size);
            for (int i = 0; i < values_per_lane; ++i) {
                const int d = lane + i * warp_size;
                if (d < head_size) accumulator[i] += weight * key_vector[d];
            }
        }
    }
    float* dquery = packed_head(dqkv, at.batch, at.row, 0, at.head, T, C, head_size);
    for (int i = 0; i < values_per_lane; ++i) {
        const int d = lane + i * warp_size;
        if (d < head_size) dquery[d] += scale * accumulator[i];
    }
}

// dk_j = scale * sum_{i>=j} ds_ij q_i and dv_j = sum_{i>=j} p_ij dout_i, one warp per key row; lanes take
// queries, then head dimensions.
static __global__ void attention_backward_key_value_kernel(float* dqkv, const float* dout, const float* qkv,
                                                           const float* logsumexp, const float* row_dot, int B,
                                                           int T, int C, int NH) {
    ENGINE_DYNAMIC_SHARED(float, shared);
    const int head_size = C / NH, lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int64_t warp_index = int64_t(blockIdx.x) * warps_per_block + warp;
    if (warp_index >= int64_t(B) * NH * T) return;
    const RowCoordinates at = row_coordinates(warp_index, T, NH); // at.row is the key index here
    const float scale = rsqrtf(static_cast<float>(head_size));

    float* key = shared + 2 * warp * head_size;
    float* value = key + head_size;
    const float* key_global = packed_head(qkv, at.batch, at.row, 1, at.head, T, C, head_size);
    const float* value_global = packed_head(qkv, at.batch, at.row, 2, at.head, T, C, head_size);
    for (int d = lane; d < head_size; d += warp_size) {
        key[d] = key_global[d];
        value[d] = value_global[d];
    }
    __syncwarp();
    const int64_t statistics_base = at.statistic_index - at.row; // row 0 of this (batch, head)

    float dkey[values_per_lane] = {}, dvalue[values_per_lane] = {};
    for (int chunk = at.row; chunk < T; chunk += warp_size) {
        const int query_row = chunk + lane;
        float probability = 0.0f, dscore = 0.0f;
        if (query_row < T) {
            const float* dout_row = dout + (int64_t(at.batch) * T + query_row) * C + int64_t(at.head) * head_size;
            const float score = scale * dot_head(key, packed_head(qkv, at.batch, query_row, 0, at.head, T, C, head_size),
                                                 head_size);
            probability = expf(score - logsumexp[statistics_base + query_row]);
            const float dprobability = dot_head(value, dout_row, head_size);
            dscore = probability * (dprobability - row_dot[statistics_base + query_row]);
        }
        const int valid_queries = min(warp_size, T - chunk);
        for (int q = 0; q < valid_queries; ++q) {
            const float weight = __shfl_sync(full_warp_mask, probability, q);
            const float dweight = __shfl_sync(full_warp_mask, dscore, q);
            const float* query_vector = packed_head(qkv, at.batch, chunk + q, 0, at.head, T, C, head_size);
            const float* dout_row = dout + (int64_t(at.batch) * T + chunk + q) * C + int64_t(at.head) * head_size;
            for (int i = 0; i < values_per_lane; ++i) {
                const int d = lane + i * warp_size;
                if (d < head_size) {
                    dvalue[i] += weight * dout_row[d];
                    dkey[i] += dweight * query_vector[d];
                }
            }
        }
    }
    float* dkey_global = packed_head(dqkv, at.batch, at.row, 1, at.head, T, C, head_size);
    float* dvalue_global = packed_head(dqkv, at.batch, at.row, 2, at.head, T, C, head_size);
    for (int i = 0; i < values_per_lane; ++i) {
        const int d = lane + i * warp_size;
        if (d < head_size) {
            dkey_global[d] += scale * dkey[i];
            dvalue_global[d] += dvalue[i];
        }
    }
}

static void check_attention_shape(int C, int NH) {
    ENGINE_CHECK(NH > 0 && C % NH == 0, "attention: C=" << C << " is not a multiple of NH=" << NH);
    ENGINE_CHECK(C / NH <= attention_max_head_size,
                 "attention: head size " << C / NH << " exceeds the CUDA kernel's " << attention_max_head_size);
}

void attention_forward(float* out, float* logsumexp, const float* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
    check_attention_shape(C, NH);
    const int64_t rows = int64_t(B) * NH * T;
    if (rows == 0) return;
    const size_t shared_bytes = size_t(warps_per_block) * (C / NH) * sizeof(float);
    ENGINE_LAUNCH(attention_forward_kernel, ceil_div(rows, warps_per_block), block_size, shared_bytes, stream, out,
                  logsumexp, qkv, B, T, C, NH);
}

void attention_backward(float* dqkv, float* row_dot_workspace, const float* dout, const float* qkv, const float* out,
                        const float* logsumexp, int B, int T, int C, int NH, cudaStream_t stream) {
    check_attention_shape(C, NH);
    const int64_t rows = int64_t(B) * NH * T;
    if (rows == 0) return;
    const int grid = ceil_div(rows, warps_per_block);
    const size_t shared_bytes = size_t(2) * warps_per_block * (C / NH) * sizeof(float);
    ENGINE_LAUNCH(attention_row_dot_kernel, grid, block_size, 0, stream, row_dot_workspace, dout, out, B, T, C, NH);
    ENGINE_LAUNCH(attention_backward_query_kernel, grid, block_size, shared_bytes, stream, dqkv, dout, qkv, logsumexp,
                  row_dot_workspace, B, T, C, NH);
    ENGINE_LAUNCH(attention_backward_key_value_kernel, grid, block_size, shared_bytes, stream, dqkv, dout, qkv,
                  logsumexp, row_dot_workspace, B, T, C, NH);
}

} // namespace engine::kernels::cuda
