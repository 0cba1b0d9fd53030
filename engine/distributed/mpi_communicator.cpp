// The Open MPI backend: collectives on host tensors over MPI_COMM_WORLD, and the MPI session the NCCL backend
// bootstraps with. Errors are returned (MPI_ERRORS_RETURN), not fatal, so that every call can throw.
// The C API only: Open MPI's deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <exception>
#include <mutex>

#include "base/error.h"
#include "engine/distributed/backends.h"

namespace engine::distributed {
namespace mpi {
namespace {

std::mutex session_mutex;
int session_holders = 0;
bool initialised_here = false; // we called MPI_Init_thread, so we finalise

std::string error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<size_t>(length));
}

void check(int code, const std::string& where, const char* call) {
    ENGINE_CHECK(code == MPI_SUCCESS, where << ": " << call << " failed: " << error_text(code));
}

MPI_Datatype datatype(Element element) {
    switch (element) {
    case Element::f32: return MPI_FLOAT;
    case Element::f64: return MPI_DOUBLE;
    default: return MPI_INT64_T;
    }
}

} // namespace

Session::Session() {
    std::lock_guard<std::mutex> lock(session_mutex);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    ENGINE_CHECK(!finalised, "communicator (mpi): MPI was already finalised in this process; it cannot restart");
    if (!initialised) {
        // Funneled: only the thread that trains calls MPI; the engine's other threads (copies) never do.
        int provided = 0;
        const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
        ENGINE_CHECK(code == MPI_SUCCESS, "communicator (mpi): MPI_Init_thread failed: " << error_text(code));
        initialised_here = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "communicator (mpi)", "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "communicator (mpi)", "MPI_Comm_size");
    MPI_Comm local = MPI_COMM_NULL;
    const std::string where = "communicator (mpi) rank " + std::to_string(rank) + " of " + std::to_string(world_size);
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local), where,
          "MPI_Comm_split_type");
    check(MPI_Comm_rank(local, &local_rank), where, "MPI_Comm_rank(host)");
    check(MPI_Comm_size(local, &local_size), where, "MPI_Comm_size(host)");
    MPI_Comm_free(&local);
    ++session_holders;
}

Session::~Session() {
    std::lock_guard<std::mutex> lock(session_mutex);
    if (--session_holders == 0 && initialised_here) {
        // Going while an exception unwinds (this rank failed, the others may wait in a collective for it): no
        // MPI_Finalize, which would wait for them in turn. The process exits without it, and the launcher (mpirun)
        // ends the other ranks instead of the job hanging.
        if (std::uncaught_exceptions() > 0) return;
        int finalised = 0;
        MPI_Finalized(&finalised);
        if (!finalised) MPI_Finalize();
    }
}

void abort_job(int exit_code) {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

void sum_in_place(void* data, int64_t count, Element element, const std::string& where) {
    ENGINE_CHECK(count >= 0 && count <= INT32_MAX, where << ": " << count << " elements exceed one MPI call");
    check(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), datatype(element), MPI_SUM, MPI_COMM_WORLD), where,
          "MPI_Allreduce");
}

void broadcast_bytes(void* data, size_t bytes, int root, const std::string& where) {
    // MPI counts are int: large tensors go in pieces of at most 1 GiB.
    constexpr size_t piece = size_t{1} << 30;
    char* bytes_data = static_cast<char*>(data);
    for (size_t first = 0; first < bytes; first += piece) {
        const size_t length = std::min(piece, bytes - first);
        check(MPI_Bcast(bytes_data + first, static_cast<int>(length), MPI_BYTE, root, MPI_COMM_WORLD), where, "MPI_Bcast");
    }
}

void barrier(const std::string& where) { check(MPI_Barrier(MPI_COMM_WORLD), where, "MPI_Barrier"); }

void reduce_scatter(const void* flat, void* shard, int64_t count, Element element, const std::string& where) {
    ENGINE_CHECK(count >= 0 && count <= INT32_MAX, where << ": a shard of " << count << " elements exceeds one MPI call");
    check(MPI_Reduce_scatter_block(flat, shard, static_cast<int>(count), datatype(element), MPI_SUM, MPI_COMM_WORLD),
          where, "MPI_Reduce_scatter_block");
}

void all_gather(const void* shard, void* flat, int64_t count, Element element, const std::string& where) {
    ENGINE_CHECK(count >= 0 && count <= INT32_MAX, where << ": a shard of " << count << " elements exceeds one MPI call");
    check(MPI_Allgather(shard, static_cast<int>(count), datatype(element), flat, static_cast<int>(count),
                        datatype(element), MPI_COMM_WORLD),
          where, "MPI_Allgather");
}

void reduce(const void* send, void* receive, int64_t count, Element element, int root, int rank, const std::string& where) {
    ENGINE_CHECK(count >= 0 && count <= INT32_MAX, where << ": " << count << " elements exceed one MPI call");
    check(MPI_Reduce(send, rank == root ? receive : nullptr, static_cast<int>(count), datatype(element), MPI_SUM, root,
                     MPI_COMM_WORLD),
          where, "MPI_Reduce");
}

} // namespace mpi

namespace {

class MpiCommunicator final : public Communicator {
public:
    explicit MpiCommunicator(std::unique_ptr<mpi::Session> session)
        : Communicator(Backend::mpi, session->rank, session->world_size, session->local_rank, session->local_size),
          session_(std::move(session)) {}

protected:
    void sum_in_place(void* data, int64_t count, DType dtype, Device device, const char* call) override {
        require_host(device, call);
        mpi::sum_in_place(data, count, element_of(dtype), where(call));
    }
    void sum_host(void* value, Element element, const char* call) override {
        mpi::sum_in_place(value, 1, element, where(call));
    }
    void broadcast_bytes(void* data, size_t bytes, Device device, int root) override {
        require_host(device, "broadcast");
        mpi::broadcast_bytes(data, bytes, root, where("broadcast"));
    }
    void reduce_scatter_parts(const void* flat, void* shard, int64_t count, DType dtype, Device device) override {
        require_host(device, "reduce_scatter");
        mpi::reduce_scatter(flat, shard, count, element_of(dtype), where("reduce_scatter"));
    }
    void all_gather_parts(const void* shard, void* flat, int64_t count, DType dtype, Device device) override {
        require_host(device, "all_gather");
        mpi::all_gather(shard, flat, count, element_of(dtype), where("all_gather"));
    }
    void reduce_to(const void* send, void* receive, int64_t count, DType dtype, Device device, int root) override {
        require_host(device, "reduce");
        mpi::reduce(send, receive, count, element_of(dtype), root, rank(), where("reduce"));
    }
    void barrier_now() override { mpi::barrier(where("barrier")); }

private:
    void require_host(Device device, const char* call) const {
        ENGINE_CHECK(device == Device::cpu, where(call) << ": the mpi backend moves host tensors; this one is on "
                                                        << device_name(device) << " (use the nccl backend)");
    }
    std::unique_ptr<mpi::Session> session_;
};

} // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
    return std::make_unique<MpiCommunicator>(std::make_unique<mpi::Session>());
}

} // namespace engine::distributed
