// Inside engine/distributed only: the backends' factories and the MPI calls the NCCL backend bootstraps with.
// Neither mpi.h nor nccl.h leaks out of the .cpp files that implement them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/distributed/communicator.h"

namespace engine::distributed {

Element element_of(DType dtype); // throws for dtypes no reduction takes (i32)
size_t element_size(Element element);

#if ENGINE_HAS_MPI
std::unique_ptr<Communicator> make_mpi_communicator();

// MPI_COMM_WORLD, initialised on first use and finalised when the last holder of a session goes, unless it goes while
// an exception unwinds: a failed rank must not wait in MPI_Finalize for ranks that wait for it in a collective; it
// exits unfinalised and the launcher ends the job.
namespace mpi {
struct Session {
    Session();
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    int local_size = 1;
};
// Host memory only; `where` prefixes any error ("rank R of N, CALL").
void sum_in_place(void* data, int64_t count, Element element, const std::string& where);
void broadcast_bytes(void* data, size_t bytes, int root, const std::string& where);
void barrier(const std::string& where);
void abort_job(int exit_code); // MPI_Abort when MPI runs; nothing otherwise
void reduce_scatter(const void* flat, void* shard, int64_t count, Element element, const std::string& where);
void all_gather(const void* shard, void* flat, int64_t count, Element element, const std::string& where);
void reduce(const void* send, void* receive, int64_t count, Element element, int root, int rank, const std::string& where);
} // namespace mpi
#endif

#if ENGINE_HAS_NCCL
std::unique_ptr<Communicator> make_nccl_communicator();
#endif

} // namespace engine::distributed
