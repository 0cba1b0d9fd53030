// CUDA twins of kernels/cpu/llama_kernels.h (rope, swiglu): same names and argument order plus a trailing
// stream; conventions as in kernels/cuda/cuda_kernels.h. Storage float or bf16, arithmetic and tables float, one
// rounding per store; backward kernels accumulate (+=). Grid-stride, 128-bit (f32) or 64-bit (bf16) packs of 4
// when every pointer and the layout allow, else scalars with the same per-element arithmetic.
// Why: both are memory-bound elementwise passes with no reduction, so the grid is the capped grid-stride one and
// the only question is the access width; a rope pack of 4 pairs exists only when D/2 % 4 == 0, so that it never
// straddles two heads. Map: kernels/cpu/llama_kernels.h.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"

namespace engine::kernels::cuda {

// ---- rope: x (B,T,H*D), tables (P,D/2) float, P >= T; packs when D/2 % 4 == 0; positions (B,T) or null: the
// table row of token (b, t), else t ----
void rope_forward(float* out, const float* inp, const float* cos, const float* sin, const int32_t* positions, int B,
                  int T, int H, int D, cudaStream_t stream);
void rope_forward(bfloat16* out, const bfloat16* inp, const float* cos, const float* sin, const int32_t* positions,
                  int B, int T, int H, int D, cudaStream_t stream);
void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, const int32_t* positions, int B,
                   int T, int H, int D, cudaStream_t stream);
void rope_backward(bfloat16* dinp, const bfloat16* dout, const float* cos, const float* sin, const int32_t* positions,
                   int B, int T, int H, int D, cudaStream_t stream);

// ---- swiglu: out = silu(gate) * up; dgate or dup may be null ----
void swiglu_forward(float* out, const float* gate, const float* up, int64_t N, cudaStream_t stream);
void swiglu_forward(bfloat16* out, const bfloat16* gate, const bfloat16* up, int64_t N, cudaStream_t stream);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t N,
                     cudaStream_t stream);
void swiglu_backward(bfloat16* dgate, bfloat16* dup, const bfloat16* dout, const bfloat16* gate, const bfloat16* up,
                     int64_t N, cudaStream_t stream);

} // namespace engine::kernels::cuda
