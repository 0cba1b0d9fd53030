// Inference-only ops of cached decoding (nn/generation.h): no backward. Each refuses to run where grad mode is
// on and an input requires grad, so a forgotten NoGradGuard is an error rather than a silently missing node.
#pragma once

#include "engine/tensor.h"

namespace engine {

// Appends the new keys and values of qkv (B,Tnew,3C) to the caches (B,NH,max_T,HS), HS = C/NH, at positions
// [past, past+Tnew), and returns (B,Tnew,C): the causal attention of the new queries over cached keys 0..past+t,
// with attention()'s scale 1/sqrt(HS). With past = 0 and an empty cache it equals attention(qkv, NH).
// The caches are written in place; all three tensors share a dtype and a device.
Tensor attention_decode(const Tensor& qkv, const Tensor& key_cache, const Tensor& value_cache, int past,
                        int num_heads);
// tokens (B,T) i32 at positions [first_position, first_position+T): token_table[tokens] +
// position_table[first_position + t] -> (B,T,C). embedding() is the case first_position = 0.
Tensor embedding_at(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                    int first_position);

namespace detail {
// Throws naming op unless the call would record nothing: grad mode off, or `input` needs no gradient.
void require_inference(const char* op, const Tensor& input);
} // namespace detail

} // namespace engine
