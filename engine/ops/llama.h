// The Llama-family ops (Hugging Face LlamaForCausalLM semantics): rotary position embedding and its tables, and
// the fused SwiGLU activation. Included by engine/ops.h; the plain (position-free) embedding is declared there,
// beside GPT's. Defined in engine/ops/rope.cpp and engine/ops/swiglu.cpp.
#pragma once

#include "engine/tensor.h"

namespace engine {

// cos and sin of every (position, frequency) pair, each (positions, head_size/2) in compute_dtype(dtype): f32
// for f32 and bf16 models, f64 for f64.
struct RopeTables {
    Tensor cos; // (P, D/2)
    Tensor sin; // (P, D/2)
};

// Computed on the host as transformers' LlamaRotaryEmbedding (default rope type, attention_scaling 1) does in
// float32: inv_freq[i] = 1 / theta^(2i/D) with the exponent, the power and the reciprocal each in f32; freq =
// t * inv_freq[i] in f32; cos and sin of that f32 freq evaluated in double and rounded once to f32 (correctly
// rounded, so within 1 ulp of torch's). For f64 everything is double. Then copied to `device`.
// Memory: category `parameters`. The tables are a constant buffer (transformers registers inv_freq as a
// non-persistent buffer): built once with the model, alive as long as it, never freed per step, with no gradient
// and no optimizer state, i.e. resident bytes like the weights'; `workspace` and `activations` are transient,
// per-step categories. 2 * P * D/2 * 4 bytes (f32): 1 MiB at P = 4096, D = 64 (shared by every layer).
RopeTables rope_tables(int positions, int head_size, double theta, DType dtype, Device device);

// x (B,T,H*D) with D = head_size (even); cos and sin (P, D/2) in compute_dtype(x.dtype()) on x's device, P >= T;
// position t uses row t, or row positions[b,t] for packed documents (positions (B,T) i32 on x's device, as
// check_document_positions in engine/ops.h states; undefined otherwise). Per head, Hugging Face's rotate-half layout: for i in [0, D/2)
//   out[i] = x[i]*cos[t,i] - x[i+D/2]*sin[t,i];  out[i+D/2] = x[i+D/2]*cos[t,i] + x[i]*sin[t,i]
// computed in compute_dtype and rounded once on store. (transformers' bf16 model rounds cos/sin to bf16 and each
// product and sum to bf16; this keeps f32 until the store, so the two differ by about one bf16 ulp.)
// f32, f64 (CPU) and bf16. Saves only the tables; backward applies the inverse rotation to dout. The tables are
// constants and never receive a gradient, even if they require one.
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int head_size, const Tensor& positions = Tensor());

// silu(gate) * up elementwise (Llama's MLP: down(swiglu(gate_proj(x), up_proj(x)))), shapes and dtypes equal,
// f32, f64 (CPU) and bf16. One pass instead of silu then mul. Saves gate and up.
Tensor swiglu(const Tensor& gate, const Tensor& up);

} // namespace engine
