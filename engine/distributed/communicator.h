// Data-parallel communication, the engine's one place for it: all-reduce (sum) of gradient buffers, of a count
// and of a value, broadcast and barrier, over Open MPI (host tensors), NCCL (CUDA tensors, bootstrapped over
// MPI) or a single-process no-op. Only the trainer and the programs that set it up call it (docs/DISTRIBUTED.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace engine::distributed {

enum class Backend { none, mpi, nccl };
enum class Element { f32, f64, i64 }; // what a backend sums
Backend parse_backend(const std::string& name); // "none" | "mpi" | "nccl"
const char* backend_name(Backend backend);
bool backend_built(Backend backend); // mpi: built with MPI; nccl: a real CUDA build with NCCL and MPI

// What the communicator did, so that tests and logs can show one gradient reduction per optimizer step.
struct CommunicatorCounters {
    int64_t gradient_all_reduces = 0; // all_reduce_gradients calls (each covers every buffer given)
    int64_t count_all_reduces = 0;    // all_reduce_count calls
    int64_t value_all_reduces = 0;    // all_reduce_value calls (the step's loss sum, replica checks)
    int64_t reduce_scatters = 0;      // ZeRO-1: the gradients, one per step
    int64_t all_gathers = 0;          // ZeRO-1: the parameters, one per step
    int64_t reduces = 0;              // ZeRO-2: a window of gradients summed onto the rank that owns it
    int64_t broadcasts = 0;
    int64_t barriers = 0;
    int64_t backend_calls = 0;  // MPI/NCCL collectives issued (buckets of a gradient reduction count one each)
    int64_t bytes_reduced = 0;  // payload of the all-reduces, reduce-scatters and reduces, per rank
    CommunicatorCounters operator-(const CommunicatorCounters& earlier) const;
};

// The process group: every rank makes the same calls in the same order (collectives). A failing call throws
// EngineError naming the rank, the call and the backend's message; nothing exits or aborts.
class Communicator {
public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }
    int world_size() const { return world_size_; }
    // Index among the ranks on this host, and their number: chooses the GPU of a rank.
    int local_rank() const { return local_rank_; }
    int local_size() const { return local_size_; }
    Backend backend() const { return backend_; }
    const CommunicatorCounters& counters() const { return counters_; }

    // Sums every buffer over the ranks, in place: f32 or f64, all on the backend's device (host for mpi, cuda
    // for nccl). The buffers are flattened into buckets of up to bucket_bytes, so a model costs a few calls.
    void all_reduce_gradients(const std::vector<Tensor>& buffers);
    int64_t all_reduce_count(int64_t count);   // the sum of `count` over the ranks
    double all_reduce_value(double value);     // the sum of `value` over the ranks (host, in double)
    // Every rank's `tensor` takes root's values (any device the backend handles).
    void broadcast(const Tensor& tensor, int root = 0);
    // Elements [first, first + count) of every rank's `tensor` take root's (ZeRO-1's save, a tensor's part at a time).
    void broadcast_range(const Tensor& tensor, int64_t first, int64_t count, int root);
    // ZeRO-1's pair over a buffer of world_size equal parts (1-D, same device and dtype as `shard`):
    // reduce_scatter leaves in `shard` the sum over the ranks of part rank() of `flat`; all_gather fills part r
    // of `flat` with rank r's `shard`.
    void reduce_scatter(const Tensor& flat, const Tensor& shard);
    void all_gather(const Tensor& shard, const Tensor& flat);
    // ZeRO-2's: the sum over the ranks of the first `count` elements of every rank's `send` lands in root's
    // `receive` (its first `count`); the other ranks' `receive` is untouched. Same device and dtype, 1-D.
    void reduce(const Tensor& send, const Tensor& receive, int64_t count, int root);
    void barrier();

    static constexpr size_t bucket_bytes = size_t{32} << 20;

protected:
    Communicator(Backend backend, int rank, int world_size, int local_rank, int local_size);
    // Backend primitives. `data` holds `count` elements of `dtype` on the backend's device.
    virtual void sum_in_place(void* data, int64_t count, DType dtype, Device device, const char* call) = 0;
    virtual void sum_host(void* value, Element element, const char* call) = 0; // one host scalar
    virtual void broadcast_bytes(void* data, size_t bytes, Device device, int root) = 0;
    virtual void reduce_scatter_parts(const void* flat, void* shard, int64_t count, DType dtype, Device device) = 0;
    virtual void all_gather_parts(const void* shard, void* flat, int64_t count, DType dtype, Device device) = 0;
    virtual void reduce_to(const void* send, void* receive, int64_t count, DType dtype, Device device, int root) = 0;
    virtual void barrier_now() = 0;
    std::string where(const char* call) const; // "rank R of N, CALL" for error messages

private:
    void sum_scalar(void* value, Element element, const char* call); // counts it, then sum_host
    void check_parts(const Tensor& flat, const Tensor& shard, const char* call) const;
    Backend backend_;
    int rank_ = 0;
    int world_size_ = 1;
    int local_rank_ = 0;
    int local_size_ = 1;
    CommunicatorCounters counters_;
};

// The world size and rank the launcher (mpirun, srun under PMIx) gave this process, from its environment, or
// 1 and 0 without one. Reads no MPI, so it works in builds without MPI.
struct LaunchEnvironment {
    int world_size = 1;
    int rank = 0;
    bool launched = false; // a launcher's variables were found
};
LaunchEnvironment launch_environment();

// `none` gives the single-process no-op (world size 1). `mpi` and `nccl` initialise MPI when nobody has
// (finalised when the last communicator goes), and `nccl` binds this rank to GPU local_rank first: it throws
// when the ranks on a host outnumber its GPUs. A backend missing from this build throws "built without ...".
std::unique_ptr<Communicator> make_communicator(Backend backend);

// Ends every rank of the job now (MPI_Abort on the world communicator, with `exit_code`), for a rank that failed on
// its own while the others may be waiting for it in a collective, whatever the launcher does with a rank that exits.
// Returns, doing nothing, where no MPI runs (one process, a build without MPI, MPI not initialised or finalised).
// A communicator that goes while an exception unwinds leaves MPI initialised for this (engine/distributed/backends.h).
void abort_job(int exit_code);

} // namespace engine::distributed
