// The training-state container format: serialisation and strict validation. Every length the header or
// a record declares is checked against the bytes actually present before it is used, so a lying or
// damaged file is refused with a message instead of read out of bounds.
#include "engine/io/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "base/error.h"
#include "engine/cuda/runtime.h"
#include "engine/io/atomic_file.h"
#include "engine/memory.h"

namespace engine::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "state files store raw little-endian tensor bytes; a big-endian host would need byte swaps");

// Header: magic[8], u32 version, u32 reserved (0), u64 file_bytes, u64 metadata_bytes, u64 tensor_count.
constexpr size_t header_bytes = 40;
// Record head: u32 name_bytes, u32 dtype code, u32 rank, u32 reserved (0); then name, i64 dims[rank],
// u64 data_bytes, data.
constexpr size_t record_head_bytes = 16;
constexpr size_t checksum_bytes = 4; // trailing CRC32 of every byte before it
constexpr uint32_t max_name_bytes = 4096;
constexpr uint64_t max_metadata_bytes = uint64_t(64) << 20; // the run's config and cursors: kilobytes in practice
constexpr uint32_t max_rank = 16;

// On-disk dtype codes, independent of the enum's order so that reordering DType cannot change the format.
uint32_t dtype_code(DType dtype) {
    switch (dtype) {
    case DType::f32: return 1;
    case DType::f64: return 2;
    case DType::i32: return 3;
    case DType::bf16: return 4;
    case DType::u8: return 5;
    }
    return 0;
}

bool dtype_from_code(uint32_t code, DType* dtype) {
    switch (code) {
    case 1: *dtype = DType::f32; return true;
    case 2: *dtype = DType::f64; return true;
    case 3: *dtype = DType::i32; return true;
    case 4: *dtype = DType::bf16; return true;
    case 5: *dtype = DType::u8; return true;
    default: return false;
    }
}

uint32_t crc32_update(uint32_t crc, const void* bytes, size_t size) {
    return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(bytes), size));
}

void put_u32(std::vector<uint8_t>& out, uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(value >> shift));
}
void put_u64(std::vector<uint8_t>& out, uint64_t value) {
    for (int shift = 0; shift < 64; shift += 8) out.push_back(static_cast<uint8_t>(value >> shift));
}
uint32_t get_u32(const uint8_t* bytes) {
    uint32_t value = 0;
    for (int index = 3; index >= 0; --index) value = value << 8 | bytes[index];
    return value;
}
uint64_t get_u64(const uint8_t* bytes) {
    uint64_t value = 0;
    for (int index = 7; index >= 0; --index) value = value << 8 | bytes[index];
    return value;
}

// numel * element size, or false when it overflows or a dimension is negative.
bool tensor_bytes(const Shape& shape, DType dtype, uint64_t* bytes) {
    uint64_t total = dtype_size(dtype);
    for (int64_t extent : shape) {
        if (extent < 0) return false;
        const auto unsigned_extent = static_cast<uint64_t>(extent);
        if (unsigned_extent != 0 && total > std::numeric_limits<uint64_t>::max() / unsigned_extent) return false;
        total *= unsigned_extent;
    }
    *bytes = total;
    return true;
}

// `where`: "state file <source>: ".
void check_metadata(const std::string& text, const std::string& where) {
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(!parsed.is_discarded(), where << "metadata is not valid JSON");
    ENGINE_CHECK(parsed.is_object(), where << "metadata is JSON but not an object");
}

