// ZeRO stage 1's three collectives around the sharded optimizer step, a piece of every rank's part at a time, and
// stage 2's reduction of a group of gradients onto their owners.
#include "optim/zero.h"

#include <algorithm>

#include "engine/elementwise.h"
#include "engine/ops.h"

namespace engine::optim {

ZeroShards::ZeroShards(std::vector<Tensor> parameters, distributed::Communicator& communicator, bool shard_gradients)
    : parameters_(std::move(parameters)), communicator_(communicator) {
    ENGINE_CHECK(!parameters_.empty(), "ZeRO: no parameters");
    int64_t total = 0;
    for (const Tensor& parameter : parameters_) {
        ENGINE_CHECK(parameter.device() == parameters_[0].device() && parameter.dtype() == parameters_[0].dtype(),
                     "ZeRO: parameter " << parameter.describe() << " differs in device or dtype from "
                                          << parameters_[0].describe());
        total += parameter.numel();
    }
    partition_ = distributed::ZeroPartition::of(total, communicator_.world_size(), dtype_size(parameters_[0].dtype()));
    // Every rank must cut the same pieces (the same parameters and ENGINE_ZERO_BUCKET_BYTES), or the collectives would
    // pair unlike buffers: checked once, every rank throwing alike.
    // Sums tell equal values apart from unequal ones only with a second, scrambled sum beside them.
    const int64_t ranks = communicator_.world_size();
    const auto scrambled = [](int64_t value) {
        uint64_t bits = static_cast<uint64_t>(value) * 0x9E3779B97F4A7C15ull;
        return static_cast<int64_t>((bits ^ (bits >> 29)) & 0xFFFFFFFFull);
    };
    const int64_t mine = partition_.piece * 1000003 + partition_.pieces;
    const int64_t sum = communicator_.all_reduce_count(partition_.piece);
    const int64_t scrambled_sum = communicator_.all_reduce_count(scrambled(mine));
    ENGINE_CHECK(sum == ranks * partition_.piece && scrambled_sum == ranks * scrambled(mine),
                 "ZeRO: the ranks cut their parts differently (this rank: " << partition_.pieces << " pieces of "
                     << partition_.piece << " elements): give every rank the same model and ENGINE_ZERO_BUCKET_BYTES");
    begin_ = partition_.begin(communicator_.rank());
    end_ = partition_.end(communicator_.rank());
    MemoryCategoryScope scope(MemoryCategory::workspace);
    gathered_ = Tensor::zeros({partition_.ranks * partition_.piece}, parameters_[0].dtype(), parameters_[0].device());
    piece_ = Tensor::zeros({partition_.piece}, parameters_[0].dtype(), parameters_[0].device());
    if (shard_gradients)
        shard_gradients_ = Tensor::zeros({partition_.part}, parameters_[0].dtype(), parameters_[0].device(),
                                         MemoryCategory::gradients);
    flat_offsets_.assign(parameters_.size() + 1, 0);
    for (size_t index = 0; index < parameters_.size(); ++index)
        flat_offsets_[index + 1] = flat_offsets_[index] + parameters_[index].numel();
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

int64_t ZeroShards::piece_start(int64_t rank, int64_t piece) const {
    return rank * partition_.part + piece * partition_.piece;
}

void ZeroShards::reduce_scatter_gradients() {
    const Device device = gathered_.device();
    const size_t element = dtype_size(gathered_.dtype());
    const int64_t size = partition_.piece;
    sum_of_squares_ = 0.0;
    for (int64_t piece = 0; piece < partition_.pieces; ++piece) {
        // Every rank's piece of the gradients side by side (zero past the last parameter), summed over the ranks into
        // this rank's piece, which goes back into its parameters' gradient buffers.
        if (piece_start(partition_.ranks - 1, piece) + size > partition_.total) gathered_.fill_zero();
        for (int64_t rank = 0; rank < partition_.ranks; ++rank) {
            const int64_t start = piece_start(rank, piece);
            for_each_overlap(parameters_, start, start + size, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
                copy_bytes(at(gathered_, rank * size + flat - start), device, at(parameter.grad(), first), device,
                           static_cast<size_t>(count) * element);
            });
        }
        communicator_.reduce_scatter(gathered_, piece_);
        // The norm's share of this piece, in piece order (the padding is zero in every rank's buffer).
        sum_of_squares_ += sum_of_squares(piece_);
        const int64_t start = piece_start(communicator_.rank(), piece);
        for_each_overlap(parameters_, start, start + size, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
            copy_bytes(at(parameter.grad(), first), device, at(piece_, flat - start), device,
                       static_cast<size_t>(count) * element);
        });
    }
}

