// The batch-invariant mode's accumulation window (docs/TRAINING.md, "The big batch, bitwise"): every chunk's gradient
// folded into exact double sums on a fixed grid, so that the window's gradient has the same bits whatever split of the
// same sequences into micro-batches, accumulation steps and ranks produced it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/tensor.h"

namespace engine::optim {

// Why exact: a chunk's f32 gradient element g is rounded to the grid 2^-s (an integer multiple of it) and added into a
// double. While every partial sum stays below 2^53 grid steps, every add is exact, so the sum is the same in any order:
// accumulation, the ranks' all-reduce (an MPI or NCCL sum of doubles) and the chunks' order cannot move a bit. The grid
// of tensor i is s_i = 52 - ceil(log2 K) - e_i for K chunks in the window (over every rank) and a bound |g| <= 2^e_i
// on every chunk's elements: then K terms sum below 2^53 steps. e_i starts at every window at
// `initial_bound_exponent` (history-free, so a resumed run folds as the straight one); a window whose chunks broke a
// bound is redone with that tensor's bound raised to its largest element (redo_needed says which).
class FixedPointGradients {
public:
    static constexpr int initial_bound_exponent = 8; // |g| <= 256 per element per chunk, or the window is redone

    // Sums (f64, category gradients) beside each gradient buffer of `leaves`, on its device: 8 bytes a parameter.
    explicit FixedPointGradients(const std::vector<Tensor>& leaves);

    // Before a window's (or a redo's) first chunk: K chunks over every rank, sums zeroed, largest seen cleared. A redo
    // keeps the bounds the last redo_needed raised; a new window starts from initial_bound_exponent.
    void begin_window(int64_t chunks, bool redo);
    // After a chunk's backward: every leaf's gradient folded in and set back to zero.
    void fold(const std::vector<Tensor>& leaves);
    // After the last chunk: did any tensor's chunks (on any rank) pass its bound? If so the bounds of those tensors are
    // raised to fit the largest element seen (exact over the ranks: an all-gather), and the window must be redone. A
    // non-finite element is not a bound to raise: its NaN or Inf reaches the gradient, and the norm reports it.
    // A collective where `communicator` is given (one count all-reduce, and the all-gather when needed).
    bool redo_needed(distributed::Communicator* communicator);
    // The window's gradient into the leaves' buffers: the ranks' sums added (exactly) first, where a communicator is
    // given, then each rounded to f32 once.
    void finish(const std::vector<Tensor>& leaves, distributed::Communicator* communicator);

    int grid_exponent(size_t index) const; // s_i

private:
    std::vector<float> largest_values() const; // this rank's largest |g| per tensor, on the host

    std::vector<Tensor> sums_;          // per leaf, its shape, f64
    Tensor largest_;                    // (leaves) i32: the bits of the largest |g| folded this window
    std::vector<int> bound_exponents_;  // e_i
    int chunk_bits_ = 0;                // ceil(log2 K)
};

// The window's loss sum, exact in any order: each micro-batch's f32 sum (reported_losses, one value each) rounded to
// the grid 2^-s with s = 52 - ceil(log2(num_items_in_batch · 2^16)), so the terms and every partial sum over the ranks
// are exact while every chunk's loss stays below 2^16 per item (a diverged run's loss may break that; its weights do
// not depend on the reported loss). The caller adds the ranks' values (all_reduce_value: doubles, exact here).
double fixed_point_loss_sum(const std::vector<Tensor>& reported_losses, int64_t num_items_in_batch);

} // namespace engine::optim
