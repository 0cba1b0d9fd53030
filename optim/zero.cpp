// ZeRO stage 1's three collectives around the sharded optimizer step, over one flat buffer.
#include "optim/zero.h"

#include <algorithm>

#include "engine/elementwise.h"

namespace engine::optim {

ZeroShards::ZeroShards(std::vector<Tensor> parameters, distributed::Communicator& communicator)
    : parameters_(std::move(parameters)), communicator_(communicator) {
    ENGINE_CHECK(!parameters_.empty(), "ZeRO-1: no parameters");
    int64_t total = 0;
    for (const Tensor& parameter : parameters_) {
        ENGINE_CHECK(parameter.device() == parameters_[0].device() && parameter.dtype() == parameters_[0].dtype(),
                     "ZeRO-1: parameter " << parameter.describe() << " differs in device or dtype from "
                                          << parameters_[0].describe());
        total += parameter.numel();
    }
    const int64_t ranks = communicator_.world_size();
    const int64_t part = (total + ranks - 1) / ranks;
    begin_ = std::min(total, communicator_.rank() * part);
    end_ = std::min(total, begin_ + part);
    MemoryCategoryScope scope(MemoryCategory::workspace);
    flat_ = Tensor::zeros({part * ranks}, parameters_[0].dtype(), parameters_[0].device());
    part_ = Tensor::zeros({part}, parameters_[0].dtype(), parameters_[0].device());
}

namespace {

// Calls visit(tensor, first element of the tensor, first element in the flat layout, count) for the
// elements of `tensors` (laid end to end) inside [begin, end).
template <typename Visit>
void for_each_overlap(const std::vector<Tensor>& tensors, int64_t begin, int64_t end, Visit&& visit) {
    int64_t offset = 0;
    for (const Tensor& tensor : tensors) {
        const int64_t first = std::max(offset, begin), last = std::min(offset + tensor.numel(), end);
        if (first < last) visit(tensor, first - offset, first, last - first);
        offset += tensor.numel();
    }
}

char* at(const Tensor& tensor, int64_t element) {
    return static_cast<char*>(tensor.raw_data()) + element * static_cast<int64_t>(dtype_size(tensor.dtype()));
}

} // namespace

void ZeroShards::reduce_scatter_gradients() {
    const Device device = flat_.device();
    const size_t element = dtype_size(flat_.dtype());
    for_each_overlap(parameters_, 0, flat_.numel(), [&](const Tensor& parameter, int64_t, int64_t flat, int64_t count) {
        copy_bytes(at(flat_, flat), device, parameter.grad().raw_data(), device, static_cast<size_t>(count) * element);
    });
    communicator_.reduce_scatter(flat_, part_);
    for_each_overlap(parameters_, begin_, end_, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
        copy_bytes(at(parameter.grad(), first), device, at(part_, flat - begin_), device, static_cast<size_t>(count) * element);
    });
}

double ZeroShards::gradient_sum_of_squares() {
    // The padding after the last parameter is zero in every rank's flat buffer, so its sum is zero too.
    return communicator_.all_reduce_value(sum_of_squares(part_));
}

void ZeroShards::all_gather_parameters() {
    const Device device = flat_.device();
    const size_t element = dtype_size(flat_.dtype());
    for_each_overlap(parameters_, begin_, end_, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
        copy_bytes(at(part_, flat - begin_), device, at(parameter, first), device, static_cast<size_t>(count) * element);
    });
    communicator_.all_gather(part_, flat_);
    for_each_overlap(parameters_, 0, flat_.numel(), [&](const Tensor& parameter, int64_t, int64_t flat, int64_t count) {
        copy_bytes(parameter.raw_data(), device, at(flat_, flat), device, static_cast<size_t>(count) * element);
    });
}

std::vector<std::pair<std::string, Tensor>> ZeroShards::state_layout(const Optimizer& optimizer) const {
    const std::vector<std::string> names = optimizer.parameter_names();
    ENGINE_CHECK(names.size() == parameters_.size(), "ZeRO-1: the optimizer has " << names.size()
                                                         << " parameters, the shards " << parameters_.size());
    std::vector<std::pair<std::string, Tensor>> layout;
    for (size_t slot = 0; slot < names.size(); ++slot)
        for (const std::string& kind : optimizer.state_kinds()) layout.emplace_back(kind + "." + names[slot], parameters_[slot]);
    return layout;
}

void ZeroShards::gather_state_tensor(const Optimizer& optimizer, size_t index, const StateConsumer& consume) {
    const std::vector<std::pair<std::string, Tensor>> layout = state_layout(optimizer);
    ENGINE_CHECK(index < layout.size(), "ZeRO-1: optimizer state tensor " << index << " of " << layout.size());
    const size_t slot = index / optimizer.state_kinds().size();
    int64_t offset = 0; // the parameter's first element in the flat layout
    for (size_t earlier = 0; earlier < slot; ++earlier) offset += parameters_[earlier].numel();
    const Tensor& parameter = parameters_[slot];
    const int64_t part = part_.numel();
    // Each rank's part of the tensor, broadcast by its owner into the tensor's place in the flat buffer.
    for (int64_t rank = 0; rank < communicator_.world_size(); ++rank) {
        const int64_t first = std::max(offset, rank * part);
        const int64_t last = std::min(offset + parameter.numel(), (rank + 1) * part);
        if (first >= last) continue;
        if (rank == communicator_.rank()) {
            // This rank's part: its live state tensor of that name, exactly [first, last).
            Tensor mine;
            for (const auto& [name, state] : optimizer.named_state())
                if (name == layout[index].first) mine = state;
            ENGINE_CHECK(mine.defined() && mine.numel() == last - first,
                         "ZeRO-1: this rank's part of " << layout[index].first << " is not its " << last - first
                                                        << " elements");
            copy_bytes(at(flat_, first), flat_.device(), mine.raw_data(), mine.device(), mine.nbytes());
        }
        communicator_.broadcast_range(flat_, first, last - first, static_cast<int>(rank));
    }
    consume(layout[index].first, parameter, at(flat_, offset), flat_.device());
}

void ZeroShards::gather_state(const Optimizer& optimizer, const StateConsumer& consume) {
    const size_t count = state_layout(optimizer).size();
    for (size_t index = 0; index < count; ++index) gather_state_tensor(optimizer, index, consume);
}

} // namespace engine::optim
