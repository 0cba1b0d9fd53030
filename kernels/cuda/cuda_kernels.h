// CUDA twins of the CPU reference kernels (kernels/cpu/cpu_kernels.h): same names, same argument order,
// plus a trailing stream. Storage is float, and for the layer kernels also bfloat16 (an overload per storage
// type, declared beside the float one): a bf16 kernel computes in float and rounds once on each store, at
// the same points as its CPU twin; its statistics (layernorm mean/rstd) and parameter gradients (embedding
// tables, layernorm dweight/dbias, dbias) are float, as are the partials of its reductions. The CPU header's conventions hold here too; in particular every
// backward kernel ACCUMULATES (+=) into its gradient outputs. Launchers are asynchronous on `stream` and
// allocate no memory themselves: a launcher that needs scratch takes it as a workspace argument right
// after its outputs, gemm takes the cuBLAS handle and gemm_bias the cuBLASLt handle with its workspace, so
// memory and handles stay the caller's business.
//
// Why they are built this way: GEMM and attention aside, a kernel here is bound by memory bandwidth, so most
// streaming ones move 128-bit packs (packs.cuh) when every pointer is 16-byte aligned, with the scalar path's
// per-element arithmetic. No kernel adds floats atomically: every sum has one owner and an order set by the
// shapes alone (a row: a warp's or a block's fixed shuffle tree; a parameter gradient: per-row-chunk partials,
// then column_sums.cuh's pass in chunk order), so results are bitwise the same run to run and under every
// schedule the emulator tries. bf16 kernels round once per store, at their CPU twin's points.
// Where one op lives, layernorm for instance: engine/ops/layernorm.cpp dispatches here on the compute stream
// and takes the partials' workspace from engine/cuda/scratch.h; kernels/cuda/layernorm.cu (with
// norm_passes.cuh) twins kernels/cpu/layernorm.cpp; tests/cuda/test_reduction_kernels.cpp and
// test_bf16_layer_kernels.cpp hold it to the CPU, on the emulated device too (scripts/emulated_cuda.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"
#include "kernels/common/adamw_tensor.h"
#include "kernels/cpu/token_groups.h"