// Reads exactly `bytes` at `offset` of an open file, or throws naming it.
void pread_exactly(int descriptor, const std::string& path, uint64_t offset, void* destination, uint64_t bytes) {
    auto* cursor = static_cast<uint8_t*>(destination);
    while (bytes > 0) {
        const ssize_t got = ::pread(descriptor, cursor, bytes, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        ENGINE_CHECK(got >= 0, "reading " << path << " failed: " << std::strerror(errno));
        ENGINE_CHECK(got > 0, "reading " << path << ": the file ended at byte " << offset << " while being read");
        cursor += got;
        offset += static_cast<uint64_t>(got);
        bytes -= static_cast<uint64_t>(got);
    }
}

// A record's name and shape as the format allows them; returns the bytes its data takes.
uint64_t checked_record(const std::string& name, DType dtype, const Shape& shape) {
    ENGINE_CHECK(!name.empty() && name.size() <= max_name_bytes,
                 "state tensor name must have 1.." << max_name_bytes << " bytes, got " << name.size());
    ENGINE_CHECK(shape.size() <= max_rank, "state tensor " << name << ": rank " << shape.size() << " over " << max_rank);
    uint64_t bytes = 0;
    ENGINE_CHECK(tensor_bytes(shape, dtype, &bytes), "state tensor " << name << ": invalid shape " << shape_string(shape));
    return bytes;
}

void check_tensor_for_writing(const StateTensor& tensor) {
    const uint64_t expected = checked_record(tensor.name, tensor.dtype, tensor.shape);
    ENGINE_CHECK(expected == tensor.data.size(), "state tensor " << tensor.name << " " << shape_string(tensor.shape)
                                                                 << " " << dtype_name(tensor.dtype) << " needs "
                                                                 << expected << " bytes, holds " << tensor.data.size());
}

// The header's checks, in the order a reader meets them: length, magic, version, declared size.
void check_header(const uint8_t* head, uint64_t size, const std::string& where) {
    ENGINE_CHECK(size >= header_bytes + checksum_bytes,
                 where << "truncated: " << size << " bytes, shorter than the " << header_bytes + checksum_bytes
                       << "-byte minimum");
    ENGINE_CHECK(std::memcmp(head, state_file_magic, 8) == 0, where << "bad magic (not a libengine state file)");
    const uint32_t version = get_u32(head + 8);
    ENGINE_CHECK(version == state_file_version,
                 where << "unsupported version " << version << " (this build reads " << state_file_version << ")");
    const uint64_t file_bytes = get_u64(head + 16);
    ENGINE_CHECK(file_bytes == size, where << (file_bytes > size ? "truncated" : "trailing bytes") << ": header says "
                                           << file_bytes << " bytes, the file has " << size);
}

void check_checksum(uint32_t stored, uint32_t computed, const std::string& where) {
    ENGINE_CHECK(stored == computed, where << "checksum mismatch (stored CRC32 " << std::hex << stored << ", computed "
                                           << computed << std::dec << "): the file is corrupt");
}

// The body after a good checksum: the metadata, then every record's head, each length checked against what is
// left before it is used, so that a crafted file with a matching checksum cannot read out of bounds.
// read_at(offset, destination, bytes) reads the file; on_record(tensor without data, data offset) takes each.
template <typename ReadAt, typename OnRecord>
std::string walk_body(const uint8_t* head, uint64_t size, const std::string& where, const ReadAt& read_at,
                      const OnRecord& on_record) {
    ENGINE_CHECK(get_u32(head + 12) == 0, where << "reserved header field is not zero");
    const uint64_t body_end = size - checksum_bytes;
    uint64_t offset = header_bytes;
    auto remaining = [&] { return body_end - offset; };
    const uint64_t metadata_bytes = get_u64(head + 24);
    ENGINE_CHECK(metadata_bytes <= remaining(),
                 where << "metadata length " << metadata_bytes << " runs past the end of the file");
    ENGINE_CHECK(metadata_bytes <= max_metadata_bytes,
                 where << "metadata length " << metadata_bytes << " is over the " << max_metadata_bytes << "-byte limit");
    std::string metadata(metadata_bytes, '\0');
    read_at(offset, metadata.data(), metadata_bytes);
    offset += metadata_bytes;
    check_metadata(metadata, where);

    const uint64_t tensor_count = get_u64(head + 32);
    ENGINE_CHECK(tensor_count <= remaining() / (record_head_bytes + 1 + 8),
                 where << "tensor count " << tensor_count << " cannot fit in the " << remaining() << " bytes left");
    std::unordered_set<std::string> names;
    uint8_t record_head[record_head_bytes];
    for (uint64_t index = 0; index < tensor_count; ++index) {
        const std::string record = where + "tensor record " + std::to_string(index) + ": ";
        ENGINE_CHECK(remaining() >= record_head_bytes, record << "truncated record header");
        read_at(offset, record_head, record_head_bytes);
        const uint32_t name_bytes = get_u32(record_head);
        const uint32_t code = get_u32(record_head + 4);
        const uint32_t rank = get_u32(record_head + 8);
        ENGINE_CHECK(get_u32(record_head + 12) == 0, record << "reserved field is not zero");
        offset += record_head_bytes;
        ENGINE_CHECK(name_bytes >= 1 && name_bytes <= max_name_bytes,
                     record << "name length " << name_bytes << " outside 1.." << max_name_bytes);
        ENGINE_CHECK(rank <= max_rank, record << "rank " << rank << " over " << max_rank);
        StateTensor tensor;
        ENGINE_CHECK(dtype_from_code(code, &tensor.dtype), record << "unknown dtype code " << code);
        ENGINE_CHECK(uint64_t{name_bytes} + 8ull * rank + 8 <= remaining(),
                     record << "name and shape run past the end of the file");
        std::vector<uint8_t> rest(name_bytes + 8ull * rank + 8);
        read_at(offset, rest.data(), rest.size());
        tensor.name.assign(reinterpret_cast<const char*>(rest.data()), name_bytes);
        offset += rest.size();
        for (uint32_t axis = 0; axis < rank; ++axis)
            tensor.shape.push_back(static_cast<int64_t>(get_u64(rest.data() + name_bytes + 8 * axis)));
        const uint64_t data_bytes = get_u64(rest.data() + name_bytes + 8ull * rank);
        uint64_t expected = 0;
        ENGINE_CHECK(tensor_bytes(tensor.shape, tensor.dtype, &expected),
                     record << tensor.name << " has an invalid shape " << shape_string(tensor.shape));
        ENGINE_CHECK(data_bytes == expected, record << tensor.name << " " << shape_string(tensor.shape) << " "
                                                    << dtype_name(tensor.dtype) << " declares " << data_bytes
                                                    << " data bytes, its shape needs " << expected);
        ENGINE_CHECK(data_bytes <= remaining(), record << tensor.name << " declares " << data_bytes
                                                       << " data bytes, only " << remaining() << " are left");
        ENGINE_CHECK(names.insert(tensor.name).second, record << "tensor name " << tensor.name << " appears twice");
        on_record(std::move(tensor), offset, data_bytes);
        offset += data_bytes;
    }
    ENGINE_CHECK(offset == body_end, where << remaining() << " unexplained bytes after the last tensor");
    return metadata;
}

} // namespace

