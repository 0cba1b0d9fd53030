// The NCCL backend: gradient buffers and broadcasts of CUDA tensors on the engine's compute stream, one GPU per
// rank. Bootstrapped over MPI as llm.c does (rank 0 makes the ncclUniqueId, MPI_Bcast, ncclCommInitRank); host
// scalars (the token count, the loss sum) go over MPI, which needs no device round trip for a number the host
// already holds. Compiled only in real CUDA builds: the emulated device has no NCCL.
#include <exception>

#include <nccl.h>

#include "base/cuda/check.h"
#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/distributed/backends.h"

namespace engine::distributed {
namespace {

void check_nccl(ncclResult_t result, const std::string& where, const char* call) {
    ENGINE_CHECK(result == ncclSuccess, where << ": " << call << " failed: " << ncclGetErrorString(result)
                                             << (result == ncclSystemError || result == ncclRemoteError
                                                     ? " (NCCL_DEBUG=WARN tells more)"
                                                     : ""));
}

ncclDataType_t nccl_type(DType dtype) {
    return element_of(dtype) == Element::f32 ? ncclFloat32 : ncclFloat64;
}

class NcclCommunicator final : public Communicator {
public:
    explicit NcclCommunicator(std::unique_ptr<mpi::Session> session)
        : Communicator(Backend::nccl, session->rank, session->world_size, session->local_rank, session->local_size),
          session_(std::move(session)) {
        const int devices = cuda::device_count();
        ENGINE_CHECK(devices > 0, where("startup") << ": no visible CUDA device on this host; the nccl backend needs "
                                                       "one GPU per rank (the mpi backend reduces host tensors)");
        ENGINE_CHECK(local_size() <= devices,
                     where("startup") << ": " << local_size() << " ranks on this host but " << devices
                                      << " visible CUDA devices; launch at most one rank per GPU (mpirun -np "
                                      << devices << " per host)");
        cuda::select_device(local_rank());
        cuda::ensure_initialized();
        ncclUniqueId id{};
        if (rank() == 0) check_nccl(ncclGetUniqueId(&id), where("startup"), "ncclGetUniqueId");
        mpi::broadcast_bytes(&id, sizeof id, 0, where("startup"));
        check_nccl(ncclCommInitRank(&comm_, world_size(), id, rank()), where("startup"), "ncclCommInitRank");
    }
    ~NcclCommunicator() override {
        // While an exception unwinds the other ranks may never join this communicator's pending work: abort it
        // instead of waiting for that work to finish.
        if (comm_ != nullptr) (void)(std::uncaught_exceptions() > 0 ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
    }

protected:
    void sum_in_place(void* data, int64_t count, DType dtype, Device device, const char* call) override {
        if (device == Device::cpu) {
            mpi::sum_in_place(data, count, element_of(dtype), where(call));
            return;
        }
        // Ordered after the backward on the compute stream, and the update after it: the host never waits.
        check_nccl(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_,
                                 cuda::compute_stream()),
                   where(call), "ncclAllReduce");
    }
    void sum_host(void* value, Element element, const char* call) override {
        mpi::sum_in_place(value, 1, element, where(call));
    }
    void broadcast_bytes(void* data, size_t bytes, Device device, int root) override {
        if (device == Device::cpu) {
            mpi::broadcast_bytes(data, bytes, root, where("broadcast"));
            return;
        }
        check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, cuda::compute_stream()), where("broadcast"),
                   "ncclBroadcast");
    }
    void reduce_scatter_parts(const void* flat, void* shard, int64_t count, DType dtype, Device device) override {
        if (device == Device::cpu) return mpi::reduce_scatter(flat, shard, count, element_of(dtype), where("reduce_scatter"));
        check_nccl(ncclReduceScatter(flat, shard, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_,
                                     cuda::compute_stream()),
                   where("reduce_scatter"), "ncclReduceScatter");
    }
    void all_gather_parts(const void* shard, void* flat, int64_t count, DType dtype, Device device) override {
        if (device == Device::cpu) return mpi::all_gather(shard, flat, count, element_of(dtype), where("all_gather"));
        check_nccl(ncclAllGather(shard, flat, static_cast<size_t>(count), nccl_type(dtype), comm_, cuda::compute_stream()),
                   where("all_gather"), "ncclAllGather");
    }
    void reduce_to(const void* send, void* receive, int64_t count, DType dtype, Device device, int root) override {
        if (device == Device::cpu) return mpi::reduce(send, receive, count, element_of(dtype), root, rank(), where("reduce"));
        check_nccl(ncclReduce(send, receive, static_cast<size_t>(count), nccl_type(dtype), ncclSum, root, comm_,
                              cuda::compute_stream()),
                   where("reduce"), "ncclReduce");
    }
    void barrier_now() override {
        cuda::synchronize(); // what this rank queued is done before the others pass
        mpi::barrier(where("barrier"));
    }

private:
    std::unique_ptr<mpi::Session> session_;
    ncclComm_t comm_ = nullptr;
};

} // namespace

std::unique_ptr<Communicator> make_nccl_communicator() {
    return std::make_unique<NcclCommunicator>(std::make_unique<mpi::Session>());
}

} // namespace engine::distributed