namespace engine::kernels::cuda {

// ---- embedding (position_table and dposition_table null: the token lookup alone, Llama) ----
// positions (B,T) or null: packed documents, token (b,t) adding position row positions[b,t] in place of t.
void embedding_forward(float* out, const int32_t* tokens, const float* token_table, const float* position_table,
                       const int32_t* positions, int B, int T, int C, cudaStream_t stream);
void embedding_forward(bfloat16* out, const int32_t* tokens, const bfloat16* token_table,
                       const bfloat16* position_table, const int32_t* positions, int B, int T, int C,
                       cudaStream_t stream);
// The positions of a batch grouped by token, built on the host (kernels/cpu/token_groups.h, shared with the CPU twin).
using kernels::TokenGroups;
using kernels::group_positions_by_token;
// Deterministic, no float atomics: one warp per (distinct token, 128 channels) adds that token's dout rows in
// ascending position order, the CPU loop's order, so dtoken_table is bitwise the CPU twin's; the position
// table sums over the batch in order per (t, channel). token_groups: TokenGroups::packed on the device.
// position_groups: for packed documents, group_positions_by_token of the (B,T) positions on the device (their
// position_distinct values), summed as the token table's; null: rows t.
void embedding_backward(float* dtoken_table, float* dposition_table, const float* dout, const int32_t* token_groups,
                        int distinct, const int32_t* position_groups, int position_distinct, int B, int T, int C,
                        cudaStream_t stream);
void embedding_backward(float* dtoken_table, float* dposition_table, const bfloat16* dout, const int32_t* token_groups,
                        int distinct, const int32_t* position_groups, int position_distinct, int B, int T, int C,
                        cudaStream_t stream);

// ---- gemm (cuBLAS on `handle`, which it binds to `stream`; TF32 tensor cores when `tf32`) ----
void gemm(float* c, const float* a, const float* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream);
// bf16 operands on the bf16 tensor cores with f32 accumulation (tf32 is ignored): c bf16 is the f32 result
// alpha·ab + beta·c rounded once; c f32 (parameter gradients, beta 1) accumulates without any bf16 rounding.
void gemm(bfloat16* c, const bfloat16* a, const bfloat16* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream);
void gemm(float* c, const bfloat16* a, const bfloat16* b, int m, int n, int k, bool transpose_a, bool transpose_b,
          float alpha, float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream);
// c(m,n) = op(a)·op(b) + bias, bias (n) added to every row: one cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS,
// so the output is written once instead of written by the GEMM and then read and written by bias_add_forward.
// The twin of the CPU gemm (alpha 1, beta 0) followed by bias_add_forward. `workspace` (workspace_bytes of
// device memory, may be 0) must be used by nothing else until the GEMM has run; the chosen algorithm is cached
// per shape, flags, workspace size and operand alignment.
void gemm_bias(float* c, const float* a, const float* b, const float* bias, int m, int n, int k, bool transpose_a,
               bool transpose_b, bool tf32, cublasLtHandle_t handle, void* workspace, size_t workspace_bytes,
               cudaStream_t stream);
// bf16: a bf16 bias, the f32 product plus bias rounded once (the twin of the CPU gemm_bias<bfloat16>).
void gemm_bias(bfloat16* c, const bfloat16* a, const bfloat16* b, const bfloat16* bias, int m, int n, int k,
               bool transpose_a, bool transpose_b, bool tf32, cublasLtHandle_t handle, void* workspace,
               size_t workspace_bytes, cudaStream_t stream);

// ---- bias ----
void bias_add_forward(float* out, const float* bias, int N, int OC, cudaStream_t stream);
void bias_add_forward(bfloat16* out, const bfloat16* bias, int N, int OC, cudaStream_t stream);
// Two passes, deterministic: float partials per (row chunk, column), then each column's partials added in
// chunk order and accumulated into dbias once. partials_workspace: bias_backward_workspace_count(N, OC)
// floats of device memory, overwritten; it must stay untouched until the launched kernels have run.
int bias_backward_workspace_count(int N, int OC);
void bias_backward(float* dbias, float* partials_workspace, const float* dout, int N, int OC, cudaStream_t stream);
void bias_backward(float* dbias, float* partials_workspace, const bfloat16* dout, int N, int OC, cudaStream_t stream);

// ---- layernorm ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream);
void layernorm_forward(bfloat16* out, float* mean, float* rstd, const bfloat16* inp, const bfloat16* weight,
                       const bfloat16* bias, int N, int C, cudaStream_t stream);
// One row pass writes dinp and per-row-chunk float partials of dweight and dbias, a second adds each column's
// partials in chunk order into dweight/dbias: deterministic. partials_workspace:
// layernorm_backward_workspace_count(N, C) floats of device memory, overwritten; untouched until the kernels
// have run. C up to 29,056 (one warp's column sums in shared memory).
int layernorm_backward_workspace_count(int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, float* partials_workspace, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream);
void layernorm_backward(bfloat16* dinp, float* dweight, float* dbias, float* partials_workspace,
                        const bfloat16* dout, const bfloat16* inp, const bfloat16* weight, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream);

// ---- GELU ----
void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream);
// accumulate false: the write form (dinp not read), as the CPU twin's.
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t N, bool accumulate, cudaStream_t stream);
void gelu_forward(bfloat16* out, const bfloat16* inp, int64_t N, cudaStream_t stream);
void gelu_backward(bfloat16* dinp, const bfloat16* dout, const bfloat16* inp, int64_t N, bool accumulate,
                   cudaStream_t stream);

// ---- residual ----
void residual_forward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream);
void residual_backward(float* da, float* db, const float* dout, int64_t N, cudaStream_t stream);
void residual_forward(bfloat16* out, const bfloat16* a, const bfloat16* b, int64_t N, cudaStream_t stream);
void residual_backward(bfloat16* da, bfloat16* db, const bfloat16* dout, int64_t N, cudaStream_t stream);

