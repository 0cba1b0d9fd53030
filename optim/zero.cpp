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

void ZeroShards::gather_state(const Optimizer& optimizer, const StateConsumer& consume) {
    const Device device = flat_.device();
    // The kinds of state ("exp_avg", "exp_avg_sq"), in order: the name's part before the parameter's.
    std::vector<std::string> kinds;
    const std::vector<Optimizer::StateShard> shards = optimizer.state_shards();
    for (const Optimizer::StateShard& shard : shards) {
        const std::string kind = shard.name.substr(0, shard.name.find('.'));
        if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    }
    const std::vector<std::string> names = optimizer.parameter_names();
    for (size_t kind = 0; kind < kinds.size(); ++kind) {
        // This rank's shards of one kind lie in slot order, end to end: exactly its part of the flat layout.
        int64_t filled = 0;
        for (const Optimizer::StateShard& shard : shards) {
            if (shard.name.compare(0, kinds[kind].size() + 1, kinds[kind] + ".") != 0) continue;
            copy_bytes(at(part_, filled), device, shard.state.raw_data(), device, shard.state.nbytes());
            filled += shard.state.numel();
        }
        communicator_.all_gather(part_, flat_);
        size_t index = 0;
        for_each_overlap(parameters_, 0, flat_.numel(), [&](const Tensor& parameter, int64_t, int64_t flat, int64_t) {
            consume(kinds[kind] + "." + names[index++], parameter, at(flat_, flat), device);
        });
    }
}

} // namespace engine::optim