double ZeroShards::gradient_sum_of_squares() {
    if (shard_gradients_.defined()) {
        // Stage 2: the same sums over the same pieces as stage 1's, each copied into the piece buffer first, so that
        // the norm is stage 1's bit for bit when the shard holds the same values.
        const size_t bytes = static_cast<size_t>(partition_.piece) * dtype_size(piece_.dtype());
        sum_of_squares_ = 0.0;
        for (int64_t piece = 0; piece < partition_.pieces; ++piece) {
            copy_bytes(piece_.raw_data(), piece_.device(), at(shard_gradients_, piece * partition_.piece),
                       shard_gradients_.device(), bytes);
            sum_of_squares_ += sum_of_squares(piece_);
        }
    }
    // Each rank's sum over its pieces (reduce_scatter_gradients), summed over the ranks.
    return communicator_.all_reduce_value(sum_of_squares_);
}

void ZeroShards::reduce_gradients(const std::vector<size_t>& indexes) {
    ENGINE_CHECK(shard_gradients_.defined(), "ZeRO: reduce_gradients is stage 2's; these shards keep no gradients");
    for (size_t index : indexes)
        ENGINE_CHECK(index >= parameters_.size() || parameters_[index].grad().defined(),
                     "ZeRO-2: parameter " << index << " of " << parameters_.size() << " has no gradient to reduce");
    const std::vector<std::pair<int64_t, int64_t>> runs = runs_of(indexes, "reduce_gradients");
    const Device device = piece_.device();
    const size_t element = dtype_size(piece_.dtype());
    const Tensor received = gathered_.with_rows(partition_.piece); // the first piece of the buffer
    for (const auto& [run_begin, run_end] : runs)
        for (int64_t owner = 0; owner < partition_.ranks; ++owner) {
            const int64_t first = std::max(run_begin, partition_.begin(owner)), last = std::min(run_end, partition_.end(owner));
            for (int64_t window = first; window < last; window += partition_.piece) {
                const int64_t count = std::min(partition_.piece, last - window);
                // Every rank packs its gradients of the window; their sum lands in the owner's buffer.
                for_each_overlap(parameters_, window, window + count,
                                 [&](const Tensor& parameter, int64_t from, int64_t flat, int64_t elements) {
                                     copy_bytes(at(piece_, flat - window), device, at(parameter.grad(), from), device,
                                                static_cast<size_t>(elements) * element);
                                 });
                communicator_.reduce(piece_, received, count, static_cast<int>(owner));
                if (owner != communicator_.rank()) continue;
                // Added into the shard, through the piece buffer (free again): shard += sum, elementwise, over the
                // window's elements only.
                char* shard = at(shard_gradients_, window - begin_);
                const size_t bytes = static_cast<size_t>(count) * element;
                copy_bytes(piece_.raw_data(), device, shard, device, bytes);
                accumulate_into(piece_.with_rows(count), received.with_rows(count));
                copy_bytes(shard, device, piece_.raw_data(), device, bytes);
            }
        }
}

std::vector<std::pair<int64_t, int64_t>> ZeroShards::runs_of(const std::vector<size_t>& indexes, const char* what) const {
    const std::vector<int64_t>& offsets = flat_offsets_;
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (size_t index : indexes) {
        ENGINE_CHECK(index < parameters_.size(), "ZeRO: " << what << ": parameter " << index << " of " << parameters_.size());
        if (!runs.empty() && runs.back().second == offsets[index]) runs.back().second = offsets[index + 1];
        else runs.emplace_back(offsets[index], offsets[index + 1]);
    }
    return runs;
}

void ZeroShards::keep_shards_of(const std::vector<size_t>& indexes) {
    ENGINE_CHECK(shard_offsets_.empty(), "ZeRO-3: keep_shards_of is called once");
    std::vector<int64_t> offsets(parameters_.size(), -1);
    int64_t count = 0; // this rank's elements of them, laid end to end in flat order
    std::vector<bool> kept(parameters_.size(), false);
    for (size_t index : indexes) {
        ENGINE_CHECK(index < parameters_.size(), "ZeRO-3: keep_shards_of: parameter " << index << " of " << parameters_.size());
        kept[index] = true;
    }
    for (size_t index = 0; index < parameters_.size(); ++index) {
        if (!kept[index]) continue;
        offsets[index] = count;
        count += std::max<int64_t>(0, std::min(flat_offsets_[index + 1], end_) - std::max(flat_offsets_[index], begin_));
    }
    Tensor shard;
    if (count > 0)
        shard = Tensor::empty({count}, parameters_[0].dtype(), parameters_[0].device(), MemoryCategory::parameters);
    shard_parameters_ = shard;
    shard_offsets_ = std::move(offsets);
    take_parameters(indexes); // local copies: a failure here is the device's, and the trainer's construction fails
}