// ---- attention: causal, grouped-query, head size C/NH at most attention_max_head_size ----
// qkv (B,T,C+2*KVH*C/NH) packs NH query heads, KVH key heads, KVH value heads (cpu_kernels.h); KVH divides NH,
// KVH == NH is multi-head attention. out, dout (B,T,C); logsumexp (B,NH,T).
// positions (B,T) int32 device memory, or null: packed documents without cross-attention. Query t of batch b
// attends exactly keys start..t, start = t - positions[b*T + t], its document's first token; null is plain
// causal attention (start 0, one document per row). The caller guarantees what the op checks on the host
// (engine/ops/attention.cpp): positions[b*T] == 0 and positions[b*T+t] is 0 or positions[b*T+t-1] + 1, so
// starts never decrease along t and every query sees at least itself. The kernels skip the key tiles no row of a
// block sees.
// Tensor cores (wmma m16n16k8): TF32 products when `tf32`, else 3xTF32 (each operand split into two TF32
// parts), as accurate as fp32. Deterministic (dK/dV of a kv head summed over its query heads in ascending
// order by the block that owns the key tile, no atomics); shared memory per block from the *_shared_bytes
// functions.
inline constexpr int attention_max_head_size = 256;
void attention_forward(float* out, float* logsumexp, const float* qkv, const int32_t* positions /* (B,T) or null */,
                       int B, int T, int C, int NH, int KVH, bool tf32, cudaStream_t stream);
// row_dot_workspace: B*NH*T floats of device memory for D_i = rowsum(dout * out), overwritten; it must stay
// untouched until the launched kernels have run.
void attention_backward(float* dqkv, float* row_dot_workspace /* (B,NH,T) */, const float* dout, const float* qkv,
                        const float* out, const float* logsumexp, const int32_t* positions /* (B,T) or null */, int B,
                        int T, int C, int NH, int KVH, bool tf32, cudaStream_t stream);
// bf16 (kernels/cuda/attention_bf16_*.cu): bf16 wmma 16x16x16 with f32 accumulators, the CPU bf16 reference's
// rounding points (P rounded to bf16 before P·V, key tiles of cpu::attention_bf16_key_tile, aligned at key 0 with
// or without documents; P and dS rounded before the backward's products); out and dqkv bf16, logsumexp and
// row_dot_workspace f32. `tf32` is ignored.
void attention_forward(bfloat16* out, float* logsumexp, const bfloat16* qkv,
                       const int32_t* positions /* (B,T) or null */, int B, int T, int C, int NH, int KVH, bool tf32,
                       cudaStream_t stream);
void attention_backward(bfloat16* dqkv, float* row_dot_workspace /* (B,NH,T) */, const bfloat16* dout,
                        const bfloat16* qkv, const bfloat16* out, const float* logsumexp,
                        const int32_t* positions /* (B,T) or null */, int B, int T, int C, int NH, int KVH, bool tf32,
                        cudaStream_t stream);
size_t attention_forward_shared_bytes(int head_size);
size_t attention_backward_shared_bytes(int head_size); // the larger of its two tiled kernels

// ---- dropout (masks bit-identical to the CPU twin) ----
void dropout_forward(float* out, const float* inp, float p, uint64_t seed, uint64_t offset, int64_t N,
                     cudaStream_t stream);
void dropout_backward(float* dinp, const float* dout, float p, uint64_t seed, uint64_t offset, int64_t N,
                      cudaStream_t stream);
void dropout_forward(bfloat16* out, const bfloat16* inp, float p, uint64_t seed, uint64_t offset, int64_t N,
                     cudaStream_t stream);
void dropout_backward(bfloat16* dinp, const bfloat16* dout, float p, uint64_t seed, uint64_t offset, int64_t N,
                      cudaStream_t stream);

// ---- cross-entropy ----
// T = float or bfloat16 (logits and their gradient); the losses, dlosses and dout stay f32.
template <typename T>
void cross_entropy_forward(float* losses, const T* logits, const int32_t* targets, int N, int V, int ignore_index,
                           cudaStream_t stream);
template <typename T>
void cross_entropy_backward(T* dlogits, const float* dlosses, const T* logits, const int32_t* targets, int N, int V,
                            int ignore_index, cudaStream_t stream);
// The fused classifier: one block per row, one read pass (online max and sum) and one write pass of the
// gradient over the logits; 128-bit accesses when f32, padded_V is a multiple of 4 and logits 16-byte aligned.
template <typename T>
void cross_entropy_fused_forward(float* losses, T* logits, const int32_t* targets, float dloss, int N, int V,
                                 int padded_V, int ignore_index, cudaStream_t stream);
// Reads dout on the device; every thread returns at once when dout[0] / expected_dout is exactly 1.
template <typename T>
void cross_entropy_fused_rescale(T* dlogits, const float* dout, float expected_dout, int64_t count,
                                 cudaStream_t stream);

// ---- the first `count` of `columns` columns of each row ----
void first_columns_forward(float* out, const float* inp, int64_t N, int columns, int count, cudaStream_t stream);
void first_columns_backward(float* dinp, const float* dout, int64_t N, int columns, int count, cudaStream_t stream);
void first_columns_forward(bfloat16* out, const bfloat16* inp, int64_t N, int columns, int count,
                           cudaStream_t stream);
