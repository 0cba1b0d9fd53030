// ZeRO stages 1 and 2 (docs/DISTRIBUTED.md): the parameters laid end to end are cut into world_size equal parts, and
// each rank keeps the optimizer state of its part and updates only it. Per step: the gradients reduce-scattered
// (each rank receives the sum of its part) a piece of every part at a time, the norm from the parts' sums of
// squares, the local update, and the parameters all-gathered piece by piece, after which every replica is bitwise
// the same again. Stage 2 also keeps the summed gradients of its part only, in a buffer of its own: a group of
// parameters' gradients (a checkpointed segment's, as its backward ends) is reduced onto the ranks that own them and
// added there, so that the group's whole buffers can go until its next backward. Stage 3 also keeps the masters of
// its part only of the parameters it is told (keep_shards_of: the checkpointed segments'), which the optimizer
// updates there: a group of them is gathered from their owners into storage given to it just before a use (a
// segment's forward, its recompute), and the storage goes after it.
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
    // Stage 3. parameters[indexes] (every rank passes the same) keep their masters as the ranks' shards only: this
    // rank's elements of them, in flat order, are copied now into a buffer of their own (category parameters; none
    // when it owns none of them), where the optimizer updates them (Optimizer::write_parameters_in with
    // parameter_offsets), and the caller may release their storage. The other parameters stay whole, each rank
    // updating its part of them in place. Once.
    void keep_shards_of(const std::vector<size_t>& indexes);
    const Tensor& shard_parameters() const { return shard_parameters_; }
    // Per parameter: where this rank's part of it starts in shard_parameters, or -1 where it is not kept there.
    const std::vector<int64_t>& parameter_offsets() const { return shard_offsets_; }
    // Every rank's part of parameters[indexes] (each with storage; every rank passes the same indexes) into every
    // rank's parameters: one broadcast per parameter and owner of some of its elements, in place in the parameter's
    // storage, where the owner first copies its values from its shard (a parameter kept whole holds them already).
    // Afterwards every rank's copies are the owners' values bit for bit.
    void gather_parameters(const std::vector<size_t>& indexes);
    // The same into working copies in another dtype (bf16 copies of f32 masters, `copies` parallel to the parameters,
    // each with storage, the masters' may be released): each owner rounds its part from its shard into the copy and
    // broadcasts that, so half the bytes of a master travel and no master needs storage. Every rank's copies are then
    // the ones refresh_working_copies would round from the gathered masters, bit for bit.
    void gather_rounded(const std::vector<size_t>& indexes, const std::vector<Tensor>& copies);
    // The values the sharded parameters among parameters[indexes] hold now (given storage and written on every rank:
    // keep_shards_of's start, WholeParameters with `written`) become this rank's shard of them. Local: no collective.
    void take_parameters(const std::vector<size_t>& indexes);
    // parameters[index] whole, from its owners, a window of the collectives' buffer at a time, as gather_state_tensor
    // gathers a state tensor: `consume` gets each window's bytes (on the parameters' device, valid during the call),
    // in order. Nothing is allocated. A collective every rank calls with the same index.
    void gather_parameter(size_t index, const std::function<void(const void* bytes, size_t byte_count)>& consume);
    // This rank's elements of a sharded parameters[index] in its shard: (first element of the parameter, count,
    // where they are); count 0 where it owns none.
    struct ParameterPart {
        int64_t first = 0;
        int64_t count = 0;
        void* data = nullptr;
    };
    ParameterPart parameter_part(size_t index) const;
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
    // parameters[indexes]' elements as runs [begin, end) of the flat layout, neighbours merged; `what` names the
    // caller for the error on an index out of range.
    std::vector<std::pair<int64_t, int64_t>> runs_of(const std::vector<size_t>& indexes, const char* what) const;
    // For the gathers: per run of parameters[indexes], per owner, per parameter its elements touch, in that order (the
    // same on every rank): broadcast(index, first flat element, end, owner).
    void for_each_owned_range(const std::vector<size_t>& indexes, const char* what,
                              const std::function<void(size_t, int64_t, int64_t, int)>& broadcast) const;
    // The flat elements [offset, offset + count), gathered a window at a time: each owner copies its part from `mine`
    // (which holds this rank's elements from flat element mine_first on) and broadcasts it; then `consume`.
    void gather_windows(int64_t offset, int64_t count, const Tensor& mine, int64_t mine_first,
                        const std::function<void(const void*, size_t)>& consume);
    std::vector<Tensor> parameters_;
    distributed::Communicator& communicator_;
    distributed::ZeroPartition partition_;
    int64_t begin_ = 0, end_ = 0; // this rank's elements among all of them
    Tensor gathered_;              // (world_size · piece) elements: one piece of every rank's part
    Tensor piece_;                 // (piece) elements: this rank's
    double sum_of_squares_ = 0.0;  // of this rank's summed gradients, from the last reduce_scatter_gradients
    Tensor shard_gradients_;       // stage 2: (part) elements
    Tensor shard_parameters_;      // stage 3: this rank's elements of the sharded parameters
    std::vector<int64_t> shard_offsets_; // stage 3: per parameter, its part's first element in it, or -1
    std::vector<int64_t> flat_offsets_;  // each parameter's first element in the flat layout
    // Where this rank's elements of parameters[index] from flat element `flat` on are: its shard for a sharded one,
    // else its own storage.
    char* owned(size_t index, int64_t flat) const;
};

} // namespace engine::optim
