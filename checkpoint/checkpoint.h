// Recomputation: checkpoint(fn, inputs) keeps only the segment's inputs (and the RNG offset) and re-runs fn
// in backward. Plus the policy that picks which GPT blocks form checkpointed segments, and host offload.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace engine::checkpoint {

using SegmentFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Under grad mode: runs fn without recording its inside, and records ONE node that saved only `inputs`
// and the RNG offset. Its backward restores the offset, re-runs fn on a local tape, backpropagates through
// it (parameter gradients accumulate into the usual buffers) and frees what it recomputed.
// With offload, the saved inputs move to pinned host memory and back before the recompute.
// With prefetch too (meaningful only with offload), the segment's backward first starts bringing back the
// inputs of the offloaded segment recorded just before it (the next one backward reaches, in a chain), so
// that copy overlaps this segment's recompute: on CUDA on the copy stream, ordered with events; on the CPU
// the same bookkeeping with synchronous copies, so tests can prove it changes no result.
// Under no-grad it is a plain call.
//
// `hooks`: before_forward and after_forward run around the segment's forward, under grad mode and no-grad alike
// (after_forward also when the forward or before_forward throws); before_recompute and after_backward inside its backward, just
// before its recompute and once its backward is done and its recompute freed (under no-grad no node is
// recorded, so they never run). Streamed parameters fetch the segment's weights in the before hooks and let
// them go in the after ones; streamed gradients attach the segment's gradient buffers before its recompute and
// take them to the host after its backward. Any of them may be empty.
struct SegmentHooks {
    std::function<void()> before_forward;
    std::function<void()> after_forward;
    std::function<void()> before_recompute;
    std::function<void()> after_backward;
};
std::vector<Tensor> checkpoint(const SegmentFunction& fn, const std::vector<Tensor>& inputs, bool offload = false,
                               bool prefetch = false, SegmentHooks hooks = {});

// The sequence-tiled MLP (docs/MEMORY.md, "The tiled MLP"): `function` applied to `input` (..., C) seen as rows
// (numel / C, C), `tile_rows` rows at a time, so that its intermediates exist for one tile only. The function must
// be row-wise: output row i depends on input row i alone (an MLP; not attention, not a norm across rows), and it
// returns (rows, C_out) for (rows, C); the result is (..., C_out). In forward, grad mode or not, each tile runs
// under no-grad: a copy of its input rows in, its output rows copied into the result. Under grad mode ONE node
// is recorded that saved only `input` (and the RNG state at each tile); its backward re-runs each tile on a
// local tape and backpropagates it at once (parameter gradients accumulate tile after tile into their buffers),
// writing the tile's rows of d(input). The output is bitwise the untiled function's wherever that function's
// rows come out the same for any row count (this CPU BLAS's GEMM does); parameter gradients are the untiled
// ones summed in tiles. Costs one more forward of the function per backward. tile_rows >= the row count: one
// tile (the function recomputed whole in backward). Throws on an empty function, a tile below 1 or an input
// with no rows, and when a tile's output is not (rows, C_out > 0) of one dtype and device. A function that throws
// in a tile's backward leaves the earlier tiles' parameter gradients added (as checkpoint's backward does): zero
// them before retrying. Gradients the function sends to non-leaf tensors it captures (not its input) are dropped:
// capture parameters (leaves) only.
using RowFunction = std::function<Tensor(const Tensor&)>;
Tensor tiled_rows(const RowFunction& function, const Tensor& input, int64_t tile_rows);
// Tiles run by tiled_rows since the counter was last reset (per thread; forward and backward each count).
size_t tiled_row_tile_count();
void reset_tiled_row_tile_count();

struct CheckpointPolicy {
    bool enabled = false;   // gradient_checkpointing
    int every_n_layers = 1; // checkpoint blocks 1, 1+n, 1+2n, ... (1-based); 1 = all
    int segment_size = 1;   // consecutive blocks per checkpointed segment; 0 means ceil(sqrt(L))
    bool offload = false;   // saved segment inputs live in pinned host memory
    // With offload: bring the next segment's inputs back one segment ahead in backward (see checkpoint()).
    // Costs one segment input of device memory more; ignored without offload.
    bool prefetch = false;
    std::string to_string() const;
    // The rules without which no segments can be planned (every_n_layers, segment_size, named as Hugging Face
    // and train_gpt spell them): the first broken one, or nullopt. plan_segments and the trainer's step shape
    // both ask this, so no rule is written twice. offload without enabled, or prefetch without offload, is
    // ignored here; a training run refuses it (StepShape::problem, planner/step_shape.h).
    std::optional<ConfigProblem> problem() const;
    bool operator==(const CheckpointPolicy&) const = default;
};

// A run of consecutive checkpointable layers (0-based first layer), and whether it is checkpointed.
struct Segment {
    int first_layer = 0;
    int layer_count = 1;
    bool checkpointed = false;
};

// Splits `layer_count` checkpointable layers into segments under the policy. Layers are grouped into runs
// of segment_size; of those runs, the 1st and every n-th after it (1-based 1, 1+n, 1+2n, ...) are
// checkpointed and the rest keep their activations. With segment_size 1 this is Hugging Face's
// every_n_layers. A disabled policy gives one plain segment per layer. Throws on a policy with a problem().
std::vector<Segment> plan_segments(int layer_count, const CheckpointPolicy& policy);

// Segments recomputed since the counter was last reset (per thread), for tests and benchmarks.
size_t recomputed_segment_count();
void reset_recomputed_segment_count();
// Segments whose offloaded inputs were brought back ahead of their backward (per thread, since the reset).
size_t prefetched_segment_count();
void reset_prefetched_segment_count();

} // namespace engine::checkpoint
