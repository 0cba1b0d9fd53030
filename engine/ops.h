// The differentiable ops. Each records one node on the tape when grad mode is on; each checks its inputs
// (shape, dtype, device, ranges) and throws EngineError naming the op and shapes before touching memory.
#pragma once

#include "engine/tensor.h"

namespace engine {

inline constexpr int default_ignore_index = -100;

// tokens (B,T) i32, token_table (V,C), position_table (max_T,C) -> (B,T,C)
Tensor embedding(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table);
// input (...,in) · weight (in,out) + bias (out) -> (...,out). The weight is stored (in, out), the layout of
// Hugging Face GPT-2's Conv1D, so checkpoints load without a transpose. bias may be undefined.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
// a (...,K) · b, where b is (K,N), or (N,K) with transpose_b (the tied LM head: x · wteᵀ).
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_b = false);
// over the last dimension, eps 1e-5; saves mean and rstd
Tensor layernorm(const Tensor& input, const Tensor& weight, const Tensor& bias);
Tensor gelu(const Tensor& input); // tanh approximation
Tensor add(const Tensor& a, const Tensor& b); // residual add, same shapes
// qkv (B,T,3C) -> (B,T,C); causal; saves logsumexp (B,NH,T), recomputes probabilities in backward
Tensor attention(const Tensor& qkv, int num_heads);
// Draws its mask from the engine RNG stream (engine/random.h); identity when p == 0 or !training.
Tensor dropout(const Tensor& input, float p, bool training = true);

enum class Reduction { none, sum, mean };
// logits (N,V) or (B,T,V); targets of the leading shape, i32, in [0,V) or ignore_index.
// none: per-target losses (0 where ignored); sum: their sum; mean: sum / non-ignored count (0 if none).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::mean,
                     int ignore_index = default_ignore_index);
Tensor sum(const Tensor& input);                 // -> (1)
Tensor multiply(const Tensor& input, double factor); // input * factor

} // namespace engine
