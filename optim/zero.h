// ZeRO stage 1 (docs/DISTRIBUTED.md): the parameters laid end to end are cut into world_size equal parts, and
// each rank keeps the optimizer state of its part and updates only it. Per step: one reduce-scatter of the
// gradients (each rank receives the sum of its part), the norm from the parts' sums of squares, the local
// update, and one all-gather of the parameters, after which every replica is bitwise the same again.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/distributed/communicator.h"
#include "optim/optimizer.h"

namespace engine::optim {

class ZeroShards {
public:
    // The parameters in the optimizer's order, all on one device with one dtype. Allocates the flat buffer
    // (all the parameters' elements, padded to world_size equal parts) and this rank's part (workspace).
    ZeroShards(std::vector<Tensor> parameters, distributed::Communicator& communicator);

    ShardRange range() const { return {begin_, end_}; } // this rank's elements, for the optimizer
    // Sums every rank's gradients, keeping this rank's part: written back into its parameters' gradient
    // buffers (where the optimizer reads them); the other parts of the buffers are left as they were.
    void reduce_scatter_gradients();
    // The sum of squares of the summed gradients over all parts (one value all-reduce).
    double gradient_sum_of_squares();
    // Every rank's updated part into every rank's parameters.
    void all_gather_parameters();
    // The optimizer's sharded state gathered whole, one tensor at a time in a state file's order (parameter by
    // parameter, every kind of state of each): each rank broadcasts its part of the tensor into the flat buffer the
    // step uses anyway, where `consume` gets it with its name (as an unsharded optimizer's named_state() names it),
    // its parameter (shape and dtype) and its bytes on `device`, valid during the call. Nothing is allocated: saving
    // under ZeRO-1 holds no gathered copy of the state, on the device or (streamed to the file) on the host. A
    // collective: every rank calls it.
    using StateConsumer =
        std::function<void(const std::string& name, const Tensor& parameter, const void* bytes, Device device)>;
    void gather_state(const Optimizer& optimizer, const StateConsumer& consume);
    // The same, one tensor: the index-th of that order (a collective every rank calls with the same index).
    void gather_state_tensor(const Optimizer& optimizer, size_t index, const StateConsumer& consume);
    // That order's names with their parameters (shape and dtype), without gathering anything.
    std::vector<std::pair<std::string, Tensor>> state_layout(const Optimizer& optimizer) const;

private:
    std::vector<Tensor> parameters_;
    distributed::Communicator& communicator_;
    int64_t begin_ = 0, end_ = 0; // this rank's elements among all of them
    Tensor flat_;                  // (world_size · part) elements
    Tensor part_;                  // (part) elements
};

} // namespace engine::optim