void write_state(const StateSource& source, const ByteSink& sink) {
    ENGINE_CHECK(sink, "write_state: no sink to write the state to");
    check_metadata(source.metadata_json, "state file (being written): ");
    ENGINE_CHECK(source.metadata_json.size() <= max_metadata_bytes,
                 "state file (being written): metadata of " << source.metadata_json.size() << " bytes is over the "
                                                            << max_metadata_bytes << "-byte limit");
    std::unordered_set<std::string_view> names;
    uint64_t file_bytes = header_bytes + source.metadata_json.size() + checksum_bytes;
    for (const StateTensorSource& tensor : source.tensors) {
        const uint64_t data_bytes = checked_record(tensor.name, tensor.dtype, tensor.shape);
        ENGINE_CHECK(tensor.emit, "state tensor " << tensor.name << " has no source of its bytes");
        ENGINE_CHECK(names.insert(tensor.name).second, "state tensor name " << tensor.name << " appears twice");
        file_bytes += record_head_bytes + tensor.name.size() + 8 * tensor.shape.size() + 8 + data_bytes;
    }

    // A failing sink (a full disk) does not stop the emits: the bytes after it are dropped, and the failure is
    // thrown once every emit, and any collective in it, has run on this rank as on the others.
    std::exception_ptr failure;
    uint32_t crc = crc32_update(0, nullptr, 0);
    auto write = [&](const void* bytes, size_t size) {
        if (size == 0 || failure) return;
        crc = crc32_update(crc, bytes, size);
        try {
            sink(bytes, size);
        } catch (...) {
            failure = std::current_exception();
        }
    };
    std::vector<uint8_t> head(state_file_magic, state_file_magic + 8);
    put_u32(head, state_file_version);
    put_u32(head, 0);
    put_u64(head, file_bytes);
    put_u64(head, source.metadata_json.size());
    put_u64(head, source.tensors.size());
    write(head.data(), head.size());
    write(source.metadata_json.data(), source.metadata_json.size());
    for (const StateTensorSource& tensor : source.tensors) {
        uint64_t data_bytes = 0;
        tensor_bytes(tensor.shape, tensor.dtype, &data_bytes);
        head.clear();
        put_u32(head, static_cast<uint32_t>(tensor.name.size()));
        put_u32(head, dtype_code(tensor.dtype));
        put_u32(head, static_cast<uint32_t>(tensor.shape.size()));
        put_u32(head, 0);
        head.insert(head.end(), tensor.name.begin(), tensor.name.end());
        for (int64_t extent : tensor.shape) put_u64(head, static_cast<uint64_t>(extent));
        put_u64(head, data_bytes);
        write(head.data(), head.size());
        uint64_t emitted = 0;
        // After a failure the emits still run (their collectives), with an empty sink: nothing is copied to be dropped.
        if (failure) {
            tensor.emit({});
            continue;
        }
        tensor.emit([&](const void* bytes, size_t size) {
            emitted += size;
            write(bytes, size);
        });
        // A wrong count would make a file whose records do not parse: refused before the file is renamed.
        ENGINE_CHECK(failure || emitted == data_bytes, "state tensor " << tensor.name << " " << shape_string(tensor.shape) << " "
                                                            << dtype_name(tensor.dtype) << " needs " << data_bytes
                                                            << " bytes, its source gave " << emitted);
    }
    head.clear();
    put_u32(head, crc);
    write(head.data(), head.size());
    if (failure) std::rethrow_exception(failure);
}

