// The per-architecture terms the memory model's step walk is built from (planner/memory_model.cpp walks them;
// GPT-2's are derived there, Llama's in planner/memory_model_llama.cpp; docs/MEMORY.md derives both).
#pragma once

#include <cstddef>
#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/dtype.h"
#include "nn/llama.h"

namespace engine::planner {

// What one decoder layer, the embedding and the head hold at the moments the walk visits, in bytes. The walk
// itself (plain layers, checkpointed segments, the head, the recompute in backward) is the same for every
// architecture: only these sizes differ.
struct StepTerms {
    size_t stream = 0;   // A: one residual-stream tensor (B,T,C)
    size_t row_stat = 0; // R: one compute-dtype value per row (B,T): a norm statistic, a per-token loss
    size_t logits = 0;   // G: (B,T,Vp), the padded vocabulary
    size_t logits_row = 0; // one token's logits (Vp): the streaming head holds a chunk of these
    size_t scalar = 0;   // s: a (1) compute-dtype tensor, the loss

    size_t embedding_peak = 0;        // the embedding's output (and GPT-2's dropout output)
    size_t final_norm_statistics = 0; // what the final norm saves beside its input and output
    // The loss head above what the end of forward holds (the final norm's input, output and statistics): at
    // its forward high-water mark, and in its backward. Set by predict_memory for the head the step runs: the
    // fused classifier over the whole logits (G + R + s, and G + 2s + A), or the streaming head over chunks of
    // c tokens (its d(hidden) A, one chunk's logits c·Vp and the losses R; then A + 2s).
    size_t head_peak = 0;
    size_t head_backward = 0;
    size_t layer_saved = 0;           // P: a layer's saved set under grad mode, its input included
    size_t layer_transient = 0;       // above P at a layer's forward high-water mark
    size_t no_grad_layer_peak = 0;    // a layer under no-grad, above its input (nothing is saved)
    // Activations a layer's backward allocates above its saved set: a tiled MLP's recompute of one tile (0 untiled:
    // plain backward allocates only gradients).
    size_t backward_activations = 0;
    // Activations + workspace above P at a layer's backward high-water mark (the incoming gradient included):
    // plain, and in a recomputed segment, whose checkpoint node keeps its incoming gradient to the end.
    size_t layer_backward = 0;
    size_t recomputed_layer_backward = 0;
    // The workspace alone at a layer's backward high-water mark, plain and recomputed; and the rest of the
    // step's (the loss's seeds, the head's and the final norm's gradients).
    size_t layer_workspace = 0;
    size_t recomputed_layer_workspace = 0;
    size_t other_workspace = 0;
};

// Llama (nn/llama.h): every term for a micro-batch of batch x seq_len in `dtype` (bf16: mixed precision).
// mlp_tile_tokens > 0: its MLP tiled over that many rows (checkpoint::tiled_rows).
StepTerms llama_step_terms(const nn::LlamaConfig& config, int batch, int seq_len, DType dtype, int mlp_tile_tokens = 0);
// Llama's parameters: embed_tokens, per layer q/k/v/o (k, v of key_value_width), gate/up/down and two RMSNorm
// gains, the final norm, and lm_head unless tied. No vocabulary padding: stored and real counts are equal.
size_t llama_parameter_count(const nn::LlamaConfig& config);
// The RoPE cos and sin tables (max_position_embeddings, head_dim/2) each, in compute_dtype(dtype): built with
// the model and counted under `parameters` (engine/ops/llama.h), with no gradient and no optimizer state.
size_t llama_rope_table_bytes(const nn::LlamaConfig& config, DType dtype);

// "block 3" or "blocks 3-5" (1-based): a segment as the walk's moments and --plan's layout name it.
std::string block_range(const checkpoint::Segment& segment);

} // namespace engine::planner
