// CPU reference kernels: the specification every CUDA twin is tested against.
//
// Why they are built this way: every result is checked against these, so each is plain loops in an order its
// file states (GEMM through CBLAS; f32 attention through sgemm per block, attention_panels.h). f64 is what the
// float64 finite-difference gradchecks differentiate. Row statistics and long sums (layernorm's mean and
// variance, in lane_sums.h's eight fixed chains; softmax's, the reductions' and bias's column sums) run in
// double, where the CUDA twins mostly sum in float: the reference's own error stays the smaller. parallel.h cuts
// the work into chunks whose size depends on the shape, never on the thread count, so a result is bitwise the
// same for any OMP_NUM_THREADS.
// Where one op lives, layernorm for instance: engine/ops/layernorm.cpp checks shapes, dispatches and records
// the backward; kernels/cpu/layernorm.cpp here, kernels/cuda/layernorm.cu its twin; tests/test_ops_gradcheck.cpp
// (f64 against finite differences), tests/test_bf16_layer_ops.cpp (bf16 against f32),
// tests/test_cpu_threads.cpp (thread counts), tests/cuda/test_reduction_kernels.cpp (CUDA against this).
//
// Conventions (shared with kernels/cuda/cuda_kernels.h):
// - Outputs first, `d`-prefixed gradients, inputs, then dimensions last.
// - Row-major, contiguous buffers; shape comments give the layout.
// - Every backward kernel ACCUMULATES (`+=`) into its gradient outputs. The autograd engine hands it
//   either a zeroed buffer or a persistent parameter-gradient buffer, so gradient accumulation across
//   micro-batches and tensors used twice (the residual stream) both come out right with no special case.
// - Kernels know no tensor, no tape and no error policy beyond their preconditions: shape and range checks
//   happen in the engine's op layer before a kernel runs, so a kernel never sees bad input.
// - Templated on the storage type: float for training, double for float64 gradient checks, bfloat16 for mixed
//   precision. A bf16 kernel computes in Compute<Scalar> (float) and rounds once on each store (widen/narrow,
//   base/bfloat16.h); its statistics (mean, rstd, logsumexp, losses) and its parameter gradients are
//   Compute<Scalar>, which is Scalar itself for float and double.
#pragma once

#include <cstdint>

#include "base/bfloat16.h"
#include "kernels/common/adamw_tensor.h"

