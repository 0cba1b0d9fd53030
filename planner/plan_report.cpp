// train_gpt --plan's report of a step (plan_report): the segment layout, the recompute cost, the predicted peak per
// category next to the same prediction without checkpointing, and the streaming head's and tiled MLP's savings.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "planner/memory_model.h"
#include "planner/step_terms.h"

namespace engine::planner {

using checkpoint::CheckpointPolicy;
using checkpoint::Segment;
using checkpoint::plan_segments;

std::string plan_report(const nn::ModelConfig& config, int batch, int seq_len, const CheckpointPolicy& policy,
                        DType dtype, OptimizerKind optimizer, ZeroSharding sharding, int accumulation_steps,
                        bool offload_optimizer, GradientOffload gradients, bool offload_parameters,
                        int loss_chunk_tokens, int mlp_tile_tokens, bool packed_documents, const FineTuning& tuning,
                        int batch_invariant_chunk) {
    const int optimizer_shards = sharding.ranks;
    const int invariant_chunk = batch_invariant_chunk; // every prediction below is of the step as the mode runs it
    const MemoryPrediction planned = predict_memory(
        config, batch, seq_len, policy, dtype, optimizer, sharding, accumulation_steps, offload_optimizer,
        gradients, offload_parameters, loss_chunk_tokens, mlp_tile_tokens, packed_documents, tuning, invariant_chunk);
    // Streamed gradients need checkpointed segments: the plain comparison keeps the window.
    const MemoryPrediction plain = predict_memory(config, batch, seq_len, CheckpointPolicy{}, dtype, optimizer,
                                                  optimizer_shards, 1, offload_optimizer, GradientOffload::window,
                                                  false, loss_chunk_tokens, mlp_tile_tokens, packed_documents, tuning, invariant_chunk);
    const int layers = config.layers();
    std::ostringstream text;
    text << "model: " << config.to_string() << "\n";
    text << "micro-batch " << batch << " x " << seq_len << " tokens, "
         << (dtype == DType::bf16 ? "bf16 mixed precision" : dtype_name(dtype)) << ", optimizer "
         << optimizer_kind_name(optimizer) << "\n";
    if (tuning.lora) {
        const ModelState state = predict_model_state(config, dtype, optimizer, optimizer_shards, tuning);
        const nn::LoraConfig& lora = *tuning.lora;
        text << "LoRA: r " << lora.r << ", alpha " << lora.lora_alpha << ", dropout " << lora.lora_dropout << " on";
        for (const std::string& target : lora.target_modules) text << " " << target;
        text << (tuning.nf4 ? "; the base's linear weights in NF4 (--load-in-4bit)" : "") << "; " << state.trainable
             << " parameters train beside a frozen base of " << mebibytes(state.frozen_parameters) << "\n";
    }
    if (invariant_chunk > 0) {
        const int chunks = batch / invariant_chunk;
        text << "batch-invariant: each micro-batch runs as " << chunks << " chunk" << (chunks == 1 ? "" : "s") << " of "
             << invariant_chunk << " x " << seq_len << " tokens (the activations are a chunk's); the exact f64 sums beside "
             << "the gradients " << mebibytes(batch_invariant_sum_bytes(config, dtype))
             << " in gradients, and the window's chunks copied from its micro-batches\n";
    }
    text << "gradient checkpointing: " << policy.to_string() << "\n";
    if (optimizer_shards > 1) {
        const MemoryPrediction whole = predict_memory(config, batch, seq_len, policy, dtype, optimizer, {}, 1, false, GradientOffload::window, false, 0, 0,
                           false, {}, invariant_chunk);
        text << "ZeRO stage " << (sharding.parameters ? 3 : sharding.gradients ? 2 : 1) << " over " << optimizer_shards << " ranks: optimizer_state per rank "
             << mebibytes(planned.of(MemoryCategory::optimizer_state)) << " instead of " << mebibytes(whole.of(MemoryCategory::optimizer_state));
        if (sharding.gradients)
            text << ", gradients per rank at their peak " << mebibytes(planned.of(MemoryCategory::gradients)) << " instead of "
                 << mebibytes(whole.of(MemoryCategory::gradients)) << " (this rank's part "
                 << mebibytes(planned.shard_gradient_bytes) << ", a segment's layers during its backward, the rest whole; "
                 << accumulation_steps << " reduce pass" << (accumulation_steps == 1 ? "" : "es") << " per step over the segments)";
        if (sharding.parameters)
            text << ", parameters per rank at their peak " << mebibytes(planned.of(MemoryCategory::parameters))
                 << " instead of " << mebibytes(whole.of(MemoryCategory::parameters)) << " (this rank's part of the masters "
                 << mebibytes(planned.shard_parameter_bytes) << (offload_optimizer ? " in host memory" : "")
                 << ", a segment's layers gathered while it runs, "
                 << mebibytes(planned.gathered_layer_bytes) << " a layer, "
                 << (planned.gathered_table_bytes > 0
                         ? "the token table for its lookup and the head from the loss to its backward, " +
                               mebibytes(planned.gathered_table_bytes) + " each with " +
                               mebibytes(planned.table_gradient_bytes) + " of gradient for its backward, "
                         : std::string())
                 << "the rest whole; " << 2 * accumulation_steps << " gather passes per step over the segments)";
        if (sharding.parameters && planned.largest_rank_extra_bytes + planned.host_largest_rank_extra_bytes > 0)
            text << "; these are rank 0's figures, and the rank whose part holds the most of the layers keeps "
                 << mebibytes(planned.largest_rank_extra_bytes + planned.host_largest_rank_extra_bytes) << " more"
                 << (offload_optimizer ? " in host memory" : "") << " (the search fits that rank)";
        text << ", for " << mebibytes(planned.zero_buffers) << " of the collectives' buffers in "
             << (offload_optimizer ? "host memory" : "workspace") << "\n";
    }
    if (policy.enabled) {
        text << "segments:";
        for (const Segment& segment : plan_segments(layers, policy))
            text << " [" << block_range(segment) << (segment.checkpointed ? " CP]" : " keep]");
        text << "\n";
        text << "recompute: " << planned.checkpointed_segments << " segments, " << planned.recomputed_blocks << " of "
             << layers << " blocks run forward twice (about +" << std::fixed << std::setprecision(0)
             << 100.0 * planned.recomputed_blocks / (3.0 * layers) << "% of the blocks' forward+backward compute)\n";
    }
    text << "predicted peak per category (without checkpointing in brackets):\n";
    for (int index = 0; index < memory_category_count; ++index) {
        const auto category = static_cast<MemoryCategory>(index);
        text << "  " << std::left << std::setw(16) << memory_category_name(category) << std::right << std::setw(14)
             << mebibytes(planned.of(category)) << "  [" << mebibytes(plain.of(category)) << "]\n";
    }
    text << "  device total <= " << mebibytes(planned.device_total_bound()) << "  ["
         << mebibytes(plain.device_total_bound()) << "]\n";
    if (offload_optimizer) {
        text << "optimizer offload: on the host " << mebibytes(planned.host_of(MemoryCategory::parameters))
             << " of f32 masters" << (sharding.parameters ? " (at their peak: this rank's part and a gathered segment)" : "")
             << ", " << mebibytes(planned.host_of(MemoryCategory::gradients)) << " of their gradients, "
             << mebibytes(planned.host_of(MemoryCategory::optimizer_state)) << " of optimizer state";
        if (planned.host_of(MemoryCategory::workspace) > 0)
            text << ", " << mebibytes(planned.host_of(MemoryCategory::workspace)) << " of ZeRO-1's collective buffers";
        text << "; host peak " << mebibytes(planned.host_peak_bytes) << " (" << planned.host_peak_bytes
             << " B); the device keeps the " << (dtype == DType::bf16 ? "bf16" : dtype_name(dtype))
             << " working copies (" << mebibytes(planned.working_copies)
             << (sharding.parameters ? "; at ZeRO-3 those of the checkpointed layers only while their segment runs" : "")
             << ") and "
             << (gradients == GradientOffload::stream
                     ? "the gradients of the layers outside checkpointed segments, the embeddings and the head, plus "
                       "one segment's during its backward (streamed: summed on the host)"
                     : "the step's gradients (summed on the device for the window)")
             << "\n";
        if (offload_parameters)
            text << "parameters streamed: " << mebibytes(planned.parked_working_copies)
                 << " of the checkpointed layers' working copies parked in pinned host memory; the device holds a "
                    "segment's during its forward and again during its recompute and backward, beside the next one's "
                    "prefetched on the copy stream ("
                 << mebibytes(planned.of(MemoryCategory::parameters) - (planned.working_copies - planned.parked_working_copies) -
                              planned.constant_buffers)
                 << " at most)\n";
    } else if (planned.working_copies > 0)
        text << "parameters: f32 masters " << mebibytes(planned.master_parameters) << " + bf16 working copies "
             << mebibytes(planned.working_copies) << "; gradients accumulate in f32; activations bf16 ("
             << mebibytes(predict_memory(config, batch, seq_len, policy, compute_dtype(dtype), optimizer,
                                         optimizer_shards, 1, false, GradientOffload::window, false, loss_chunk_tokens,
                                         mlp_tile_tokens, packed_documents, tuning, invariant_chunk)
                              .of(MemoryCategory::activations))
             << " in f32)\n";
    if (planned.constant_buffers > 0)
        text << "parameters include the RoPE cos/sin tables (" << config.max_seq_len() << " positions): "
             << mebibytes(planned.constant_buffers) << ", no gradient, no optimizer state\n";
    text << "  step peak " << mebibytes(planned.peak_bytes) << " (" << planned.peak_bytes << " B; with the offloaded inputs in the same memory, as on the CPU: "
         << planned.unified_peak_bytes << " B) at " << planned.peak_moment << "; on CUDA "
         << mebibytes(planned.peak_on(Device::cuda)) << " with cuBLASLt's workspace\n";
    text << "activation peak at: " << planned.activations_peak_moment << "\n";
    // A forward's rows: the micro-batch's, or in the batch-invariant mode one chunk's.
    const size_t rows = static_cast<size_t>(invariant_chunk > 0 ? invariant_chunk : batch) * static_cast<size_t>(seq_len);
    const size_t logits_row = static_cast<size_t>(config.padded_vocab_size()) * dtype_size(dtype);
    const char* vocabulary = config.is_llama() ? "V" : "Vp";
    if (loss_chunk_tokens > 0) {
        const size_t chunk = std::min(static_cast<size_t>(loss_chunk_tokens), rows);
        const MemoryPrediction whole =
            predict_memory(config, batch, seq_len, policy, dtype, optimizer, sharding, accumulation_steps,
                           offload_optimizer, gradients, offload_parameters, 0, mlp_tile_tokens, packed_documents, tuning, invariant_chunk);
        text << "loss: streaming head, " << (rows + chunk - 1) / chunk << " chunks of " << chunk << " tokens: one chunk's logits ("
             << chunk << "," << vocabulary << ") = " << mebibytes(chunk * logits_row) << " and d(hidden) "
             << mebibytes(rows * static_cast<size_t>(config.width()) * dtype_size(dtype))
             << " instead of the whole (B,T," << vocabulary << ") = " << mebibytes(rows * logits_row)
             << "; the step peak " << mebibytes(planned.peak_bytes) << " instead of " << mebibytes(whole.peak_bytes)
             << " (--loss-chunk-tokens off)\n";
    } else {
        text << "loss: fused classifier, the gradient written over the logits (B,T," << vocabulary
             << ") = " << mebibytes(rows * logits_row) << ": no second buffer of that size in workspace\n";
    }
    const size_t intermediate = config.is_llama() ? 3 * static_cast<size_t>(config.llama().intermediate_size)
                                                  : 8 * static_cast<size_t>(config.width()); // g, u, w; c_fc and gelu out
    if (mlp_tile_tokens > 0) {
        const size_t tile = std::min(static_cast<size_t>(mlp_tile_tokens), rows);
        const MemoryPrediction untiled =
            predict_memory(config, batch, seq_len, policy, dtype, optimizer, sharding, accumulation_steps,
                           offload_optimizer, gradients, offload_parameters, loss_chunk_tokens, 0, packed_documents,
                           tuning, invariant_chunk);
        text << "MLP: tiled, " << (rows + tile - 1) / tile << " tiles of " << tile << " tokens: a tile's intermediates "
             << mebibytes(tile * intermediate * dtype_size(dtype)) << " instead of the whole micro-batch's "
             << mebibytes(rows * intermediate * dtype_size(dtype)) << " per layer; activations "
             << mebibytes(planned.of(MemoryCategory::activations)) << " instead of "
             << mebibytes(untiled.of(MemoryCategory::activations)) << ", the step peak " << mebibytes(planned.peak_bytes)
             << " instead of " << mebibytes(untiled.peak_bytes)
             << " (--mlp-tile-tokens off); one more MLP forward per layer in backward\n";
    } else {
        text << "MLP: whole, its intermediates " << mebibytes(rows * intermediate * dtype_size(dtype))
             << " per layer (--mlp-tile-tokens N tiles them)\n";
    }
    if (config.is_llama())
        text << "vocabulary " << config.vocab_size() << ", not padded (" << parameter_count(config, config.vocab_size())
             << " parameters, " << (config.llama().tie_word_embeddings ? "tied" : "untied") << " head)\n";
    else
        text << "vocabulary " << config.vocab_size() << " padded to " << config.padded_vocab_size() << " rows of wte ("
             << parameter_count(config, config.vocab_size()) << " parameters, "
             << parameter_count(config, config.padded_vocab_size()) << " stored)\n";
    return text.str();
}

} // namespace engine::planner
