// The differentiable ops. Each records one node on the tape when grad mode is on; each checks its inputs
// (shape, dtype, device, ranges) and throws EngineError naming the op and shapes before touching memory.
#pragma once

#include "engine/tensor.h"

namespace engine {

inline constexpr int default_ignore_index = -100;

// tokens (B,T) i32, token_table (V,C), position_table (max_T,C) -> (B,T,C): token (b,t) adds position row t, or
// positions[b,t] for packed documents (positions (B,T) i32 as check_document_positions states, else undefined).
Tensor embedding(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                 const Tensor& positions = Tensor());
// tokens (B,T) i32, token_table (V,C) -> (B,T,C): the token rows alone (Llama: positions come from rope), with
// the same checks and the same deterministic backward.
Tensor embedding(const Tensor& tokens, const Tensor& token_table);
// input (...,in) · weight (in,out) + bias (out) -> (...,out). The weight is stored (in, out), the layout of
// Hugging Face GPT-2's Conv1D, so checkpoints load without a transpose. bias may be undefined.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
// a (...,K) · b, where b is (K,N), or (N,K) with transpose_b (the tied LM head: x · wteᵀ).
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_b = false);
// over the last dimension, eps 1e-5; saves mean and rstd
Tensor layernorm(const Tensor& input, const Tensor& weight, const Tensor& bias);
Tensor gelu(const Tensor& input); // tanh approximation
// qkv (B,T,3C) -> (B,T,C); causal; saves logsumexp (B,NH,T), recomputes probabilities in backward
Tensor attention(const Tensor& qkv, int num_heads);
// Grouped-query attention: qkv (B,T,(NH+2*KVH)*D) packs NH query heads, then KVH key heads, then KVH value heads
// per token; query head h reads kv head h / (NH/KVH) (Hugging Face repeat_kv, never materialised). -> (B,T,NH*D);
// KVH must divide NH; KVH == NH is attention(qkv, num_heads).
// positions (B,T) i32 on qkv's device, or undefined: packed documents, causal within each document only (query t
// attends keys t - positions[b,t] .. t; check_document_positions states the layout). No (T,T) mask exists.
Tensor attention(const Tensor& qkv, int num_heads, int num_kv_heads, const Tensor& positions = Tensor());
// Packed documents: positions (batch, time) i32 on `device`, each row 0 at a document's first token and counting up
// by one inside it (so row b's first is 0), every value below `limit` (the model's position tables). Throws,
// naming `op`, for any other shape, dtype, device or content. Reads the values on the host: free for tensors the
// trainer uploaded (they carry their host copy), one device read otherwise.
void check_document_positions(const char* op, const Tensor& positions, int64_t batch, int64_t time, Device device,
                              int64_t limit);
// Draws its mask from the engine RNG stream (engine/random.h); identity when p == 0 or !training.
Tensor dropout(const Tensor& input, float p, bool training = true);

enum class Reduction { none, sum, mean };
// logits (N,V) or (B,T,V); targets of the leading shape, i32, in [0,V) or ignore_index.
// none: per-target losses (0 where ignored); sum: their sum; mean: sum / non-ignored count (0 if none).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::mean,
                     int ignore_index = default_ignore_index);
// The fused classifier, opt-in because it DESTROYS the logits: cross_entropy with reduction sum or mean
// whose forward also writes d(loss)/d(logits) = reduction_scale · expected_output_gradient · (softmax −
// onehot) over `logits` in place (0 in ignored rows), in the kernel that computes the loss. No (N,V)
// gradient buffer is ever allocated: backward hands the logits' storage to the walk as their gradient.
//   expected_output_gradient: the gradient the caller's graph will bring to this op's output, e.g. 1/items
//     for multiply(loss, 1/items) → backward. Any other value still gives the right gradient (up to one more rounding): backward
//     multiplies by dout / expected on the device (no pass when the ratio is exactly 1). Finite, non-zero.
//   After the call the logits hold the gradient, not logits: read nothing from them (and save them in no
//   other op whose backward reads them, e.g. a second cross_entropy). Consumers whose backward does not
//   read the logits (multiply, sum, add) may share them: their gradients are added.
//   Under NoGradGuard, or when the logits do not require grad, nothing is overwritten: the result is
//   cross_entropy's.
//   vocabulary: the classes, the first columns of the logits' last dimension (0: all of them). The others
//     are padding (GPT's vocabulary padded to a multiple of 128): outside the softmax, gradient 0.
Tensor cross_entropy_in_place(const Tensor& logits, const Tensor& targets, Reduction reduction,
                              double expected_output_gradient = 1.0, int ignore_index = default_ignore_index,
                              int vocabulary = 0);