namespace engine::kernels::cpu {

// ---- embedding: token table plus learned position table ----
// out[b,t,:] = token_table[tokens[b,t],:] + position_table[p,:], p = t, or positions[b,t] for packed documents
// (null otherwise); a null position_table (Llama) gives the token rows alone, and then dposition_table must be
// null too.
template <typename Scalar>
void embedding_forward(Scalar* out,                  // (B,T,C)
                       const int32_t* tokens,        // (B,T), each in [0,V)
                       const Scalar* token_table,    // (V,C)
                       const Scalar* position_table, // (max_T,C), max_T >= T
                       const int32_t* positions,     // (B,T) or null
                       int B, int T, int C);
// The table gradients are Compute<Scalar> (parameter gradients: f32 for bf16 tables); dout is Scalar.
template <typename Scalar>
void embedding_backward(Compute<Scalar>* dtoken_table,    // (V,C) +=
                        Compute<Scalar>* dposition_table, // (max_T,C) +=
                        const Scalar* dout,               // (B,T,C)
                        const int32_t* tokens,            // (B,T)
                        const int32_t* positions,         // (B,T) or null
                        int B, int T, int C);

// ---- gemm through BLAS, row-major ----
// c(m,n) = alpha * op(a)(m,k) * op(b)(k,n) + beta * c(m,n); op(x) = x or x^T.
// a is stored (m,k) or, transposed, (k,m); b is (k,n) or, transposed, (n,k).
// bf16 a and b multiply in f32 (products exact, f32 sums); c is bf16, rounded once on store (beta·c included:
// c = round(alpha·ab + beta·c)), or f32 (Out = Compute<Scalar>: parameter gradients accumulating in f32).
template <typename Scalar, typename Out>
void gemm(Out* c, const Scalar* a, const Scalar* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          Compute<Scalar> alpha, Compute<Scalar> beta);
// c(m,n) = op(a)·op(b) + bias (n) on every row: the twin of CUDA's gemm_bias. f32/f64: gemm then
// bias_add_forward; bf16: the f32 product plus the bias, rounded once (as cuBLASLt's bias epilogue).
template <typename Scalar>
void gemm_bias(Scalar* c, const Scalar* a, const Scalar* b, const Scalar* bias, int m, int n, int k, bool transpose_a,
               bool transpose_b);

// ---- bias ----
template <typename Scalar>
void bias_add_forward(Scalar* out,        // (N,OC) +=  bias broadcast over rows
                      const Scalar* bias, // (OC)
                      int N, int OC);
template <typename Scalar>
void bias_backward(Compute<Scalar>* dbias, // (OC) +=  column sums of dout, each summed in double
                   const Scalar* dout,     // (N,OC)
                   int N, int OC);

// ---- layernorm over the last dimension, eps = 1e-5 ----
inline constexpr double layernorm_eps = 1e-5;
// Statistics in double, stored as Compute<Scalar> (f32 for bf16); out rounds once per element.
template <typename Scalar>
void layernorm_forward(Scalar* out,           // (N,C)
                       Compute<Scalar>* mean, // (N)
                       Compute<Scalar>* rstd, // (N)  1/sqrt(var + eps), biased variance
                       const Scalar* inp,    // (N,C)
                       const Scalar* weight, // (C)
                       const Scalar* bias,   // (C)
                       int N, int C);
template <typename Scalar>
void layernorm_backward(Scalar* dinp,             // (N,C) +=
                        Compute<Scalar>* dweight, // (C) +=
                        Compute<Scalar>* dbias,   // (C) +=
                        const Scalar* dout, const Scalar* inp, const Scalar* weight, const Compute<Scalar>* mean,
                        const Compute<Scalar>* rstd, int N, int C);

// ---- GELU, tanh approximation (GPT-2) ----
template <typename Scalar>
void gelu_forward(Scalar* out, const Scalar* inp, int64_t N);
template <typename Scalar>
// dinp += GELU'(inp)·dout, or with accumulate false dinp = 0 + GELU'(inp)·dout (dinp unread: the write form for a
// fresh gradient buffer, bitwise the addition into zeros).
void gelu_backward(Scalar* dinp, // (N) += or =
                   const Scalar* dout, const Scalar* inp, int64_t N, bool accumulate);

// ---- residual add ----
template <typename Scalar>
void residual_forward(Scalar* out, const Scalar* a, const Scalar* b, int64_t N);
template <typename Scalar>
void residual_backward(Scalar* da, Scalar* db, // (N) += dout, either may be null
                       const Scalar* dout, int64_t N);

// ---- causal grouped-query self-attention ----
// qkv packs, per token, [q (C = NH*hs) | k (KVH*hs) | v (KVH*hs)], hs = C/NH: query head h owns columns
// [h*hs, (h+1)*hs) of q, kv head j those of k and v, and query head h reads kv head h / (NH/KVH) (Hugging
// Face's repeat_kv, without the repeat). KVH == NH is multi-head attention, KVH divides NH.
// out = softmax(q k^T / sqrt(hs) + causal mask) v. Forward saves only logsumexp, the O(T) per-head row
// statistic; backward recomputes the probabilities from q, k and logsumexp (no T x T matrix is kept).
// f64 (the specification) loops in double. Backward summation order: query heads ascending, then queries t
// ascending, then keys t2 <= t ascending; dK/dV of a kv head thus sum its query heads in ascending order, each term
// added into dqkv. f32 computes in float through sgemm per block (attention_panels.h): per query head ascending
// and panel of queries ascending, one product added into dqkv (dQ, dK, dV), the same whatever the thread counts.
// bf16: per kv head, f32 sums of dK/dV over its query heads in ascending order, one rounding into dqkv at the end;
// dQ per query head, one rounding.
// bf16: f32 arithmetic and f32 logsumexp; the forward's online softmax walks keys in tiles of
// attention_bf16_key_tile (the CUDA bf16 kernel's) and rounds exp(score - running max) to bf16 before P·V; the
// backward rounds P and dS = scale·P·(dP - D) to bf16 before their products, sums the gradients in f32 and adds
// each into dqkv with one rounding.
// Packed documents (positions not null): query t of batch b attends keys start..t only, start = t - positions[b,t],
// the first token of its document; positions (B,T) restart at 0 at each document and count up by one inside it
// (the op checks this: engine/ops/attention.cpp), so start never decreases along t. Null: one document per row.
// bf16 key tiles stay aligned at multiples of attention_bf16_key_tile from key 0; a tile holding none of a row's
// keys is skipped for that row.
inline constexpr int attention_bf16_key_tile = 64;
template <typename Scalar>
void attention_forward(Scalar* out,                // (B,T,C)
                       Compute<Scalar>* logsumexp, // (B,NH,T)
                       const Scalar* qkv,          // (B,T,C+2*KVH*C/NH)
                       const int32_t* positions,   // (B,T) or null
                       int B, int T, int C, int NH, int KVH);
template <typename Scalar>
void attention_backward(Scalar* dqkv,                     // (B,T,C+2*KVH*C/NH) +=
                        const Scalar* dout,               // (B,T,C)
                        const Scalar* qkv,                // (B,T,C+2*KVH*C/NH)
                        const Scalar* out,                // (B,T,C)
                        const Compute<Scalar>* logsumexp, // (B,NH,T)
                        const int32_t* positions,         // (B,T) or null
                        int B, int T, int C, int NH, int KVH);

// ---- dropout with a counter-based RNG (kernels/common/philox.h) ----
// Element i is kept iff uniform(seed, offset + i) >= p, and kept values are scaled by 1/(1-p).
// The mask is never stored: backward redraws it from the same (seed, offset). p == 0 is the identity.
template <typename Scalar>
void dropout_forward(Scalar* out, const Scalar* inp, float p, uint64_t seed, uint64_t offset, int64_t N);
template <typename Scalar>
void dropout_backward(Scalar* dinp, // (N) +=
                      const Scalar* dout, float p, uint64_t seed, uint64_t offset, int64_t N);

// ---- softmax cross-entropy over the last dimension ----
// losses[i] = logsumexp(logits[i,:]) - logits[i, targets[i]], or 0 when targets[i] == ignore_index.
template <typename Scalar>
void cross_entropy_forward(Compute<Scalar>* losses,    // (N), f32 for bf16 logits
                           const Scalar* logits,       // (N,V)
                           const int32_t* targets, // (N)
                           int N, int V, int ignore_index);
template <typename Scalar>
void cross_entropy_backward(Scalar* dlogits,             // (N,V) +=  (softmax - onehot) * dlosses[i]
                            const Compute<Scalar>* dlosses, // (N)
                            const Scalar* logits,        // (N,V)
                            const int32_t* targets, // (N); ignored rows get no gradient
                            int N, int V, int ignore_index);
// The fused classifier (llm.c's): the loss AND its gradient in one pass over each row, the gradient written
// IN PLACE over the logits, so no separate (N,V) dlogits buffer exists. Rows are padded_V apart; only the
// first V columns are classes (padded_V == V when unpadded). The other columns, and every column of an
// ignored row, are written 0. dloss is d(total)/d(losses[i]), the same for every row (sum or mean).
template <typename Scalar>
void cross_entropy_fused_forward(Compute<Scalar>* losses, // (N) as cross_entropy_forward
                                 Scalar* logits,         // (N,padded_V) in: logits; out: (softmax - onehot) * dloss
                                 const int32_t* targets, // (N)
                                 Compute<Scalar> dloss, int N, int V, int padded_V, int ignore_index);
// dlogits *= dout[0] / expected_dout, unless that ratio is exactly 1: the fused gradient was written for an
// upstream gradient of expected_dout, and this corrects it when backward brings another one. dout stays on
// the device (no host read), and the common case writes nothing.
template <typename Scalar>
void cross_entropy_fused_rescale(Scalar* dlogits,     // (count)
                                 const Compute<Scalar>* dout, // (1)
                                 Compute<Scalar> expected_dout, int64_t count);

// ---- the first `count` of `columns` columns of each of N rows (a padded vocabulary's real classes) ----
template <typename Scalar>
void first_columns_forward(Scalar* out,       // (N,count)
                           const Scalar* inp, // (N,columns)
                           int64_t N, int columns, int count);
template <typename Scalar>
void first_columns_backward(Scalar* dinp,       // (N,columns) += in the first count columns; the rest untouched
                            const Scalar* dout, // (N,count)
                            int64_t N, int columns, int count);

// ---- reductions ----
// The sum of a bf16 tensor is f32 (Compute<Scalar>): it is accumulated in double, and a loss-like scalar
// has no reason to lose 16 bits on store. Its gradient dout is therefore Compute<Scalar> too.
template <typename Scalar>
void sum_forward(Compute<Scalar>* out, // (1) = scale * sum(inp)
                 const Scalar* inp,    // (N)
                 int64_t N, Compute<Scalar> scale);
template <typename Scalar>
void sum_backward(Scalar* dinp,                // (N) += scale * dout[0]
                  const Compute<Scalar>* dout, // (1)
                  int64_t N, Compute<Scalar> scale);
// out[0] = sum(inp^2), accumulated in double.
template <typename Scalar>
void sum_of_squares(double* out, const Scalar* inp, int64_t N);
// out[0] = the sum of squares of every element of `tensor_count` tensors (the global gradient norm).
template <typename Scalar>
void sum_of_squares_list(double* out, const Scalar* const* tensors, const int64_t* counts, int tensor_count);

// ---- elementwise helpers ----
template <typename Scalar>
void fill(Scalar* x, Scalar value, int64_t N);
template <typename Scalar>
void scale(Scalar* x, Scalar alpha, int64_t N); // x *= alpha
// y += alpha * x, also across storage types (a bf16 gradient into an f32 buffer and back), computed in float
// when either side is bf16 and rounded once on store.
template <typename Scalar, typename Source = Scalar>
void axpy(Scalar* y, const Source* x, Compute<Scalar> alpha, int64_t N);

// ---- cast ----
// out = inp converted to To; to bf16 rounds to nearest even (from double through float).
template <typename To, typename From>
void convert(To* out, const From* inp, int64_t N);

// ---- optimizer updates ----
// AdamW with PyTorch semantics; grad is multiplied by grad_scale first (global-norm clipping).
//   p -= lr * weight_decay * p
//   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2
//   p -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
template <typename Scalar>
void adamw_update(Scalar* param, const Scalar* grad, Scalar* m, Scalar* v, int64_t N, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float bias_correction1, float bias_correction2,
                  float grad_scale);
// The same update over a list of tensors (each with its own weight decay), and the step's epilogue in the same
// pass: each updated value rounded into the tensor's bf16 working copy when it has one, and with zero_gradients
// its gradient zeroed. Bitwise adamw_update, then convert, then a zero fill, tensor by tensor.
template <typename Scalar>
void adamw_update_list(const AdamWTensor<Scalar>* tensors, int tensor_count, bool zero_gradients, float lr, float beta1,
                       float beta2, float eps, float bias_correction1, float bias_correction2, float grad_scale);
// SGD with momentum (PyTorch semantics, no dampening, no nesterov):
//   g = grad_scale * grad + weight_decay * p;  buf = momentum * buf + g;  p -= lr * buf
template <typename Scalar>
void sgd_update(Scalar* param, const Scalar* grad, Scalar* momentum_buffer, int64_t N, float lr, float momentum,
                float weight_decay, float grad_scale);

} // namespace engine::kernels::cpu

// The general ops' kernels, one header per family.
#include "kernels/cpu/pointwise_kernels.h"
#include "kernels/cpu/reduction_kernels.h"
#include "kernels/cpu/layout_kernels.h"
#include "kernels/cpu/decode_kernels.h"