char* ZeroShards::owned(size_t index, int64_t flat) const {
    const int64_t part_first = std::max(flat_offsets_[index], begin_); // the first element this rank owns of it
    if (shard_offsets_.empty() || shard_offsets_[index] < 0) return at(parameters_[index], flat - flat_offsets_[index]);
    return at(shard_parameters_, shard_offsets_[index] + flat - part_first);
}

void ZeroShards::for_each_owned_range(const std::vector<size_t>& indexes, const char* what,
                                      const std::function<void(size_t, int64_t, int64_t, int)>& broadcast) const {
    // One broadcast per parameter the owner's elements of a run touch, straight into the destination's storage (no
    // piece buffer, so as few calls as there are tensors).
    for (const auto& [run_begin, run_end] : runs_of(indexes, what))
        for (int64_t owner = 0; owner < partition_.ranks; ++owner) {
            const int64_t first = std::max(run_begin, partition_.begin(owner)), last = std::min(run_end, partition_.end(owner));
            for (size_t index = 0; index < parameters_.size() && first < last; ++index) {
                const int64_t from = std::max(first, flat_offsets_[index]), to = std::min(last, flat_offsets_[index + 1]);
                if (from < to) broadcast(index, from, to, static_cast<int>(owner));
            }
        }
}

void ZeroShards::gather_parameters(const std::vector<size_t>& indexes) {
    const size_t element = dtype_size(piece_.dtype());
    for_each_owned_range(indexes, "gather_parameters", [&](size_t index, int64_t from, int64_t to, int owner) {
        // The owner first copies its values there from its shard (a parameter kept whole holds them already, its
        // update wrote them).
        const Tensor& parameter = parameters_[index];
        if (owner == communicator_.rank()) {
            char* destination = at(parameter, from - flat_offsets_[index]);
            const char* source = owned(index, from);
            if (source != destination)
                copy_bytes(destination, parameter.device(), source, parameter.device(), static_cast<size_t>(to - from) * element);
        }
        communicator_.broadcast_range(parameter, from - flat_offsets_[index], to - from, owner);
    });
}

void ZeroShards::gather_rounded(const std::vector<size_t>& indexes, const std::vector<Tensor>& copies) {
    ENGINE_CHECK(copies.size() == parameters_.size(),
                 "ZeRO-3: gather_rounded: " << copies.size() << " copies for " << parameters_.size() << " parameters");
    for_each_owned_range(indexes, "gather_rounded", [&](size_t index, int64_t from, int64_t to, int owner) {
        const Tensor& copy = copies[index];
        ENGINE_CHECK(copy.numel() == parameters_[index].numel() && copy.device() == parameters_[index].device(),
                     "ZeRO-3: gather_rounded: " << copy.describe() << " is no working copy of " << parameters_[index].describe());
        if (owner == communicator_.rank())
            convert_elements(at(copy, from - flat_offsets_[index]), copy.dtype(), owned(index, from),
                             parameters_[index].dtype(), to - from, copy.device());
        communicator_.broadcast_range(copy, from - flat_offsets_[index], to - from, owner);
    });
}

void ZeroShards::take_parameters(const std::vector<size_t>& indexes) {
    const size_t element = dtype_size(parameters_[0].dtype());
    for (size_t index : indexes) {
        ENGINE_CHECK(index < parameters_.size(), "ZeRO-3: take_parameters: parameter " << index << " of " << parameters_.size());
        if (shard_offsets_.empty() || shard_offsets_[index] < 0) continue; // kept whole: nothing to take
        const int64_t first = std::max(flat_offsets_[index], begin_), last = std::min(flat_offsets_[index + 1], end_);
        if (first >= last) continue;
        copy_bytes(owned(index, first), shard_parameters_.device(), at(parameters_[index], first - flat_offsets_[index]),
                   parameters_[index].device(), static_cast<size_t>(last - first) * element);
    }
}

void ZeroShards::zero_shard_gradients() {
    if (shard_gradients_.defined()) shard_gradients_.fill_zero();
}

