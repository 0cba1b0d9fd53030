// ZeRO stage 1 (docs/DISTRIBUTED.md): the parameters laid end to end are cut into world_size equal parts, and
// each rank keeps the optimizer state of its part and updates only it. Per step: the gradients reduce-scattered
// (each rank receives the sum of its part) a piece of every part at a time, the norm from the parts' sums of
// squares, the local update, and the parameters all-gathered piece by piece, after which every replica is bitwise
// the same again.
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
    ZeroShards(std::vector<Tensor> parameters, distributed::Communicator& communicator);

    ShardRange range() const { return {begin_, end_}; } // this rank's elements, for the optimizer
    // Sums every rank's gradients, keeping this rank's part: written back into its parameters' gradient
    // buffers (where the optimizer reads them); the other parts of the buffers are left as they were.
    void reduce_scatter_gradients();
    // The sum of squares of the summed gradients over all parts (one value all-reduce), from each rank's pieces as the
    // last reduce_scatter_gradients summed them, in piece order.
    double gradient_sum_of_squares();
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
};

} // namespace engine::optim
