// The streaming head's chunk and the MLP's tile when nothing asks for others (train_gpt's auto): fixed memory
// targets for the head's buffers and the MLP's intermediates (planner/memory_model.h).
#include <algorithm>

#include "planner/memory_model.h"

namespace engine::planner {

int automatic_loss_chunk(const nn::ModelConfig& config, int batch, int seq_len, DType dtype) {
    ENGINE_CHECK(batch > 0 && seq_len > 0,
                 "automatic_loss_chunk: batch " << batch << " and seq_len " << seq_len << " must be positive");
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    const size_t row_bytes = static_cast<size_t>(config.padded_vocab_size()) * dtype_size(dtype);
    // What the streaming head holds besides its chunk's logits: d(hidden) and the per-token losses.
    const size_t fixed = rows * static_cast<size_t>(config.width()) * dtype_size(dtype) +
                         rows * dtype_size(compute_dtype(dtype));
    if (fixed + rows * row_bytes <= automatic_loss_chunk_bytes) return static_cast<int>(rows);
    // A large micro-batch's d(hidden) alone can pass the target: the chunk's logits still get half of it, so
    // that the chunks stay large enough for the GEMMs and few enough for the head gradient's re-reads.
    const size_t room = std::max(automatic_loss_chunk_bytes > fixed ? automatic_loss_chunk_bytes - fixed : 0,
                                 automatic_loss_chunk_bytes / 2);
    const size_t multiple = static_cast<size_t>(minimum_loss_chunk);
    const size_t chunk = std::max(room / row_bytes / multiple * multiple, multiple);
    return static_cast<int>(std::min(chunk, rows));
}

int automatic_mlp_tile(const nn::ModelConfig& config, int batch, int seq_len, DType dtype) {
    ENGINE_CHECK(batch > 0 && seq_len > 0,
                 "automatic_mlp_tile: batch " << batch << " and seq_len " << seq_len << " must be positive");
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
    const size_t row_bytes = (config.is_llama() ? 3 * static_cast<size_t>(config.llama().intermediate_size)
                                                : 8 * static_cast<size_t>(config.width())) *
                             dtype_size(dtype);
    if (rows * row_bytes <= automatic_mlp_tile_threshold) return 0;
    const size_t multiple = static_cast<size_t>(minimum_mlp_tile);
    const size_t tile = std::max(automatic_mlp_tile_bytes / row_bytes / multiple * multiple, multiple);
    return static_cast<int>(std::min(tile, rows));
}

} // namespace engine::planner