void first_columns_backward(bfloat16* dinp, const bfloat16* dout, int64_t N, int columns, int count,
                            cudaStream_t stream);

// ---- reductions: deterministic two-stage (per-block partials in double, then one block) ----
// partials_workspace: reduction_workspace_count(N) doubles of device memory, overwritten; it must stay
// untouched until the launched kernels have run.
int reduction_workspace_count(int64_t N);
void sum_forward(float* out, double* partials_workspace, const float* inp, int64_t N, float scale,
                 cudaStream_t stream);
void sum_backward(float* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream);
// bf16 input: the sum (and so its gradient dout) is float, as on the CPU.
void sum_forward(float* out, double* partials_workspace, const bfloat16* inp, int64_t N, float scale,
                 cudaStream_t stream);
void sum_backward(bfloat16* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream);
// The sum of squares of one tensor or many (the global gradient norm) in the CPU kernel's association
// (kernels/common/sum_of_squares_order.h): bitwise the CPU's result. One thread per (chunk, lane), one
// ordered total per tensor_list_capacity tensors. `tensors` and `counts` are host arrays (the list travels as a
// kernel argument); out is device memory; chunks_workspace holds sum_of_squares_workspace_count doubles.
int64_t sum_of_squares_workspace_count(const int64_t* counts, int tensor_count);
void sum_of_squares(double* out, double* chunks_workspace, const float* inp, int64_t N, cudaStream_t stream);
inline constexpr int tensor_list_capacity = 128; // 128 pointers, counts and first chunks: 3 KB, under 4 KB
struct TensorList {
    const float* data[tensor_list_capacity];
    int64_t count[tensor_list_capacity];
    int64_t first_chunk[tensor_list_capacity]; // of this list's chunks
    int64_t chunks;                            // all of this list's
    int size;
    // What the launch reads, for the emulated device (emulator/launch.h), which sees no pointer inside a struct.
    template <typename Visit>
    void for_each_pointer(Visit visit) const {
        for (int tensor = 0; tensor < size; ++tensor) visit(data[tensor]);
    }
};
void sum_of_squares_list(double* out, double* chunks_workspace, const float* const* tensors, const int64_t* counts,
                         int tensor_count, cudaStream_t stream);

// ---- elementwise helpers (these, GELU, residual and the optimizer updates use 128-bit accesses when every
// pointer is 16-byte aligned, else scalar ones; the per-element arithmetic is the same either way) ----
void fill(float* x, float value, int64_t N, cudaStream_t stream);
void scale(float* x, float alpha, int64_t N, cudaStream_t stream);
// y += alpha * x; the typed form also across f32 and bf16 (float arithmetic, one rounding on store).
void axpy(float* y, const float* x, float alpha, int64_t N, cudaStream_t stream);
template <typename Scalar, typename Source>
void axpy(Scalar* y, const Source* x, float alpha, int64_t N, cudaStream_t stream);

// ---- cast ----
template <typename To, typename From>
void convert(To* out, const From* inp, int64_t N, cudaStream_t stream);

// ---- optimizer updates ----
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2,
                  float grad_scale, cudaStream_t stream);
// The list twin of kernels/cpu/adamw.cpp's: one launch per adamw_list_capacity tensors that hold elements (the
// list travels as a kernel argument), each block one tile of one tensor; bitwise adamw_update, then convert,
// then a zero fill, tensor by tensor. `tensors` is a host array.
inline constexpr int adamw_list_capacity = 64;
void adamw_update_list(const AdamWTensor<float>* tensors, int tensor_count, bool zero_gradients, float lr, float beta1,
                       float beta2, float eps, float bias_correction1, float bias_correction2, float grad_scale,
                       cudaStream_t stream);
void sgd_update(float* param, const float* grad, float* momentum_buffer, int64_t N, float lr, float momentum,
                float weight_decay, float grad_scale, cudaStream_t stream);

} // namespace engine::kernels::cuda

// The general ops' kernels, one header per family (twins of kernels/cpu/<family>_kernels.h).
#include "kernels/cuda/pointwise_kernels.h"
#include "kernels/cuda/reduction_kernels.h"
#include "kernels/cuda/layout_kernels.h"
#include "kernels/cuda/decode_kernels.h"
