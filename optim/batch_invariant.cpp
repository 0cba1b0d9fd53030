// The batch-invariant mode's accumulation window: bounds, grids, the redo decision and the exact reduction.
#include "optim/batch_invariant.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "engine/fixed_point.h"

namespace engine::optim {
namespace {

int ceil_log2(int64_t value) {
    int bits = 0;
    while ((int64_t{1} << bits) < value) ++bits;
    return bits;
}

} // namespace

FixedPointGradients::FixedPointGradients(const std::vector<Tensor>& leaves)
    : bound_exponents_(leaves.size(), initial_bound_exponent) {
    ENGINE_CHECK(!leaves.empty(), "batch_invariant: no parameter to accumulate");
    sums_.reserve(leaves.size());
    for (const Tensor& leaf : leaves) {
        const Tensor& gradient = leaf.grad();
        ENGINE_CHECK(gradient.defined() && gradient.dtype() == DType::f32,
                     "batch_invariant: the fixed-point fold needs f32 gradient buffers; parameter "
                         << leaf.describe() << " has " << (gradient.defined() ? gradient.describe() : std::string("none")));
        ENGINE_CHECK(gradient.device() == leaves.front().grad().device(),
                     "batch_invariant: parameter " << leaf.describe() << " has its gradient on "
                         << device_name(gradient.device()) << ", the first on "
                         << device_name(leaves.front().grad().device()) << ": the sums need one device");
        sums_.push_back(Tensor::zeros(gradient.shape(), DType::f64, gradient.device(), MemoryCategory::gradients));
    }
    largest_ = Tensor::zeros({static_cast<int64_t>(leaves.size())}, DType::i32, leaves.front().grad().device(),
                             MemoryCategory::gradients);
}

void FixedPointGradients::begin_window(int64_t chunks, bool redo) {
    ENGINE_CHECK(chunks > 0 && chunks <= (int64_t{1} << 30),
                 "batch_invariant: " << chunks << " chunks in a window; it takes 1 to 2^30");
    chunk_bits_ = ceil_log2(chunks);
    if (!redo) std::fill(bound_exponents_.begin(), bound_exponents_.end(), initial_bound_exponent);
    for (Tensor& sum : sums_) sum.fill_zero();
    largest_.fill_zero();
}

int FixedPointGradients::grid_exponent(size_t index) const { return 52 - chunk_bits_ - bound_exponents_.at(index); }

void FixedPointGradients::fold(const std::vector<Tensor>& leaves) {
    ENGINE_CHECK(leaves.size() == sums_.size(), "batch_invariant: " << leaves.size() << " leaves, " << sums_.size() << " sums");
    for (size_t index = 0; index < leaves.size(); ++index)
        fixed_point_fold(sums_[index], largest_, static_cast<int64_t>(index), leaves[index].grad(), grid_exponent(index));
}

std::vector<float> FixedPointGradients::largest_values() const {
    std::vector<float> values;
    for (int32_t bits : largest_.to_vector<int32_t>()) values.push_back(fixed_point_largest_value(bits));
    return values;
}

bool FixedPointGradients::redo_needed(distributed::Communicator* communicator) {
    std::vector<float> largest = largest_values();
    int64_t broken = 0;
    for (size_t index = 0; index < largest.size(); ++index)
        if (std::isfinite(largest[index]) && largest[index] > std::ldexp(1.0f, bound_exponents_[index])) ++broken;
    if (communicator != nullptr) broken = communicator->all_reduce_count(broken);
    if (broken == 0) return false;
    if (communicator != nullptr && communicator->world_size() > 1) {
        // Every rank's largest, so that all raise the same bounds to the same exponents: a max is exact in any order.
        const Device device = sums_.front().device();
        const int64_t count = static_cast<int64_t>(largest.size());
        const Tensor mine = Tensor::from_vector<float>(largest, {count}, device, MemoryCategory::workspace);
        const Tensor every = Tensor::zeros({count * communicator->world_size()}, DType::f32, device,
                                           MemoryCategory::workspace);
        communicator->all_gather(mine, every);
        const std::vector<float> gathered = every.to_vector<float>();
        for (size_t index = 0; index < largest.size(); ++index)
            for (int rank = 0; rank < communicator->world_size(); ++rank) {
                const float value = gathered[static_cast<size_t>(rank) * largest.size() + index];
                if (std::isfinite(value) && std::isfinite(largest[index])) largest[index] = std::max(largest[index], value);
            }
    }
    for (size_t index = 0; index < largest.size(); ++index) {
        if (!std::isfinite(largest[index]) || largest[index] <= std::ldexp(1.0f, bound_exponents_[index])) continue;
        int exponent = 0;
        std::frexp(largest[index], &exponent); // largest < 2^exponent
        bound_exponents_[index] = exponent;
    }
    return true;
}

void FixedPointGradients::finish(const std::vector<Tensor>& leaves, distributed::Communicator* communicator) {
    // Doubles that are integers on one grid below 2^53 steps: the backend's sum is exact whatever its order.
    if (communicator != nullptr) communicator->all_reduce_gradients(sums_);
    for (size_t index = 0; index < leaves.size(); ++index) fixed_point_round(leaves[index].grad(), sums_[index]);
}

double fixed_point_loss_sum(const std::vector<Tensor>& reported_losses, int64_t num_items_in_batch) {
    const int exponent = 52 - ceil_log2(std::max<int64_t>(num_items_in_batch, 1)) - 16;
    double sum = 0.0;
    for (const Tensor& loss : reported_losses)
        sum += std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(loss.item()), exponent)), -exponent);
    return sum;
}

} // namespace engine::optim
