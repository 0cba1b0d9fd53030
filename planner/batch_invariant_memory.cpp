// The batch-invariant mode's step memory (predict_memory with batch_invariant_chunk > 0, docs/MEMORY.md): the step of
// its chunks, the f64 sums, the window's chunk copies and, with ranks, the sums' all-reduce.
#include <algorithm>

#include "planner/memory_model.h"

namespace engine::planner {

MemoryPrediction predict_batch_invariant_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                                const checkpoint::CheckpointPolicy& policy, DType dtype,
                                                OptimizerKind optimizer, ZeroSharding sharding, int accumulation_steps,
                                                bool offload_optimizer, GradientOffload gradients_where,
                                                bool offload_parameters, int loss_chunk_tokens, int mlp_tile_tokens,
                                                bool packed_documents, const FineTuning& tuning,
                                                int batch_invariant_chunk) {
    ENGINE_CHECK(batch % batch_invariant_chunk == 0, "predict_memory: batch_invariant_chunk " << batch_invariant_chunk
                                                         << " does not divide the micro-batch " << batch);
    ENGINE_CHECK(!tuning.lora && !sharding.gradients && !offload_optimizer,
                 "predict_memory: the batch-invariant mode is not modelled with LoRA, ZeRO-2 or 3, or the optimizer "
                 "on the host (the trainer refuses the last two)");
    // The step as it runs: chunks of c rows, accumulation · batch / c of them.
    // (Its gradients are never all-reduced in f32: the sums are, below.)
    ZeroSharding chunk_sharding = sharding;
    chunk_sharding.all_reduced = false;
    const int chunks_per_window = accumulation_steps * (batch / batch_invariant_chunk);
    MemoryPrediction prediction = predict_memory(config, batch_invariant_chunk, seq_len, policy, dtype, optimizer,
                                                 chunk_sharding, chunks_per_window, false, gradients_where,
                                                 offload_parameters, loss_chunk_tokens, mlp_tile_tokens,
                                                 packed_documents, tuning);
    // optim::FixedPointGradients: an f64 sum beside each gradient as its parameter shows it (GPT-2's wte: V rows) and
    // one i32 slot per tensor, from the trainer's start.
    const size_t sums = batch_invariant_sum_bytes(config, dtype);
    // The window's chunks, copied from its micro-batches before the first forward and dropped after the last
    // backward: as many (rows, T) i32 tensors as the micro-batches hold.
    const size_t chunks = static_cast<size_t>(accumulation_steps) * static_cast<size_t>(batch) *
                          static_cast<size_t>(seq_len) * sizeof(int32_t) * (packed_documents ? 3 : 2);
    prediction.at(MemoryCategory::gradients) += sums;
    prediction.peak_bytes += sums + chunks;
    prediction.unified_peak_bytes += sums + chunks;
    prediction.between_steps_bytes += sums;
    if (sharding.all_reduced || sharding.ranks > 1) {
        // The ranks' sums added in f64 at the end of the window (FixedPointGradients::finish): the model state, the
        // held and copied rows, the last chunk's device copies, every chunk's reported loss, and the bucket.
        const size_t rows = static_cast<size_t>(batch_invariant_chunk) * static_cast<size_t>(seq_len);
        const size_t per_batch = packed_documents ? 3 : 2;
        hold_all_reduce(prediction,
                        prediction.between_steps_bytes + 2 * chunks + per_batch * rows * sizeof(int32_t) +
                            static_cast<size_t>(chunks_per_window) * dtype_size(compute_dtype(dtype)),
                        all_reduce_bucket_bytes(config, sizeof(double)), "the exact sums' all-reduce");
    }
    return prediction;
}

} // namespace engine::planner
