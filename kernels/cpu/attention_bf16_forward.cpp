// The bf16 causal grouped-query attention forward, attention_forward<bfloat16>: the reference for the CUDA twin
// kernels/cuda/attention_bf16_forward.cu. It follows that kernel's online softmax step by step (key tiles of
// attention_bf16_key_tile, P rounded to bf16 before P·V, f32 statistics), so that its rounding points are the
// GPU's and only the order of f32 sums differs. With positions (packed documents) a row's keys start at its
// document's first token; the tiles stay aligned from key 0 and a tile without any of the row's keys is skipped.
#include "kernels/cpu/attention_heads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace engine::kernels::cpu {

namespace {

// One (batch, query head h, query t) row: scores in f32, per key tile the running maximum, the probabilities
// exp(x - max) rounded to bf16 for the product with V (as FlashAttention's bf16 P), the running sum of the
// unrounded ones (f32 statistics), and the output scaled by 1/sum and rounded once.
void attention_row_bf16(bfloat16* out_head, float* logsumexp, const bfloat16* batch_qkv, int t, int h, int start,
                        const PackedQkv& packed, std::vector<float>& accumulator, std::vector<float>& scores) {
    const int head_size = packed.head_size;
    const int64_t qkv_row = packed.row();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
    const int64_t key_offset = packed.key(h), value_offset = packed.value(h);
    const bfloat16* query = batch_qkv + t * qkv_row + packed.query(h);
    float running_max = -std::numeric_limits<float>::infinity(), running_sum = 0.0f;
    std::fill(accumulator.begin(), accumulator.end(), 0.0f);
    // Keys start..t (causal within the document), in the tiles that hold them.
    for (int tile_key = start / attention_bf16_key_tile * attention_bf16_key_tile; tile_key <= t;
         tile_key += attention_bf16_key_tile) {
        const int first_key = std::max(tile_key, start);
        const int last_key = std::min(t, tile_key + attention_bf16_key_tile - 1);
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int t2 = first_key; t2 <= last_key; ++t2) {
            const bfloat16* key = batch_qkv + t2 * qkv_row + key_offset;
            float dot = 0.0f;
            for (int d = 0; d < head_size; ++d) dot += to_float(query[d]) * to_float(key[d]);
            scores[t2 - first_key] = dot * scale;
            tile_max = std::max(tile_max, scores[t2 - first_key]);
        }
        const float new_max = std::max(running_max, tile_max);
        const float correction = std::exp(running_max - new_max); // 0 on the first tile
        float sum = 0.0f;
        for (float& value : accumulator) value *= correction;
        for (int t2 = first_key; t2 <= last_key; ++t2) {
            const float probability = std::exp(scores[t2 - first_key] - new_max);
            sum += probability;
            const float rounded = to_float(to_bfloat16(probability)); // P in bf16 for P·V
            const bfloat16* value = batch_qkv + t2 * qkv_row + value_offset;
            for (int d = 0; d < head_size; ++d) accumulator[d] += rounded * to_float(value[d]);
        }
        running_sum = running_sum * correction + sum;
        running_max = new_max;
    }
    const float inverse_sum = 1.0f / running_sum;
    for (int d = 0; d < head_size; ++d) out_head[d] = to_bfloat16(accumulator[d] * inverse_sum);
    *logsumexp = running_max + std::log(running_sum);
}

} // namespace

void attention_forward_bf16(bfloat16* out, float* logsumexp, const bfloat16* qkv, const int32_t* positions, int B,
                            int T, int C, int NH, int KVH) {
    const PackedQkv packed{C, NH, KVH, C / NH};
    const int head_size = packed.head_size;
    const int64_t qkv_row = packed.row();
    parallel_for(int64_t(B) * NH, attention_blocks_per_chunk(T, head_size, 1), [&](int64_t first, int64_t end) {
        std::vector<float> accumulator(static_cast<size_t>(head_size)), scores(attention_bf16_key_tile);
        for (int64_t block = first; block < end; ++block) {
            const int b = int(block / NH), h = int(block % NH);
            const bfloat16* batch_qkv = qkv + static_cast<int64_t>(b) * T * qkv_row;
            const int32_t* row_positions = batch_positions(positions, b, T);
            for (int t = 0; t < T; ++t) {
                attention_row_bf16(out + (static_cast<int64_t>(b) * T + t) * C + int64_t(h) * head_size,
                                   logsumexp + (static_cast<int64_t>(b) * NH + h) * T + t, batch_qkv, t, h,
                                   document_start(row_positions, t), packed, accumulator, scores);
            }
        }
    });
}

} // namespace engine::kernels::cpu
