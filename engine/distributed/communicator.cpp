// The communicator's backend-independent half: bucketing of gradient buffers, counters, the single-process
// no-op, the launcher's environment and the factory that reports a backend this build lacks.
#include "engine/distributed/communicator.h"

#include <algorithm>
#include <cstdlib>

#include "base/error.h"
#include "engine/distributed/backends.h"

namespace engine::distributed {

Backend parse_backend(const std::string& name) {
    if (name == "none") return Backend::none;
    if (name == "mpi") return Backend::mpi;
    if (name == "nccl") return Backend::nccl;
    ENGINE_FAIL("communicator: unknown backend '" << name << "' (known: none, mpi, nccl)");
}

const char* backend_name(Backend backend) {
    switch (backend) {
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
    default: return "none";
    }
}

bool backend_built(Backend backend) {
    switch (backend) {
    case Backend::mpi: return ENGINE_HAS_MPI != 0;
    case Backend::nccl: return ENGINE_HAS_NCCL != 0;
    default: return true;
    }
}

Element element_of(DType dtype) {
    if (dtype == DType::f32) return Element::f32;
    if (dtype == DType::f64) return Element::f64;
    ENGINE_FAIL("communicator: cannot sum a " << dtype_name(dtype) << " buffer (f32 or f64 only)");
}

size_t element_size(Element element) { return element == Element::f32 ? 4 : 8; }

CommunicatorCounters CommunicatorCounters::operator-(const CommunicatorCounters& earlier) const {
    CommunicatorCounters difference;
    difference.gradient_all_reduces = gradient_all_reduces - earlier.gradient_all_reduces;
    difference.count_all_reduces = count_all_reduces - earlier.count_all_reduces;
    difference.value_all_reduces = value_all_reduces - earlier.value_all_reduces;
    difference.reduce_scatters = reduce_scatters - earlier.reduce_scatters;
    difference.all_gathers = all_gathers - earlier.all_gathers;
    difference.reduces = reduces - earlier.reduces;
    difference.broadcasts = broadcasts - earlier.broadcasts;
    difference.barriers = barriers - earlier.barriers;
    difference.backend_calls = backend_calls - earlier.backend_calls;
    difference.bytes_reduced = bytes_reduced - earlier.bytes_reduced;
    return difference;
}

Communicator::Communicator(Backend backend, int rank, int world_size, int local_rank, int local_size)
    : backend_(backend), rank_(rank), world_size_(world_size), local_rank_(local_rank), local_size_(local_size) {}

std::string Communicator::where(const char* call) const {
    return "communicator (" + std::string(backend_name(backend_)) + ") rank " + std::to_string(rank_) + " of " +
           std::to_string(world_size_) + ", " + call;
}

void Communicator::all_reduce_gradients(const std::vector<Tensor>& buffers) {
    ++counters_.gradient_all_reduces;
    if (buffers.empty()) return;
    const Device device = buffers.front().device();
    const DType dtype = buffers.front().dtype();
    for (const Tensor& buffer : buffers) {
        ENGINE_CHECK(buffer.defined(), where("all_reduce_gradients") << ": an undefined buffer");
        ENGINE_CHECK(buffer.device() == device && buffer.dtype() == dtype,
                     where("all_reduce_gradients") << ": buffer " << buffer.describe() << " differs from the first's "
                                                   << device_name(device) << " " << dtype_name(dtype));
    }
    const size_t element_bytes = dtype_size(dtype);
    const int64_t bucket_elements = static_cast<int64_t>(bucket_bytes / element_bytes);
    // The bucket holds the buffers shorter than it, so it need not be longer than they are together (a small model's
    // gradients take their own size, not 32 MiB; planner::all_reduce_bucket_bytes predicts it).
    int64_t small = 0;
    for (const Tensor& buffer : buffers)
        if (buffer.numel() < bucket_elements) small += buffer.numel();
    const int64_t bucket_length = std::min(bucket_elements, small);
    // Small buffers are packed into one bucket (one call for many LayerNorm vectors); a buffer at least a
    // bucket long is reduced where it lies, in bucket-sized pieces, with no copy.
    Tensor bucket;
    int64_t filled = 0;
    std::vector<std::pair<const Tensor*, int64_t>> packed; // (buffer, offset in the bucket)
    auto flush = [&] {
        if (filled == 0) return;
        sum_in_place(bucket.raw_data(), filled, dtype, device, "all_reduce_gradients");
        ++counters_.backend_calls;
        counters_.bytes_reduced += filled * static_cast<int64_t>(element_bytes);
        char* base = static_cast<char*>(bucket.raw_data());
        for (const auto& [buffer, offset] : packed)
            copy_bytes(buffer->raw_data(), device, base + offset * element_bytes, device, buffer->nbytes());
        packed.clear();
        filled = 0;
    };
    for (const Tensor& buffer : buffers) {
        const int64_t count = buffer.numel();
        if (count >= bucket_elements) {
            char* data = static_cast<char*>(buffer.raw_data());
            for (int64_t first = 0; first < count; first += bucket_elements) {
                const int64_t piece = std::min(bucket_elements, count - first);
                sum_in_place(data + first * element_bytes, piece, dtype, device, "all_reduce_gradients");
                ++counters_.backend_calls;
                counters_.bytes_reduced += piece * static_cast<int64_t>(element_bytes);
            }
            continue;
        }
        if (filled + count > bucket_elements) flush();
        if (!bucket.defined()) {
            MemoryCategoryScope scope(MemoryCategory::workspace);
            bucket = Tensor::zeros({bucket_length}, dtype, device);
        }
        copy_bytes(static_cast<char*>(bucket.raw_data()) + filled * element_bytes, device, buffer.raw_data(), device,
                   buffer.nbytes());
        packed.emplace_back(&buffer, filled);
        filled += count;
    }
    flush();
}

void Communicator::sum_scalar(void* value, Element element, const char* call) {
    ++counters_.backend_calls;
    counters_.bytes_reduced += static_cast<int64_t>(element_size(element));
    sum_host(value, element, call);
}

int64_t Communicator::all_reduce_count(int64_t count) {
    ++counters_.count_all_reduces;
    sum_scalar(&count, Element::i64, "all_reduce_count");
    return count;
}

double Communicator::all_reduce_value(double value) {
    ++counters_.value_all_reduces;
    sum_scalar(&value, Element::f64, "all_reduce_value");
    return value;
}

void Communicator::broadcast(const Tensor& tensor, int root) {
    ENGINE_CHECK(root >= 0 && root < world_size_, where("broadcast") << ": root " << root << " is not a rank");
    ++counters_.broadcasts;
    ++counters_.backend_calls;
    detail::impl_of(tensor).storage->set_host_copy(nullptr); // the root's values replace what this rank's copy recorded
    broadcast_bytes(tensor.raw_data(), tensor.nbytes(), tensor.device(), root);
}

void Communicator::broadcast_range(const Tensor& tensor, int64_t first, int64_t count, int root) {
    ENGINE_CHECK(root >= 0 && root < world_size_, where("broadcast") << ": root " << root << " is not a rank");
    ENGINE_CHECK(tensor.defined() && first >= 0 && count >= 0 && first <= tensor.numel() - count,
                 where("broadcast") << ": elements [" << first << ", " << first + count << ") are not in "
                                    << (tensor.defined() ? tensor.describe() : std::string("an undefined tensor")));
    ++counters_.broadcasts;
    ++counters_.backend_calls;
    detail::impl_of(tensor).storage->set_host_copy(nullptr);
    const size_t element = dtype_size(tensor.dtype());
    broadcast_bytes(static_cast<char*>(tensor.raw_data()) + static_cast<size_t>(first) * element,
                    static_cast<size_t>(count) * element, tensor.device(), root);
}

void Communicator::check_parts(const Tensor& flat, const Tensor& shard, const char* call) const {
    ENGINE_CHECK(flat.defined() && shard.defined() && flat.device() == shard.device() && flat.dtype() == shard.dtype() &&
                     flat.numel() == shard.numel() * world_size_,
                 where(call) << ": the flat buffer " << (flat.defined() ? flat.describe() : std::string("none"))
                             << " must be " << world_size_ << " parts the size, device and dtype of the shard "
                             << (shard.defined() ? shard.describe() : std::string("none")));
    element_of(flat.dtype());
}

void Communicator::reduce_scatter(const Tensor& flat, const Tensor& shard) {
    check_parts(flat, shard, "reduce_scatter");
    ++counters_.reduce_scatters;
    ++counters_.backend_calls;
    counters_.bytes_reduced += static_cast<int64_t>(flat.nbytes());
    reduce_scatter_parts(flat.raw_data(), shard.raw_data(), shard.numel(), shard.dtype(), shard.device());
}

void Communicator::all_gather(const Tensor& shard, const Tensor& flat) {
    check_parts(flat, shard, "all_gather");
    ++counters_.all_gathers;
    ++counters_.backend_calls;
    all_gather_parts(shard.raw_data(), flat.raw_data(), shard.numel(), shard.dtype(), shard.device());
}

void Communicator::reduce(const Tensor& send, const Tensor& receive, int64_t count, int root) {
    ENGINE_CHECK(root >= 0 && root < world_size_, where("reduce") << ": root " << root << " is not a rank");
    ENGINE_CHECK(send.defined() && receive.defined() && send.device() == receive.device() &&
                     send.dtype() == receive.dtype() && count >= 0 && count <= send.numel() && count <= receive.numel(),
                 where("reduce") << ": " << count << " elements from "
                                 << (send.defined() ? send.describe() : std::string("none")) << " into "
                                 << (receive.defined() ? receive.describe() : std::string("none"))
                                 << ": both must hold them, on one device, in one dtype");
    ENGINE_CHECK(!send.shares_storage_with(receive), where("reduce") << ": the send and receive buffers are one");
    element_of(send.dtype());
    ++counters_.reduces;
    ++counters_.backend_calls;
    counters_.bytes_reduced += count * static_cast<int64_t>(dtype_size(send.dtype()));
    reduce_to(send.raw_data(), receive.raw_data(), count, send.dtype(), send.device(), root);
}

void Communicator::barrier() {
    ++counters_.barriers;
    ++counters_.backend_calls;
    barrier_now();
}

namespace {

// World size 1: every sum is its input and every broadcast already holds root's values.
class SingleProcessCommunicator final : public Communicator {
public:
    SingleProcessCommunicator() : Communicator(Backend::none, 0, 1, 0, 1) {}

protected:
    void sum_in_place(void*, int64_t, DType, Device, const char*) override {}
    void sum_host(void*, Element, const char*) override {}
    void broadcast_bytes(void*, size_t, Device, int) override {}
    void reduce_scatter_parts(const void* flat, void* shard, int64_t count, DType dtype, Device device) override {
        if (flat != shard) copy_bytes(shard, device, flat, device, static_cast<size_t>(count) * dtype_size(dtype));
    }
    void all_gather_parts(const void* shard, void* flat, int64_t count, DType dtype, Device device) override {
        if (flat != shard) copy_bytes(flat, device, shard, device, static_cast<size_t>(count) * dtype_size(dtype));
    }
    void reduce_to(const void* send, void* receive, int64_t count, DType dtype, Device device, int) override {
        if (send != receive) copy_bytes(receive, device, send, device, static_cast<size_t>(count) * dtype_size(dtype));
    }
    void barrier_now() override {}
};

int environment_integer(const char* name, int fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    ENGINE_CHECK(*end == '\0' && value >= 0, "launch environment: " << name << "='" << text << "' is not a count");
    return static_cast<int>(value);
}

} // namespace

LaunchEnvironment launch_environment() {
    LaunchEnvironment environment;
    // Open MPI's mpirun, then the PMI variables of MPICH's hydra and Slurm's srun.
    for (const auto& [size_name, rank_name] : {std::pair{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                               std::pair{"PMI_SIZE", "PMI_RANK"}}) {
        const int size = environment_integer(size_name, 0);
        if (size == 0) continue;
        environment.world_size = size;
        environment.rank = environment_integer(rank_name, 0);
        environment.launched = true;
        break;
    }
    return environment;
}

void abort_job(int exit_code) {
#if ENGINE_HAS_MPI
    mpi::abort_job(exit_code);
#else
    (void)exit_code;
#endif
}

std::unique_ptr<Communicator> make_communicator(Backend backend) {
    switch (backend) {
    case Backend::none: return std::make_unique<SingleProcessCommunicator>();
    case Backend::mpi:
#if ENGINE_HAS_MPI
        return make_mpi_communicator();
#else
        ENGINE_FAIL("communicator: this libengine was built without MPI (configure with Open MPI installed, "
                    "-DENGINE_MPI=ON; scripts/install_deps.sh installs it)");
#endif
    case Backend::nccl:
#if ENGINE_HAS_NCCL
        return make_nccl_communicator();
#else
        ENGINE_FAIL("communicator: this libengine was built without NCCL (it needs a real CUDA build, "
                    "ENGINE_CUDA=ON or AUTO with nvcc, and both NCCL and MPI found; the emulated device has none)");
#endif
    }
    ENGINE_FAIL("communicator: unknown backend");
}

} // namespace engine::distributed
