// check_communicator: runs every call of a communicator backend under mpirun and checks the results exactly
// (the test values are small integers times 0.5, so every sum is exact in f32), and for nccl also against MPI's
// result for the same buffers. Used by ctest (mpi, 2 ranks) and bench/gpu_check.sh (nccl, 1 rank).
// usage: mpirun -np N check_communicator mpi|nccl
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"

namespace {

using namespace engine;

// Buffer k of rank r holds (r + 1)·(i mod 97 + k)·0.5: the sum over ranks is N(N+1)/2 times rank 0's values.
std::vector<Tensor> make_buffers(int rank, Device device) {
    const std::vector<int64_t> sizes = {5, 1000, 3, static_cast<int64_t>(distributed::Communicator::bucket_bytes / 4) + 7};
    std::vector<Tensor> buffers;
    for (size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> values(static_cast<size_t>(sizes[k]));
        for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((rank + 1) * (i % 97 + k)) * 0.5f;
        buffers.push_back(Tensor::from_vector<float>(values, {sizes[k]}, device));
    }
    return buffers;
}

int failures = 0;
void expect(bool condition, const std::string& what, int rank) {
    if (condition) return;
    std::cerr << "check_communicator: rank " << rank << ": FAIL: " << what << "\n";
    ++failures;
}

std::vector<std::vector<float>> host_values(const std::vector<Tensor>& buffers) {
    std::vector<std::vector<float>> values;
    for (const Tensor& buffer : buffers) values.push_back(buffer.to(Device::cpu).to_vector<float>());
    return values;
}

void check(distributed::Backend backend) {
    const std::unique_ptr<distributed::Communicator> communicator = distributed::make_communicator(backend);
    const int rank = communicator->rank();
    const int world = communicator->world_size();
    const Device device = backend == distributed::Backend::nccl ? Device::cuda : Device::cpu;
    const double ranks_sum = world * (world + 1) / 2.0;

    std::vector<Tensor> buffers = make_buffers(rank, device);
    communicator->all_reduce_gradients(buffers);
    const std::vector<std::vector<float>> reduced = host_values(buffers);
    const std::vector<std::vector<float>> single = host_values(make_buffers(0, Device::cpu));
    for (size_t k = 0; k < reduced.size(); ++k)
        for (size_t i = 0; i < reduced[k].size(); ++i)
            if (reduced[k][i] != static_cast<float>(single[k][i] * ranks_sum)) {
                expect(false, "all_reduce_gradients buffer " + std::to_string(k) + " element " + std::to_string(i) + ": " +
                                  std::to_string(reduced[k][i]) + " != " + std::to_string(single[k][i] * ranks_sum), rank);
                break;
            }
    const distributed::CommunicatorCounters counters = communicator->counters();
    expect(counters.gradient_all_reduces == 1, "one all_reduce_gradients counted", rank);
    // The three small buffers share one bucket; the large one goes in two bucket-sized pieces where it lies.
    expect(counters.backend_calls == 3, "3 backend calls for 4 buffers, got " + std::to_string(counters.backend_calls), rank);

    if (backend == distributed::Backend::nccl) {
        // The same buffers through MPI: NCCL's sums must equal MPI's bitwise.
        const std::unique_ptr<distributed::Communicator> mpi = distributed::make_communicator(distributed::Backend::mpi);
        std::vector<Tensor> host = make_buffers(rank, Device::cpu);
        mpi->all_reduce_gradients(host);
        expect(host_values(host) == reduced, "NCCL's all-reduce equals MPI's bitwise", rank);
    }

    expect(communicator->all_reduce_count(rank + 1) == static_cast<int64_t>(ranks_sum), "all_reduce_count", rank);
    expect(communicator->all_reduce_value(0.25 * (rank + 1)) == 0.25 * ranks_sum, "all_reduce_value", rank);
    const Tensor shared = Tensor::from_vector<float>({static_cast<float>(rank), 7.0f}, {2}, device);
    communicator->broadcast(shared, world - 1);
    expect(shared.to(Device::cpu).to_vector<float>() == std::vector<float>{static_cast<float>(world - 1), 7.0f},
           "broadcast from the last rank", rank);
    // ZeRO-1's pair: part r of the flat buffer summed onto rank r, then every part gathered back.
    std::vector<float> flat_values(static_cast<size_t>(3 * world));
    for (size_t i = 0; i < flat_values.size(); ++i) flat_values[i] = static_cast<float>((rank + 1) * (i + 1)) * 0.5f;
    const Tensor flat = Tensor::from_vector<float>(flat_values, {3 * world}, device);
    const Tensor part = Tensor::zeros({3}, DType::f32, device);
    communicator->reduce_scatter(flat, part);
    const std::vector<float> summed = part.to(Device::cpu).to_vector<float>();
    for (size_t i = 0; i < 3; ++i)
        expect(summed[i] == static_cast<float>((3 * rank + i + 1) * 0.5 * ranks_sum), "reduce_scatter element " + std::to_string(i), rank);
    communicator->all_gather(part, flat);
    const std::vector<float> gathered = flat.to(Device::cpu).to_vector<float>();
    for (size_t i = 0; i < gathered.size(); ++i)
        expect(gathered[i] == static_cast<float>((i + 1) * 0.5 * ranks_sum), "all_gather element " + std::to_string(i), rank);
    // ZeRO-2's reduce onto one rank: the last rank receives the sum; every other rank's buffer is untouched.
    const Tensor received = Tensor::full({4}, -1.0, DType::f32, device);
    communicator->reduce(flat, received, 3, world - 1);
    const std::vector<float> reduced_values = received.to(Device::cpu).to_vector<float>();
    for (size_t i = 0; i < 3; ++i)
        expect(reduced_values[i] == (rank == world - 1 ? static_cast<float>(world * (i + 1) * 0.5 * ranks_sum) : -1.0f),
               "reduce element " + std::to_string(i), rank);
    expect(reduced_values[3] == -1.0f, "reduce leaves the elements past its count", rank);
    communicator->barrier();
    bool refused = false;
    try {
        communicator->broadcast(shared, world); // not a rank: refused before any call
    } catch (const EngineError& error) {
        refused = std::string(error.what()).find("rank " + std::to_string(rank)) != std::string::npos;
    }
    expect(refused, "a bad root is refused with an error naming the rank", rank);
    if (rank == 0)
        std::printf("check_communicator: %s on %d ranks: %s (%lld backend calls)\n", distributed::backend_name(backend),
                    world, failures == 0 ? "ok" : "FAILED", static_cast<long long>(communicator->counters().backend_calls));
}

} // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: mpirun -np N check_communicator mpi|nccl\n";
        return 2;
    }
    try {
        check(distributed::parse_backend(argv[1]));
    } catch (const std::exception& error) {
        std::cerr << "check_communicator: error: " << error.what() << "\n";
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