void ZeroShards::all_gather_parameters() {
    const Device device = gathered_.device();
    const size_t element = dtype_size(gathered_.dtype());
    const int64_t size = partition_.piece;
    for (int64_t piece = 0; piece < partition_.pieces; ++piece) {
        const int64_t own = piece_start(communicator_.rank(), piece);
        for_each_overlap(parameters_, own, own + size, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
            copy_bytes(at(piece_, flat - own), device, at(parameter, first), device, static_cast<size_t>(count) * element);
        });
        communicator_.all_gather(piece_, gathered_);
        for (int64_t rank = 0; rank < partition_.ranks; ++rank) {
            const int64_t start = piece_start(rank, piece);
            for_each_overlap(parameters_, start, start + size, [&](const Tensor& parameter, int64_t first, int64_t flat, int64_t count) {
                copy_bytes(at(parameter, first), device, at(gathered_, rank * size + flat - start), device,
                           static_cast<size_t>(count) * element);
            });
        }
    }
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
    // This rank's part of the tensor: its live state tensor of that name.
    Tensor mine;
    for (const auto& [name, state] : optimizer.named_state())
        if (name == layout[index].first) mine = state;
    const int64_t mine_first = std::max(offset, begin_); // the flat element mine starts at
    if (mine.defined())
        ENGINE_CHECK(mine.numel() == std::min(offset + parameter.numel(), end_) - mine_first,
                     "ZeRO-1: this rank's part of " << layout[index].first << " is not its elements [" << mine_first
                                                    << ", " << end_ << ")");
    gather_windows(offset, parameter.numel(), mine, mine_first, [&](const void* bytes, size_t byte_count) {
        consume(layout[index].first, parameter, bytes, byte_count, gathered_.device());
    });
}

void ZeroShards::gather_parameter(size_t index, const std::function<void(const void*, size_t)>& consume) {
    ENGINE_CHECK(index < parameters_.size(), "ZeRO: gather_parameter: parameter " << index << " of " << parameters_.size());
    const int64_t offset = flat_offsets_[index], part_first = std::max(offset, begin_);
    const bool sharded = !shard_offsets_.empty() && shard_offsets_[index] >= 0;
    // What gather_windows reads this rank's elements from: mine, holding flat element mine_first at its element 0.
    if (sharded) {
        gather_windows(offset, parameters_[index].numel(), shard_parameters_, part_first - shard_offsets_[index], consume);
    } else {
        gather_windows(offset, parameters_[index].numel(), parameters_[index], offset, consume);
    }
}

ZeroShards::ParameterPart ZeroShards::parameter_part(size_t index) const {
    ENGINE_CHECK(index < parameters_.size() && !shard_offsets_.empty() && shard_offsets_[index] >= 0,
                 "ZeRO-3: parameter " << index << " of " << parameters_.size() << " is not kept as shards");
    const int64_t first = std::max(flat_offsets_[index], begin_), last = std::min(flat_offsets_[index + 1], end_);
    if (first >= last) return {};
    return {first - flat_offsets_[index], last - first, owned(index, first)};
}

void ZeroShards::gather_windows(int64_t offset, int64_t count, const Tensor& mine, int64_t mine_first,
                                const std::function<void(const void*, size_t)>& consume) {
    const size_t element = dtype_size(gathered_.dtype());
    // A window at a time, as large as the collectives' buffer: each rank's part of it broadcast by its owner into the
    // buffer, then handed on. The device holds no more of the tensor than the buffer it has.
    const int64_t window = gathered_.numel();
    for (int64_t from = offset; from < offset + count; from += window) {
        const int64_t to = std::min(from + window, offset + count);
        for (int64_t rank = 0; rank < partition_.ranks; ++rank) {
            const int64_t first = std::max(from, partition_.begin(rank)), last = std::min(to, partition_.end(rank));
            if (first >= last) continue;
            if (rank == communicator_.rank()) {
                ENGINE_CHECK(mine.defined(), "ZeRO: this rank holds no part of elements [" << first << ", " << last << ")");
                copy_bytes(at(gathered_, first - from), gathered_.device(), at(mine, first - mine_first), mine.device(),
                           static_cast<size_t>(last - first) * element);
            }
            communicator_.broadcast_range(gathered_, first - from, last - first, static_cast<int>(rank));
        }
        consume(gathered_.raw_data(), static_cast<size_t>(to - from) * element);
    }
}

} // namespace engine::optim