StateSource source_of(const TrainingState& state) {
    StateSource source;
    source.metadata_json = state.metadata_json;
    for (const StateTensor& tensor : state.tensors) {
        check_tensor_for_writing(tensor);
        source.tensors.push_back({tensor.name, tensor.dtype, tensor.shape, [&tensor](const ByteSink& sink) {
                                      if (sink && !tensor.data.empty()) sink(tensor.data.data(), tensor.data.size());
                                  }});
    }
    return source;
}

StateStaging::~StateStaging() {
    if (block_ != nullptr) deallocate_bytes(Device::cpu, block_, state_staging_bytes, MemoryCategory::pinned_host);
}

void* StateStaging::block() {
    if (block_ == nullptr) block_ = allocate_bytes(Device::cpu, state_staging_bytes, MemoryCategory::pinned_host);
    return block_;
}

void StateStaging::emit(const void* bytes, Device device, size_t size, const ByteSink& sink) {
    if (!sink || size == 0) return;
    if (device == Device::cpu) return sink(bytes, size);
    for (size_t done = 0; done < size; done += state_staging_bytes) {
        const size_t piece = std::min(state_staging_bytes, size - done);
        copy_bytes(block(), Device::cpu, static_cast<const uint8_t*>(bytes) + done, device, piece);
        sink(block(), piece);
    }
}

