// The bf16 causal grouped-query attention backward, attention_backward<bfloat16>: the reference for the CUDA twin
// kernels/cuda/attention_bf16_backward.cu. f32 arithmetic, P and dS rounded to bf16 before their products (as the
// tensor-core kernel's operands), gradients summed in f32 (dK and dV of a kv head over all its query heads) and
// added into dqkv with one rounding each. With positions (packed documents) a row's keys start at its document's
// first token.
#include "kernels/cpu/attention_heads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace engine::kernels::cpu {

namespace {

// Query head h of one batch in the bf16 backward: its dQ (T, head_size) f32 sum, zeroed here and added into dqkv
// with one rounding; its share of dK and dV added into the kv head's f32 sums, which the caller rounds.
void attention_head_backward_bf16(bfloat16* batch_dqkv, const bfloat16* dout, const bfloat16* batch_qkv,
                                  const bfloat16* out, const float* logsumexp, const int32_t* row_positions, int b,
                                  int h, int T, const PackedQkv& packed, std::vector<float>& dquery,
                                  std::vector<float>& dkey, std::vector<float>& dvalue) {
    const int head_size = packed.head_size, C = packed.C;
    const int64_t qkv_row = packed.row(), head_offset = packed.query(h);
    const int64_t key_offset = packed.key(h), value_offset = packed.value(h);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
    std::fill(dquery.begin(), dquery.end(), 0.0f);
    auto q = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + head_offset + d]); };
    auto k = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + key_offset + d]); };
    auto v = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + value_offset + d]); };
    for (int t = 0; t < T; ++t) {
        const int64_t out_offset = (static_cast<int64_t>(b) * T + t) * C + head_offset;
        const float row_logsumexp = logsumexp[(static_cast<int64_t>(b) * packed.NH + h) * T + t];
        float row_delta = 0.0f; // D_t = dout_t . out_t
        for (int d = 0; d < head_size; ++d) row_delta += to_float(dout[out_offset + d]) * to_float(out[out_offset + d]);
        for (int t2 = document_start(row_positions, t); t2 <= t; ++t2) {
            float dot = 0.0f, dprobability = 0.0f;
            for (int d = 0; d < head_size; ++d) {
                dot += q(t, d) * k(t2, d);
                dprobability += to_float(dout[out_offset + d]) * v(t2, d);
            }
            const float probability = std::exp(dot * scale - row_logsumexp);
            const float dscore = scale * probability * (dprobability - row_delta);
            const float probability_bf16 = to_float(to_bfloat16(probability)), dscore_bf16 = to_float(to_bfloat16(dscore));
            for (int d = 0; d < head_size; ++d) {
                dquery[size_t(t) * head_size + d] += dscore_bf16 * k(t2, d);
                dkey[size_t(t2) * head_size + d] += dscore_bf16 * q(t, d);
                dvalue[size_t(t2) * head_size + d] += probability_bf16 * to_float(dout[out_offset + d]);
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        bfloat16* destination = batch_dqkv + t * qkv_row + head_offset;
        for (int d = 0; d < head_size; ++d)
            destination[d] = to_bfloat16(to_float(destination[d]) + dquery[size_t(t) * head_size + d]);
    }
}

// Adds a kv head's f32 dK or dV sums (T, head_size) into dqkv at `offset`, one rounding each.
void add_rounded(bfloat16* batch_dqkv, const std::vector<float>& sums, int64_t offset, int T, int head_size,
                 int64_t qkv_row) {
    for (int t = 0; t < T; ++t) {
        bfloat16* destination = batch_dqkv + t * qkv_row + offset;
        for (int d = 0; d < head_size; ++d)
            destination[d] = to_bfloat16(to_float(destination[d]) + sums[size_t(t) * head_size + d]);
    }
}

} // namespace

void attention_backward_bf16(bfloat16* dqkv, const bfloat16* dout, const bfloat16* qkv, const bfloat16* out,
                             const float* logsumexp, const int32_t* positions, int B, int T, int C, int NH, int KVH) {
    const PackedQkv packed{C, NH, KVH, C / NH};
    const int head_size = C / NH, group = NH / KVH;
    const int64_t qkv_row = packed.row();
    // Per (batch, kv head) block, as attention_backward's other storage types (attention_backward.cpp).
    const int64_t blocks_per_chunk = attention_blocks_per_chunk(T, head_size, group);
    const size_t head_elements = size_t(T) * head_size;
    parallel_for(int64_t(B) * KVH, blocks_per_chunk, [&](int64_t first, int64_t end) {
        std::vector<float> dquery(head_elements), dkey(head_elements), dvalue(head_elements); // (T, head_size)
        for (int64_t block = first; block < end; ++block) {
            const int b = int(block / KVH), kv_head = int(block % KVH);
            bfloat16* batch_dqkv = dqkv + int64_t(b) * T * qkv_row;
            // The group's query heads in ascending order, as the CUDA kernel's block owning the key tile.
            std::fill(dkey.begin(), dkey.end(), 0.0f);
            std::fill(dvalue.begin(), dvalue.end(), 0.0f);
            for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
                attention_head_backward_bf16(batch_dqkv, dout, qkv + int64_t(b) * T * qkv_row, out, logsumexp,
                                             batch_positions(positions, b, T), b, h, T, packed, dquery, dkey, dvalue);
            }
            const int first_head = kv_head * group;
            add_rounded(batch_dqkv, dkey, packed.key(first_head), T, head_size, qkv_row);
            add_rounded(batch_dqkv, dvalue, packed.value(first_head), T, head_size, qkv_row);
        }
    });
}

} // namespace engine::kernels::cpu
