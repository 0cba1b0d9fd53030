// CUDA twins of kernels/cpu/decode_kernels.h (conventions: kernels/cuda/cuda_kernels.h). Inference only.
// Why a warp per (batch, head, new query): a decoding step brings few queries, so one warp walks its head's cache
// in key order with an online softmax, the query and its output in registers (up to 8 dimensions a lane), with
// no block barrier and no atomics. With few (batch, head) pairs it is bound by the per-key shuffle-and-exp chain
// rather than bandwidth; splitting the keys over warps (flash-decoding) is the known improvement. Map:
// kernels/cpu/decode_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"

namespace engine::kernels::cuda {

// The largest head size the decode kernel holds in registers (8 dimensions per lane).
inline constexpr int attention_decode_max_head_size = 256;
// Two launches: the append of the new keys and values, then one warp per (batch, head, new query) that
// walks the cached keys in ascending order (dot products reduced by warp shuffles, an online softmax, the
// weighted sum of V). Deterministic: a fixed order everywhere, no atomics. f32 compute.
void attention_decode(float* out, float* key_cache, float* value_cache, const float* qkv, int B, int Tnew, int past,
                      int max_T, int C, int NH, cudaStream_t stream);
void attention_decode(bfloat16* out, bfloat16* key_cache, bfloat16* value_cache, const bfloat16* qkv, int B,
                      int Tnew, int past, int max_T, int C, int NH, cudaStream_t stream);

} // namespace engine::kernels::cuda
