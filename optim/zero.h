// ZeRO stages 1 and 2 (docs/DISTRIBUTED.md): the parameters laid end to end are cut into world_size equal parts, and
// each rank keeps the optimizer state of its part and updates only it. Per step: the gradients reduce-scattered
// (each rank receives the sum of its part) a piece of every part at a time, the norm from the parts' sums of
// squares, the local update, and the parameters all-gathered piece by piece, after which every replica is bitwise
// the same again. Stage 2 also keeps the summed gradients of its part only, in a buffer of its own: a group of
// parameters' gradients (a checkpointed segment's, as its backward ends) is reduced onto the ranks that own them and
// added there, so that the group's whole buffers can go until its next backward.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/distributed/zero_partition.h"
#include "optim/optimizer.h"

namespace engine::optim {

class ZeroShards {
public:
    // The parameters in the optimizer's order, all on one device with one dtype, laid end to end and cut into
    // world_size parts (distributed::ZeroPartition). Allocates the collectives' buffers (workspace): one piece of
    // every rank's part and this rank's piece, (N + 1)/N of distributed::zero_bucket_bytes at most whatever the model.
    // shard_gradients (stage 2): also a buffer of this rank's part of the gradients (category gradients, zero).
    ZeroShards(std::vector<Tensor> parameters, distributed::Communicator& communicator, bool shard_gradients = false);

    ShardRange range() const { return {begin_, end_}; } // this rank's elements, for the optimizer
    // Sums every rank's gradients, keeping this rank's part: written back into its parameters' gradient
    // buffers (where the optimizer reads them); the other parts of the buffers are left as they were.
    void reduce_scatter_gradients();
    // The sum of squares of the summed gradients over all parts (one value all-reduce), from each rank's pieces as the
    // last reduce_scatter_gradients summed them (stage 2: as its shard gradients hold them), in piece order.
    double gradient_sum_of_squares();
    // Stage 2. This rank's summed gradients: (part) elements, its part of the flat layout (zero past the last
    // parameter), what the optimizer reads (Optimizer::read_gradients_from).
    const Tensor& shard_gradients() const { return shard_gradients_; }
    // Sums every rank's gradients of parameters[indexes] (each with its buffer attached; every rank passes the same
    // indexes) onto the ranks that own them, each adding its sum into its shard gradients: one reduce per owner
    // and piece-long window of the indexes' elements, through the collectives' buffers. The buffers are read only.
    void reduce_gradients(const std::vector<size_t>& indexes);
    void zero_shard_gradients();
    // Every rank's updated part into every rank's parameters.
    void all_gather_parameters();
    // The optimizer's sharded state is gathered whole one tensor at a time, in a state file's order (parameter by
    // parameter, every kind of state of each): state_layout lists that order's names (as an unsharded optimizer's
    // named_state() names them) with their parameters (shape and dtype), gathering nothing; gather_state_tensor gathers
    // the index-th, a window of it at a time: each rank broadcasts its part of the window into the collectives'
    // buffer, where `consume` gets it with the tensor's name, its parameter and the window's bytes on `device`, valid
    // during the call; the windows come in order. Nothing is allocated: saving under ZeRO-1 holds no gathered copy of
    // the state, on the device or (streamed to the file) on the host. A collective every rank calls with the same index.
    using StateConsumer = std::function<void(const std::string& name, const Tensor& parameter, const void* bytes,
                                             size_t byte_count, Device device)>;
    std::vector<std::pair<std::string, Tensor>> state_layout(const Optimizer& optimizer) const;
    void gather_state_tensor(const Optimizer& optimizer, size_t index, const StateConsumer& consume);

private:
    int64_t piece_start(int64_t rank, int64_t piece) const; // the flat element where rank's piece begins
    std::vector<Tensor> parameters_;
    distributed::Communicator& communicator_;
    distributed::ZeroPartition partition_;
    int64_t begin_ = 0, end_ = 0; // this rank's elements among all of them
    Tensor gathered_;              // (world_size · piece) elements: one piece of every rank's part
    Tensor piece_;                 // (piece) elements: this rank's
    double sum_of_squares_ = 0.0;  // of this rank's summed gradients, from the last reduce_scatter_gradients
    Tensor shard_gradients_;       // stage 2: (part) elements
};

} // namespace engine::optim
