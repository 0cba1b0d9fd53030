// The memory model's terms for a Llama decoder (nn/llama.cpp), from what each of its ops allocates and saves
// (engine/ops: rms_norm, matmul, rope, concat, attention, add, swiglu). docs/MEMORY.md ("Llama") derives them.
#include <algorithm>
#include <initializer_list>

#include "planner/step_terms.h"

namespace engine::planner {
namespace {

size_t largest(std::initializer_list<size_t> candidates) { return std::max(candidates); }

} // namespace

size_t llama_parameter_count(const nn::LlamaConfig& config) {
    const size_t width = static_cast<size_t>(config.hidden_size);
    const size_t key_value = static_cast<size_t>(config.key_value_width());
    const size_t intermediate = static_cast<size_t>(config.intermediate_size);
    const size_t vocabulary = static_cast<size_t>(config.vocab_size);
    // q_proj and o_proj (C,C), k_proj and v_proj (KV,C), gate/up (I,C), down (C,I), two RMSNorm gains.
    const size_t per_layer = 2 * width * width + 2 * key_value * width + 3 * intermediate * width + 2 * width;
    const size_t embeddings = (config.tie_word_embeddings ? 1 : 2) * vocabulary * width; // + lm_head if untied
    return embeddings + static_cast<size_t>(config.num_hidden_layers) * per_layer + width; // + the final norm
}

size_t llama_rope_table_bytes(const nn::LlamaConfig& config, DType dtype) {
    return 2 * static_cast<size_t>(config.max_position_embeddings) * static_cast<size_t>(config.head_dim() / 2) *
           dtype_size(compute_dtype(dtype));
}

// Symbols (bytes): A = (B,T,C) and Q = A (NH·D = C), K = (B,T,KVH·D) one of k and v, M = (B,T,I) the MLP's
// width, R = (B,T) f32 rstd, H = (B,NH,T) f32 logsumexp. The layer's ops in order (nn/llama.cpp):
//   h1 = rms_norm(x)                                  out A, rstd R          saves x, rstd
//   q = rope(q_proj(h1)); k = rope(k_proj(h1))        A, K (the projections die with their statement: rope
//                                                     saves only the tables)
//   packed = concat(q, k, v_proj(h1))                 A + 2K (v dies with the statement); q, k live to return
//   a = attention(packed); o = o_proj(a)              a A, logsumexp H, o A  saves packed, a, logsumexp
//   aa = x + o                                        A                      (o dies: nothing saves it)
//   h2 = rms_norm(aa)                                 A, R                   saves aa, rstd
//   g = gate_proj(h2), u = up_proj(h2), w = swiglu    3M                     the projections save h2; swiglu g, u
//   d = down_proj(w); y = aa + d                      A, A                   down saves w; d dies after the add
StepTerms llama_step_terms(const nn::LlamaConfig& config, int batch, int seq_len, DType dtype) {
    const size_t element = dtype_size(dtype);
    const size_t wide = dtype_size(compute_dtype(dtype));
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    StepTerms terms;
    const size_t A = rows * static_cast<size_t>(config.hidden_size) * element;
    const size_t K = rows * static_cast<size_t>(config.key_value_width()) * element;
    const size_t M = rows * static_cast<size_t>(config.intermediate_size) * element;
    const size_t R = rows * wide;
    const size_t H = rows * static_cast<size_t>(config.num_attention_heads) * wide;
    terms.stream = A;
    terms.row_stat = R;
    terms.logits = rows * static_cast<size_t>(config.vocab_size) * element; // no padding
    terms.logits_row = static_cast<size_t>(config.vocab_size) * element;
    terms.scalar = wide;
    terms.embedding_peak = A; // no position table, no dropout
    terms.final_norm_statistics = R; // RMSNorm keeps rstd only (layernorm also keeps the mean)

    // Saved: x, rstd, h1, packed, a, logsumexp, aa, rstd, h2, g, u, w.
    const size_t P = 6 * A + 2 * K + 3 * M + 2 * R + H;
    terms.layer_saved = P;
    // The forward's moments, x included: the concat (x, rstd, h1, q, k, v, packed), o_proj's output (x, rstd,
    // h1, q, k, packed, a, logsumexp, o) and the final add (P with d and y). K <= A makes the last the largest;
    // the others are kept so that the term stays exact for any shape.
    const size_t forward_high = largest({4 * A + 4 * K + R, 6 * A + 3 * K + R + H, P + 2 * A});
    terms.layer_transient = forward_high - P;
    // Under no-grad nothing is saved, but a statement's temporaries live to its end (h1 through the attention
    // line, h2 through the MLP line): the concat (h1, q, k, v, packed), attention (h1, q, k, packed, a,
    // logsumexp), o_proj (h1, q, k, packed, a, o), down_proj (aa, h2, g, u, w, d), the last add (aa, h2, d, y).
    terms.no_grad_layer_peak =
        largest({3 * A + 4 * K, 4 * A + 3 * K + H, 5 * A + 3 * K, 3 * A + 3 * M, 4 * A, 2 * A + R});

    // Backward, node by node (run_backward erases an output's gradient after its node and frees the node's
    // saved tensors; input_grad zero-allocates a gradient on first use). Activations + workspace, dy included:
    //   add (y):        P; dy, d(aa), d(d)                                       P + 3A
    //   down_proj:      P; d(aa), d(d), d(w)                                     P + 2A + M
    //   swiglu:         w freed; d(aa), d(w), d(g), d(u)                         P - M + A + 3M
    //   2nd of gate/up: g, u, w freed; d(aa), d(g), d(u), d(h2)                  P - 3M + 2A + 2M
    //   attention:      h2, aa, rstd also freed; d(x), d(a), d(packed)           P - 2A - R - 3M + 3A + 2K
    // From the attention on, every moment is lower (K <= A); the attention's is kept for exactness.
    const size_t mlp_freed = P - 3 * M, attention_start = P - 2 * A - R - 3 * M;
    const size_t after_dy = largest({P + 2 * A + M, P - M + A + 3 * M, mlp_freed + 2 * A + 2 * M,
                                     attention_start + 3 * A + 2 * K}) - P;
    terms.layer_backward = std::max(3 * A, after_dy);
    // In a recomputed segment the checkpoint node holds dy until the segment is done: +A after the first node.
    terms.recomputed_layer_backward = std::max(3 * A, after_dy + A);

    // The workspace alone: the add (3A), down_proj (2A + M), swiglu (A + 3M), gate/up (2A + 2M), the concat's
    // backward (d(x), d(packed) A + 2K, d(q), d(k), d(v): 3A + 4K) and rope q's (d(x), d(q), d(h1), d(q_proj
    // out): 4A).
    const size_t workspace_after_dy = largest({2 * A + M, A + 3 * M, 2 * A + 2 * M, 3 * A + 4 * K, 4 * A});
    terms.layer_workspace = std::max(3 * A, workspace_after_dy);
    terms.recomputed_layer_workspace = std::max(3 * A, workspace_after_dy + A);
    // The loss's seed and multiply's gradient (2s); the final norm's backward holds d(norm out) and d(y) (2A).
    terms.other_workspace = std::max(2 * terms.scalar, 2 * A);
    return terms;
}

} // namespace engine::planner