// The streaming LM head: cross_entropy_in_place(matmul(hidden, weight, /*transpose_b=*/true), targets, ...)
// without the (N,Vp) logits. hidden (...,C), weight (Vp,C) (the head's rows: GPT-2's tied, padded token table,
// Llama's lm_head or tied embed_tokens), targets of hidden's leading shape. The rows go through in chunks of
// chunk_rows (the last may be shorter): a chunk's logits (chunk,Vp) are made, reduced to its losses, turned
// into their gradient in place (the fused classifier) and used at once for the chunk's rows of d(hidden) and
// its share of d(weight); the next chunk reuses the buffer. The loss is the per-row losses summed in row order
// (bitwise the unchunked head's); d(weight) adds up in f32 (bf16 operands) chunk after chunk in row order, so
// every run gives the same bits, and with one chunk (chunk_rows >= N) bitwise the unchunked head's gradients.
//   The gradients are computed in forward, at expected_output_gradient (as cross_entropy_in_place's): d(hidden)
//   is kept for backward, and d(weight) is ADDED INTO THE WEIGHT'S GRADIENT BUFFER during the forward (a leaf's
//   persistent buffer; a weight that is no leaf gets one of its own, added in backward). So a forward in grad
//   mode must be followed by its backward, or the gradients zeroed: a loss dropped without backward leaves its
//   head gradient behind. Backward bringing another upstream gradient than promised is still exact (up to
//   rounding): d(hidden) is rescaled and the weight gets the chunks again with the difference (one more head
//   forward); it reads the upstream gradient on the host (on CUDA one 4-byte copy).
//   Under NoGradGuard, or when neither input requires grad: the loss alone, chunked, over the V real columns.
//   vocabulary: the classes, the first rows of the weight (0: all); the rest are padding, gradient 0.
//   chunk_rows >= 1; reduction sum or mean.
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets, Reduction reduction,
                            int64_t chunk_rows, double expected_output_gradient = 1.0,
                            int ignore_index = default_ignore_index, int vocabulary = 0);
// (...,N) -> (...,count): a copy of the first count columns; backward adds into them, the rest get 0.
Tensor first_columns(const Tensor& input, int64_t count);
// -> (1), accumulated in double. In compute_dtype(input): the sum of a bf16 tensor is f32 (a loss-like scalar
// keeps its bits; the bf16 input's gradient is rounded once per element).
Tensor sum(const Tensor& input);
Tensor multiply(const Tensor& input, double factor); // input * factor, in input's dtype (bf16: rounded once)
// input in another floating dtype (f32, f64, bf16; to bf16: round to nearest even). Differentiable: the
// gradient converts back.
Tensor cast(const Tensor& input, DType dtype);
// Non-differentiable: writes input, converted, into out (same element count and device).
void convert_into(const Tensor& out, const Tensor& input);
// The same over raw ranges of `count` elements on one device (ZeRO-3's owners rounding their part of a master into
// the working copy they broadcast): the kernels convert_into runs, so the same rounding.
void convert_elements(void* out, DType out_dtype, const void* input, DType input_dtype, int64_t count, Device device);

} // namespace engine

// The general ops for people's own models, one header per family (docs/GUIDE.md).
#include "engine/ops/pointwise.h"  // relu, silu, tanh, sigmoid, exp, log; add, sub, mul, div with broadcasting
#include "engine/ops/reductions.h" // softmax, log_softmax; sum, mean, max over a dimension; mse_loss; rms_norm
#include "engine/ops/layout.h"     // permute, transpose, view, slice, concat; batched matmul with transposes
#include "engine/ops/decode.h"     // attention_decode, embedding_at: inference with a key/value cache
#include "engine/ops/llama.h"      // rope with rope_tables, swiglu: the Llama family's own ops
#include "engine/ops/nf4.h"        // NF4 weights and nf4_linear: QLoRA's 4-bit frozen base
