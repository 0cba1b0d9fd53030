// tiled_rows, the sequence-tiled MLP: a row-wise function over tiles of rows, so that its intermediates exist
// for one tile at a time; its one node saved only the input, and its backward re-runs and backpropagates each
// tile in turn (a checkpoint per tile, with the tiles' gradients written row block by row block).
#include <algorithm>

#include "checkpoint/checkpoint.h"
#include "engine/elementwise.h"

namespace engine::checkpoint {
namespace {

thread_local size_t thread_tiles = 0;

int64_t rows_of(const Tensor& tensor) { return tensor.numel() / tensor.shape().back(); }

// Rows [first, first + count) of `source` as a (count, C) tensor of their own.
Tensor rows_copy(const Tensor& source, int64_t first, int64_t count, MemoryCategory category) {
    Tensor tile = Tensor::empty({count, source.shape().back()}, source.dtype(), source.device(), category);
    tile.copy_rows_from(source, first, 0, count);
    return tile;
}

// What the first tile's output fixed: every tile's, forward and recompute alike, must agree with it.
struct TileOutput {
    int64_t width = 0;
    DType dtype = DType::f32;
    Device device = Device::cpu;
};

void check_piece(const Tensor& piece, int64_t count, const TileOutput& expected, const Tensor& input) {
    ENGINE_CHECK(piece.defined() && piece.dim() == 2 && piece.size(0) == count && piece.size(1) > 0,
                 "tiled_rows: the function returned " << piece.describe() << " for a tile of " << count << " rows of "
                                                      << input.describe() << "; a row-wise function returns (rows, C_out)");
    ENGINE_CHECK(piece.size(1) == expected.width && piece.dtype() == expected.dtype && piece.device() == expected.device,
                 "tiled_rows: the function returned " << piece.describe() << " for one tile and (" << expected.width
                                                      << " columns) " << dtype_name(expected.dtype) << " "
                                                      << device_name(expected.device) << " for the first");
}

} // namespace

size_t tiled_row_tile_count() { return thread_tiles; }
void reset_tiled_row_tile_count() { thread_tiles = 0; }

Tensor tiled_rows(const RowFunction& function, const Tensor& input, int64_t tile_rows) {
    ENGINE_CHECK(static_cast<bool>(function), "tiled_rows: the function is empty");
    ENGINE_CHECK(input.defined(), "tiled_rows: the input is an undefined tensor");
    ENGINE_CHECK(input.dim() >= 1 && input.shape().back() > 0 && input.numel() > 0,
                 "tiled_rows: input " << input.describe() << " has no rows to tile");
    ENGINE_CHECK(tile_rows >= 1, "tiled_rows: a tile of " << tile_rows << " rows; it must be at least 1");
    const int64_t rows = rows_of(input);
    const int64_t tile = std::min(tile_rows, rows);
    std::vector<RngState> rng_at_tile;
    TileOutput expected;
    Tensor output; // (..., C_out)
    {
        // Nothing inside a tile is recorded: its intermediates die with the tile.
        NoGradGuard no_grad;
        for (int64_t first = 0; first < rows; first += tile) {
            const int64_t count = std::min(tile, rows - first);
            rng_at_tile.push_back(rng_state());
            Tensor piece; // (count, C_out)
            {
                const Tensor tile_input = rows_copy(input, first, count, current_memory_category()); // (count, C)
                piece = function(tile_input);
            }
            if (!output.defined()) {
                expected = {piece.defined() && piece.dim() == 2 ? piece.size(1) : 0,
                            piece.defined() ? piece.dtype() : DType::f32,
                            piece.defined() ? piece.device() : Device::cpu};
                check_piece(piece, count, expected, input);
                Shape shape = input.shape();
                shape.back() = expected.width;
                output = Tensor::empty(shape, expected.dtype, expected.device, current_memory_category());
            }
            check_piece(piece, count, expected, input);
            output.copy_rows_from(piece, 0, first, count);
            ++thread_tiles;
        }
    }
    if (!grad_enabled()) return output;

    const Tensor saved = input.detach();
    const GradTarget target(input);
    auto backward_function = [function, saved, target, rng_at_tile, tile, rows, expected, output_id = output.id()](
                                 BackwardContext& context) {
        Tensor output_gradient = context.output_grad(output_id);
        if (!output_gradient.defined()) return;
        // As rows: a reshape of the output shares its identity, so its gradient may come in the reshape's shape.
        output_gradient = output_gradient.reshape({rows, expected.width}); // (rows, C_out)
        // Every row is written by its tile: zeroed only for a function whose output ignores its input.
        Tensor input_gradient; // (..., C), once the first tile's is known
        if (target.requires_grad)
            input_gradient = Tensor::zeros(target.shape, target.dtype, target.device, MemoryCategory::workspace);
        const RngStateRestore restore_after;
        for (int64_t first = 0, index = 0; first < rows; first += tile, ++index) {
            const int64_t count = std::min(tile, rows - first);
            Tape local_tape;
            BackwardContext local;
            uint64_t tile_id = 0;
            {
                // A non-leaf that requires grad: its gradient collects in the local context.
                Tensor tile_input = as_non_leaf(rows_copy(saved, first, count, current_memory_category()),
                                                target.requires_grad);
                tile_id = tile_input.id();
                rng_state() = rng_at_tile[static_cast<size_t>(index)]; // the tile's forward draws, replayed
                TapeScope scope(local_tape);
                GradModeGuard grad_on(true);
                Tensor piece = function(tile_input);
                check_piece(piece, count, expected, saved);
                // No backward reads a tile's output: it goes before its gradient's rows come in.
                const bool reached = piece.requires_grad();
                const uint64_t piece_id = piece.id();
                piece = tile_input = Tensor();
                if (reached) local.seed(piece_id, rows_copy(output_gradient, first, count, MemoryCategory::workspace));
            }
            // The local tape's saved tensors keep alive exactly what the tile's backward needs.
            run_backward(local_tape, local);
            ++thread_tiles;
            if (!target.requires_grad) continue;
            const Tensor tile_gradient = local.take(tile_id); // (count, C)
            if (tile_gradient.defined()) input_gradient.copy_rows_from(tile_gradient, 0, first, count);
        }
        if (!input_gradient.defined()) return;
        if (target.persistent_grad.defined()) accumulate_into(target.persistent_grad, input_gradient);
        else context.seed(target.id, std::move(input_gradient));
    };
    // Recorded even when the input requires no grad: the function's parameters do.
    const std::vector<const Tensor*> inputs{&input};
    const std::vector<Tensor*> outputs{&output};
    record_node("tiled_rows", inputs, outputs, std::move(backward_function), RecordWhen::grad_enabled);
    return output;
}

} // namespace engine::checkpoint
