// CPU reference kernels of inference-time decoding with a key/value cache (conventions:
// kernels/cpu/cpu_kernels.h). Inference only: there is no backward kernel.
// Why: decoding appends new positions to a cache and attends from them alone, so nothing is saved and there is no
// backward; the f32/f64 sums follow attention_forward<double>'s order so that, at past = 0, decoding is the full
// forward (bitwise for f64).
// Where: engine/ops/attention_decode.cpp (declared in engine/ops/decode.h, used by nn/generation.cpp),
// kernels/cpu/attention_decode.cpp, kernels/cuda/attention_decode.cu; tests/test_generation.cpp (against the full
// forward), tests/cuda/test_attention_decode_kernels.cpp (CUDA against this).
#pragma once

#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels::cpu {

// Causal attention of Tnew new queries over a key/value cache. First appends the new keys and values of qkv
// at cache positions [past, past+Tnew), then computes, for the new query at position past+t, softmax(q·kᵀ /
// sqrt(HS)) · v over the cached keys 0..past+t: attention_forward's scale and causal rule. f32/f64 compute in
// double in attention_forward's order (scores by ascending key, the maximum, the exponentials, the sum, then
// P·V), so with past = 0 the output is bitwise attention_forward's. bf16 computes in f32 in that order and
// rounds once on store.
template <typename Scalar>
void attention_decode(Scalar* out,         // (B,Tnew,C)
                      Scalar* key_cache,   // (B,NH,max_T,HS): positions [past, past+Tnew) written
                      Scalar* value_cache, // (B,NH,max_T,HS): positions [past, past+Tnew) written
                      const Scalar* qkv,   // (B,Tnew,3C): q, k, v of the new positions
                      int B, int Tnew, int past, int max_T, int C, int NH);

} // namespace engine::kernels::cpu