void StateStaging::fill(void* destination, Device device, size_t size,
                        const std::function<void(void* host, size_t offset, size_t bytes)>& read) {
    if (size == 0) return;
    if (device == Device::cpu) return read(destination, 0, size);
    for (size_t done = 0; done < size; done += state_staging_bytes) {
        const size_t piece = std::min(state_staging_bytes, size - done);
        read(block(), done, piece);
        copy_bytes(static_cast<uint8_t*>(destination) + done, device, block(), Device::cpu, piece);
        // A copy up is ordered on the compute stream, not complete on return: the block is refilled only after it.
        cuda::synchronize(device);
    }
}

const StateReader::Entry* StateReader::find(std::string_view name) const {
    for (const Entry& entry : entries())
        if (entry.name == name) return &entry;
    return nullptr;
}

namespace {
void check_range(const StateReader::Entry& entry, uint64_t first, uint64_t size) {
    ENGINE_CHECK(first <= entry.bytes && size <= entry.bytes - first,
                 "state tensor " << entry.name << ": bytes [" << first << ", " << first + size << ") lie outside its "
                                 << entry.bytes);
}
} // namespace

MemoryStateReader::MemoryStateReader(const TrainingState& state) : state_(state) {
    for (const StateTensor& tensor : state.tensors) entries_.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.data.size()});
}

void MemoryStateReader::read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const {
    check_range(entry, first, size);
    const StateTensor* stored = state_.find(entry.name);
    ENGINE_CHECK(stored != nullptr, "training state has no tensor named " << entry.name);
    if (size > 0) copy_bytes(destination, device, stored->data.data() + first, Device::cpu, size);
}

StateFileReader::StateFileReader(const std::string& path) : path_(path) {
    const std::string where = "state file " + path + ": ";
    descriptor_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ENGINE_CHECK(descriptor_ >= 0, "cannot open " << path << ": " << std::strerror(errno));
    try {
        struct stat status {};
        ENGINE_CHECK(::fstat(descriptor_, &status) == 0, "cannot stat " << path << ": " << std::strerror(errno));
        ENGINE_CHECK(S_ISREG(status.st_mode), path << " is not a regular file");
        const auto size = static_cast<uint64_t>(status.st_size);
        auto read_at = [&](uint64_t offset, void* destination, uint64_t bytes) {
            pread_exactly(descriptor_, path, offset, destination, bytes);
        };
        uint8_t head[header_bytes] = {};
        read_at(0, head, std::min<uint64_t>(size, header_bytes));
        check_header(head, size, where);
        // The checksum over every byte before it, through one bounded buffer.
        std::vector<uint8_t> buffer(std::min<uint64_t>(size, uint64_t(256) << 10));
        uint32_t crc = crc32_update(0, nullptr, 0);
        for (uint64_t done = 0; done < size - checksum_bytes;) {
            const uint64_t piece = std::min<uint64_t>(buffer.size(), size - checksum_bytes - done);
            read_at(done, buffer.data(), piece);
            crc = crc32_update(crc, buffer.data(), piece);
            done += piece;
        }
        uint8_t stored[checksum_bytes];
        read_at(size - checksum_bytes, stored, checksum_bytes);
        check_checksum(get_u32(stored), crc, where);
        metadata_json_ = walk_body(head, size, where, read_at, [&](StateTensor tensor, uint64_t offset, uint64_t bytes) {
            entries_.push_back({std::move(tensor.name), tensor.dtype, std::move(tensor.shape), bytes});
            offsets_.push_back(offset);
        });
    } catch (...) {
        ::close(descriptor_);
        throw;
    }
}

StateFileReader::~StateFileReader() {
    if (descriptor_ >= 0) ::close(descriptor_);
}

