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
StepTerms llama_step_terms(const nn::LlamaConfig& config, int batch, int seq_len, DType dtype, int mlp_tile_tokens) {
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
    // The attention half's moments (the same tiled or not), x included: the concat (x, rstd, h1, q, k, v,
    // packed) and o_proj's output (x, rstd, h1, q, k, packed, a, logsumexp, o); under no-grad the concat (h1, q,
    // k, v, packed), attention (h1, q, k, packed, a, logsumexp) and o_proj (h1, q, k, packed, a, o); in backward
    // from the attention on (h2, aa, rstd and the MLP's saved set freed): d(x), d(a), d(packed); and the
    // workspace of the concat's backward (d(x), d(packed) A + 2K, d(q), d(k), d(v)) and rope q's (d(x), d(q),
    // d(h1), d(q_proj out)).
    const size_t attention_forward = largest({4 * A + 4 * K + R, 6 * A + 3 * K + R + H});
    const size_t attention_no_grad = largest({3 * A + 4 * K, 4 * A + 3 * K + H, 5 * A + 3 * K});
    const size_t attention_workspace = largest({3 * A + 4 * K, 4 * A});
    // Saved without the MLP: x, rstd, h1, packed, a, logsumexp, aa, rstd, h2.
    const size_t attention_saved = 6 * A + 2 * K + 2 * R + H;
    const size_t attention_backward = attention_saved - 2 * A - R + 3 * A + 2 * K; // its saved part, then d(x), d(a), d(packed)

    if (mlp_tile_tokens > 0) {
        // The tiled MLP (checkpoint::tiled_rows; docs/MEMORY.md, "The tiled MLP"): a = (m,C), b = (m,I) for a tile
        // of m rows. Its node saves h2 only (saved already above), so the layer keeps no (B,T,I) tensor.
        const size_t tile = std::min(static_cast<size_t>(mlp_tile_tokens), rows);
        const size_t a = tile * static_cast<size_t>(config.hidden_size) * element;
        const size_t b = tile * static_cast<size_t>(config.intermediate_size) * element;
        const size_t P = attention_saved;
        terms.layer_saved = P;
        // A tile's forward holds its input copy, g, u, w and its down_proj output (2a + 3b); the result (A) is made
        // after the first tile's, beside that tile's output alone, so only the later tiles (the largest of them:
        // a whole one, or with two tiles the shorter last) meet it.
        const size_t later = tile < rows ? std::min(tile, rows - tile) : 0;
        const size_t later_tile =
            later == 0 ? 0
                       : A + later * (2 * static_cast<size_t>(config.hidden_size) + 3 * static_cast<size_t>(config.intermediate_size)) * element;
        const size_t mlp_forward = largest({2 * a + 3 * b, A + a, later_tile});
        // Forward: the MLP's moments over the saved set; then the final add (the MLP's output and y).
        terms.layer_transient = largest({attention_forward, P + mlp_forward, P + 2 * A}) - P;
        // No-grad: aa and h2 beside the MLP's moments; the last add (aa, h2, the MLP's output, y).
        terms.no_grad_layer_peak = largest({attention_no_grad, 2 * A + mlp_forward, 4 * A, 2 * A + R});
        // Backward: the add (dy, d(aa), d(mlp out)); the tiled node holds d(aa), d(mlp out) and d(h2) (3A) while a
        // tile is recomputed (its input copy a, g, u, w 3b) and backpropagated: down_proj (d(tile out) a, d(w) b),
        // swiglu (w freed; d(w), d(g), d(u)), gate/up (g, u freed; d(g), d(u), d(tile input) a).
        const size_t tile_peak = largest({2 * a + 4 * b, a + 5 * b, 2 * a + 2 * b});
        terms.backward_activations = 2 * a + 3 * b; // the recomputed tile: its input copy, g, u, w, its output
        const size_t after_dy = largest({P + 3 * A + tile_peak, attention_backward}) - P;
        terms.layer_backward = std::max(3 * A, after_dy);
        terms.recomputed_layer_backward = std::max(3 * A, after_dy + A);
        // Its workspace: the 3A, and down_proj's (a + b), swiglu's (3b) or gate/up's (2b + a).
        const size_t workspace_after_dy = largest({3 * A + largest({a + b, 3 * b, a + 2 * b}), attention_workspace});
        terms.layer_workspace = std::max(3 * A, workspace_after_dy);
        terms.recomputed_layer_workspace = std::max(3 * A, workspace_after_dy + A);
        terms.other_workspace = std::max(2 * terms.scalar, 2 * A);
        return terms;
    }

    // Saved: x, rstd, h1, packed, a, logsumexp, aa, rstd, h2, g, u, w.
    const size_t P = attention_saved + 3 * M;
    terms.layer_saved = P;
    // The forward's moments, x included: the attention half's and the final add (P with d and y). K <= A makes
    // the last the largest; the others are kept so that the term stays exact for any shape.
    const size_t forward_high = largest({attention_forward, P + 2 * A});
    terms.layer_transient = forward_high - P;
    // Under no-grad nothing is saved, but a statement's temporaries live to its end (h1 through the attention
    // line, h2 through the MLP line): the attention half's, down_proj (aa, h2, g, u, w, d), the last add (aa,
    // h2, d, y).
    terms.no_grad_layer_peak = largest({attention_no_grad, 3 * A + 3 * M, 4 * A, 2 * A + R});

    // Backward, node by node (run_backward erases an output's gradient after its node and frees the node's
    // saved tensors; input_grad zero-allocates a gradient on first use). Activations + workspace, dy included:
    //   add (y):        P; dy, d(aa), d(d)                                       P + 3A
    //   down_proj:      P; d(aa), d(d), d(w)                                     P + 2A + M
    //   swiglu:         w freed; d(aa), d(w), d(g), d(u)                         P - M + A + 3M
    //   2nd of gate/up: g, u, w freed; d(aa), d(g), d(u), d(h2)                  P - 3M + 2A + 2M
    //   attention:      h2, aa, rstd also freed; d(x), d(a), d(packed)           P - 2A - R - 3M + 3A + 2K
    // From the attention on, every moment is lower (K <= A); the attention's is kept for exactness.
    const size_t mlp_freed = P - 3 * M;
    const size_t after_dy = largest({P + 2 * A + M, P - M + A + 3 * M, mlp_freed + 2 * A + 2 * M,
                                     attention_backward}) - P;
    terms.layer_backward = std::max(3 * A, after_dy);
    // In a recomputed segment the checkpoint node holds dy until the segment is done: +A after the first node.
    terms.recomputed_layer_backward = std::max(3 * A, after_dy + A);

    // The workspace alone: the add (3A), down_proj (2A + M), swiglu (A + 3M), gate/up (2A + 2M) and the attention
    // half's.
    const size_t workspace_after_dy = largest({2 * A + M, A + 3 * M, 2 * A + 2 * M, attention_workspace});
    terms.layer_workspace = std::max(3 * A, workspace_after_dy);
    terms.recomputed_layer_workspace = std::max(3 * A, workspace_after_dy + A);
    // The loss's seed and multiply's gradient (2s); the final norm's backward holds d(norm out) and d(y) (2A).
    terms.other_workspace = std::max(2 * terms.scalar, 2 * A);
    return terms;
}

} // namespace engine::planner
