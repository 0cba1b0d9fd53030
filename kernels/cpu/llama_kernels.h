// CPU reference kernels of the Llama-family ops (rotary position embedding, fused SwiGLU); conventions as in
// kernels/cpu/cpu_kernels.h. The CUDA twins are declared in kernels/cuda/llama_kernels.h.
// Why: rope rounds its two products and then their sum, with no contraction into an FMA (rope.cpp), which is what
// the CUDA twin spells with __fmul_rn/__fadd_rn, so the two agree bitwise; swiglu evaluates pointwise_functions.h's
// silu, the CUDA twin's formula. Fusing silu and the product saves the intermediate's round trip to memory.
// Where one op lives, rope for instance: engine/ops/rope.cpp (declared in engine/ops/llama.h, which includes this
// header directly), kernels/cpu/rope.cpp, kernels/cuda/rope.cu; tests/test_llama_ops_gradcheck.cpp (f64 finite
// differences, Hugging Face's formula), tests/cuda/test_llama_kernels.cpp (CUDA against this).
#pragma once

#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels::cpu {

// ---- rope: rotary position embedding, Hugging Face's rotate-half layout ----
// x is (B,T,H*D), head h of position t occupying columns [h*D, (h+1)*D); D = head_size is even and half = D/2.
// For i in [0, half), with c = cos[p,i] and s = sin[p,i] (row p of a (P, half) table: p = t, or positions[b,t] for
// packed documents, each below P):
//   out[i] = x[i]*c - x[i+half]*s;  out[i+half] = x[i+half]*c + x[i]*s
// computed in Compute<Scalar> (tables too) and rounded once on store.
template <typename Scalar>
void rope_forward(Scalar* out,                // (B,T,H*D)
                  const Scalar* inp,          // (B,T,H*D)
                  const Compute<Scalar>* cos, // (P,D/2), rows [0,T) read, or the positions'
                  const Compute<Scalar>* sin, // (P,D/2)
                  const int32_t* positions,   // (B,T) or null
                  int B, int T, int H, int D);
// The inverse rotation (the transpose of the forward's orthogonal 2x2 blocks):
//   dinp[i] += dout[i]*c + dout[i+half]*s;  dinp[i+half] += dout[i+half]*c - dout[i]*s
template <typename Scalar>
void rope_backward(Scalar* dinp,               // (B,T,H*D) +=
                   const Scalar* dout,         // (B,T,H*D)
                   const Compute<Scalar>* cos, // (P,D/2)
                   const Compute<Scalar>* sin, // (P,D/2)
                   const int32_t* positions,   // (B,T) or null
                   int B, int T, int H, int D);

// ---- swiglu: out = silu(gate) * up, elementwise (Llama's MLP activation) ----
// silu and its derivative are kernels/common/pointwise_functions.h's, so CPU and CUDA evaluate one formula.
template <typename Scalar>
void swiglu_forward(Scalar* out,        // (N)
                    const Scalar* gate, // (N)
                    const Scalar* up,   // (N)
                    int64_t N);
// dgate += dout * up * silu'(gate); dup += dout * silu(gate). Either gradient may be null (not needed).
template <typename Scalar>
void swiglu_backward(Scalar* dgate,      // (N) += or null
                     Scalar* dup,        // (N) += or null
                     const Scalar* dout, // (N)
                     const Scalar* gate, // (N)
                     const Scalar* up,   // (N)
                     int64_t N);

} // namespace engine::kernels::cpu