void StateFileReader::read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const {
    check_range(entry, first, size);
    // Which of this file's entries it is, by its address (an entry of another reader is refused).
    const auto address = reinterpret_cast<uintptr_t>(&entry), first_entry = reinterpret_cast<uintptr_t>(entries_.data());
    const size_t index = address >= first_entry ? (address - first_entry) / sizeof(Entry) : entries_.size();
    ENGINE_CHECK(index < entries_.size() && &entries_[index] == &entry,
                 "state file " << path_ << ": tensor " << entry.name << " is not one of this file's entries");
    staging_.fill(destination, device, size, [&](void* host, size_t offset, size_t bytes) {
        pread_exactly(descriptor_, path_, offsets_[index] + first + offset, host, bytes);
    });
}


void TrainingState::add_tensor(StateTensor tensor) {
    check_tensor_for_writing(tensor);
    ENGINE_CHECK(find(tensor.name) == nullptr, "state tensor name " << tensor.name << " appears twice");
    tensors.push_back(std::move(tensor));
}

void TrainingState::add_tensor(const std::string& name, const Tensor& tensor) {
    StateTensor stored{name, tensor.dtype(), tensor.shape(), std::vector<uint8_t>(tensor.nbytes())};
    copy_bytes(stored.data.data(), Device::cpu, tensor.raw_data(), tensor.device(), tensor.nbytes());
    add_tensor(std::move(stored));
}

const StateTensor* TrainingState::find(std::string_view name) const {
    for (const StateTensor& tensor : tensors)
        if (tensor.name == name) return &tensor;
    return nullptr;
}

void TrainingState::copy_into(const std::string& name, Tensor& destination) const {
    const StateTensor* stored = find(name);
    ENGINE_CHECK(stored != nullptr, "training state has no tensor named " << name);
    ENGINE_CHECK(stored->dtype == destination.dtype() && stored->shape == destination.shape(),
                 "training state tensor " << name << " is " << shape_string(stored->shape) << " "
                                          << dtype_name(stored->dtype) << ", the destination is "
                                          << destination.describe());
    detail::impl_of(destination).storage->set_host_copy(nullptr); // written behind the ids' host copy, if any
    copy_bytes(destination.raw_data(), destination.device(), stored->data.data(), Device::cpu, stored->data.size());
}

std::vector<uint8_t> serialize_state(const TrainingState& state) {
    std::vector<uint8_t> out;
    write_state(source_of(state), [&](const void* bytes, size_t size) {
        const auto* begin = static_cast<const uint8_t*>(bytes);
        out.insert(out.end(), begin, begin + size);
    });
    return out;
}

void write_state_file(const std::string& path, const TrainingState& state) {
    write_state_file(path, source_of(state));
}

void write_state_file(const std::string& path, const StateSource& source) {
    write_file_atomically(path, [&](const ByteSink& sink) { write_state(source, sink); });
}

TrainingState read_state_file(const std::string& path) {
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    return parse_state(bytes.data(), bytes.size(), path);
}

TrainingState parse_state(const uint8_t* bytes, size_t size, const std::string& source) {
    const std::string where = "state file " + source + ": ";
    uint8_t head[header_bytes] = {};
    if (size > 0) std::memcpy(head, bytes, std::min(size, header_bytes));
    check_header(head, size, where);
    check_checksum(get_u32(bytes + size - checksum_bytes),
                   crc32_update(crc32_update(0, nullptr, 0), bytes, size - checksum_bytes), where);
    TrainingState state;
    auto read_at = [&](uint64_t offset, void* destination, uint64_t count) {
        if (count > 0) std::memcpy(destination, bytes + offset, count);
    };
    state.metadata_json = walk_body(head, size, where, read_at, [&](StateTensor tensor, uint64_t offset, uint64_t count) {
        tensor.data.assign(bytes + offset, bytes + offset + count);
        state.tensors.push_back(std::move(tensor));
    });
    return state;
}

} // namespace engine::io
