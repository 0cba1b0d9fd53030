// CUDA twins of kernels/cpu/layout_kernels.h (conventions: kernels/cuda/cuda_kernels.h). Included by cuda_kernels.h.
// Why: permute, slice and concat are copies bound by memory bandwidth, so each keeps its reads and writes coalesced:
// a permute that moves the last axis would stride one side, so it goes through 32x32 shared-memory tiles; slices
// move 128-bit packs where rows and offsets allow. A batched GEMM summed into one c runs one GEMM per entry in
// order instead of racing on c. Map: kernels/cpu/layout_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"

namespace engine::kernels::cuda {

// ---- permute (rank <= kernels::cpu::max_permute_rank) ----
// Adjacent axes that stay adjacent are merged and size-1 axes dropped first; then a permutation that moves
// the last axis runs as 32x32 shared-memory tiles (both the read and the write coalesced), any other as a
// gather along the kept last axis (coalesced writes and reads).
void permute_forward(float* out, const float* inp, const int64_t* shape, const int64_t* dims, int rank,
                     cudaStream_t stream);
void permute_forward(bfloat16* out, const bfloat16* inp, const int64_t* shape, const int64_t* dims, int rank,
                     cudaStream_t stream);
void permute_backward(float* dinp, const float* dout, const int64_t* shape, const int64_t* dims, int rank,
                      cudaStream_t stream);
void permute_backward(bfloat16* dinp, const bfloat16* dout, const int64_t* shape, const int64_t* dims, int rank,
                      cudaStream_t stream);

// ---- slice and concat (outer, size, inner) block copies; 128-bit accesses when the rows allow them ----
void slice_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                   int64_t length, cudaStream_t stream);
void slice_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                   int64_t length, cudaStream_t stream);
void slice_backward(float* dinp, const float* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length, cudaStream_t stream);
void slice_backward(bfloat16* dinp, const bfloat16* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length, cudaStream_t stream);
void concat_forward(float* out, const float* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length, cudaStream_t stream);
void concat_forward(bfloat16* out, const bfloat16* inp, int64_t outer, int64_t size, int64_t inner, int64_t start,
                    int64_t length, cudaStream_t stream);
void concat_backward(float* dinp, const float* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                     int64_t length, cudaStream_t stream);
void concat_backward(bfloat16* dinp, const bfloat16* dout, int64_t outer, int64_t size, int64_t inner, int64_t start,
                     int64_t length, cudaStream_t stream);

// ---- batched gemm (cuBLAS strided-batched on `handle`, bound to `stream`; TF32 when `tf32` and f32) ----
// The twin of kernels::cpu::batched_gemm, strides and the stride_c = 0 batch sum included (that case runs one
// GEMM per batch entry in order, beta 1 after the first: no two GEMMs write c at once).
void batched_gemm(float* c, const float* a, const float* b, int64_t batch, int m, int n, int k, bool transpose_a,
                  bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha, float beta,
                  bool tf32, cublasHandle_t handle, cudaStream_t stream);
void batched_gemm(bfloat16* c, const bfloat16* a, const bfloat16* b, int64_t batch, int m, int n, int k,
                  bool transpose_a, bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha,
                  float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream);
void batched_gemm(float* c, const bfloat16* a, const bfloat16* b, int64_t batch, int m, int n, int k,
                  bool transpose_a, bool transpose_b, int64_t stride_a, int64_t stride_b, int64_t stride_c, float alpha,
                  float beta, bool tf32, cublasHandle_t handle, cudaStream_t stream);

} // namespace engine::kernels::cuda
