// What the CPU attention kernels of every storage type share: where a head's columns sit in the packed qkv row,
// how (batch, head) blocks group into parallel_for chunks, and the bf16 kernels (attention_bf16_forward.cpp,
// attention_bf16_backward.cpp, the twins of the CUDA bf16 files) that attention_forward/backward<bfloat16> call.
#pragma once

#include <cstdint>

#include "base/bfloat16.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

// Where a head's columns start in the packed (NH + 2*KVH heads) qkv row, and how long that row is. Query head h
// reads kv head h / (NH / KVH).
struct PackedQkv {
    int C, NH, KVH, head_size;
    int64_t row() const { return C + 2 * int64_t(KVH) * head_size; }
    int64_t query(int h) const { return int64_t(h) * head_size; }
    int64_t key(int h) const { return C + int64_t(h / (NH / KVH)) * head_size; } // h: a query head
    int64_t value(int h) const { return C + int64_t(KVH + h / (NH / KVH)) * head_size; }
};

// (batch, head) blocks are independent; a block of `query_heads_per_block` heads is about
// T*(T+1)/2*head_size multiply-adds per head, each ~1 ns on one core, so chunks group small blocks up to
// cheap_elements_per_chunk of them (one block each at T = 64, head size 32).
inline int64_t attention_blocks_per_chunk(int T, int head_size, int query_heads_per_block) {
    return items_per_chunk(int64_t(T) * (T + 1) / 2 * head_size * query_heads_per_block, cheap_elements_per_chunk);
}

// The first key query t may attend: its document's first token (cpu_kernels.h), 0 without positions. `row_positions`
// is the batch's (T) row of positions, or null.
inline int document_start(const int32_t* row_positions, int t) { return row_positions ? t - row_positions[t] : 0; }
inline const int32_t* batch_positions(const int32_t* positions, int b, int T) {
    return positions ? positions + int64_t(b) * T : nullptr;
}

// attention_forward<bfloat16> and attention_backward<bfloat16> (cpu_kernels.h has their contract).
void attention_forward_bf16(bfloat16* out, float* logsumexp, const bfloat16* qkv, const int32_t* positions, int B,
                            int T, int C, int NH, int KVH);
void attention_backward_bf16(bfloat16* dqkv, const bfloat16* dout, const bfloat16* qkv, const bfloat16* out,
                             const float* logsumexp, const int32_t* positions, int B, int T, int C, int NH, int KVH);

} // namespace engine::kernels::cpu
