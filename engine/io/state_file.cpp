// The training-state container format: serialisation and strict validation. Every length the header or
// a record declares is checked against the bytes actually present before it is used, so a lying or
// damaged file is refused with a message instead of read out of bounds.
#include "engine/io/state_file.h"

#include <bit>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "base/error.h"
#include "engine/io/atomic_file.h"

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

void check_metadata(const std::string& text, const std::string& source) {
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(!parsed.is_discarded(), "state file " << source << ": metadata is not valid JSON");
    ENGINE_CHECK(parsed.is_object(), "state file " << source << ": metadata is JSON but not an object");
}

void check_tensor_for_writing(const StateTensor& tensor) {
    ENGINE_CHECK(!tensor.name.empty() && tensor.name.size() <= max_name_bytes,
                 "state tensor name must have 1.." << max_name_bytes << " bytes, got " << tensor.name.size());
    ENGINE_CHECK(tensor.shape.size() <= max_rank,
                 "state tensor " << tensor.name << ": rank " << tensor.shape.size() << " over " << max_rank);
    uint64_t expected = 0;
    ENGINE_CHECK(tensor_bytes(tensor.shape, tensor.dtype, &expected),
                 "state tensor " << tensor.name << ": invalid shape " << shape_string(tensor.shape));
    ENGINE_CHECK(expected == tensor.data.size(), "state tensor " << tensor.name << " " << shape_string(tensor.shape)
                                                                 << " " << dtype_name(tensor.dtype) << " needs "
                                                                 << expected << " bytes, holds " << tensor.data.size());
}

// Emits the whole file through `sink` (pieces in order), checksum last.
void emit_state(const TrainingState& state, const ByteSink& sink) {
    check_metadata(state.metadata_json, "(being written)");
    std::unordered_set<std::string_view> names;
    uint64_t file_bytes = header_bytes + state.metadata_json.size() + checksum_bytes;
    for (const StateTensor& tensor : state.tensors) {
        check_tensor_for_writing(tensor);
        ENGINE_CHECK(names.insert(tensor.name).second, "state tensor name " << tensor.name << " appears twice");
        file_bytes += record_head_bytes + tensor.name.size() + 8 * tensor.shape.size() + 8 + tensor.data.size();
    }

    uint32_t crc = crc32_update(0, nullptr, 0);
    auto write = [&](const void* bytes, size_t size) {
        if (size == 0) return;
        crc = crc32_update(crc, bytes, size);
        sink(bytes, size);
    };
    std::vector<uint8_t> head(state_file_magic, state_file_magic + 8);
    put_u32(head, state_file_version);
    put_u32(head, 0);
    put_u64(head, file_bytes);
    put_u64(head, state.metadata_json.size());
    put_u64(head, state.tensors.size());
    write(head.data(), head.size());
    write(state.metadata_json.data(), state.metadata_json.size());
    for (const StateTensor& tensor : state.tensors) {
        head.clear();
        put_u32(head, static_cast<uint32_t>(tensor.name.size()));
        put_u32(head, dtype_code(tensor.dtype));
        put_u32(head, static_cast<uint32_t>(tensor.shape.size()));
        put_u32(head, 0);
        head.insert(head.end(), tensor.name.begin(), tensor.name.end());
        for (int64_t extent : tensor.shape) put_u64(head, static_cast<uint64_t>(extent));
        put_u64(head, tensor.data.size());
        write(head.data(), head.size());
        write(tensor.data.data(), tensor.data.size());
    }
    head.clear();
    put_u32(head, crc);
    sink(head.data(), head.size());
}

} // namespace

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
    emit_state(state, [&](const void* bytes, size_t size) {
        const auto* begin = static_cast<const uint8_t*>(bytes);
        out.insert(out.end(), begin, begin + size);
    });
    return out;
}

void write_state_file(const std::string& path, const TrainingState& state) {
    // Streams into the file, so that a large model is not held twice in memory.
    write_file_atomically(path, [&](const ByteSink& sink) { emit_state(state, sink); });
}

TrainingState read_state_file(const std::string& path) {
    const std::vector<uint8_t> bytes = read_file_bytes(path);
    return parse_state(bytes.data(), bytes.size(), path);
}

TrainingState parse_state(const uint8_t* bytes, size_t size, const std::string& source) {
    const std::string where = "state file " + source + ": ";
    ENGINE_CHECK(size >= header_bytes + checksum_bytes,
                 where << "truncated: " << size << " bytes, shorter than the " << header_bytes + checksum_bytes
                       << "-byte minimum");
    ENGINE_CHECK(std::memcmp(bytes, state_file_magic, 8) == 0, where << "bad magic (not a libengine state file)");
    const uint32_t version = get_u32(bytes + 8);
    ENGINE_CHECK(version == state_file_version,
                 where << "unsupported version " << version << " (this build reads " << state_file_version << ")");
    const uint64_t file_bytes = get_u64(bytes + 16);
    ENGINE_CHECK(file_bytes == size, where << (file_bytes > size ? "truncated" : "trailing bytes") << ": header says "
                                           << file_bytes << " bytes, the file has " << size);
    const uint32_t stored_crc = get_u32(bytes + size - checksum_bytes);
    const uint32_t computed_crc = crc32_update(crc32_update(0, nullptr, 0), bytes, size - checksum_bytes);
    ENGINE_CHECK(stored_crc == computed_crc, where << "checksum mismatch (stored CRC32 " << std::hex << stored_crc
                                                   << ", computed " << computed_crc << std::dec
                                                   << "): the file is corrupt");
    ENGINE_CHECK(get_u32(bytes + 12) == 0, where << "reserved header field is not zero");

    // From here the bytes are what the writer produced unless the writer itself was wrong, but every
    // length is still checked so that a crafted file with a matching checksum cannot read out of bounds.
    const size_t body_end = size - checksum_bytes;
    size_t offset = header_bytes;
    auto remaining = [&] { return body_end - offset; };
    const uint64_t metadata_bytes = get_u64(bytes + 24);
    ENGINE_CHECK(metadata_bytes <= remaining(),
                 where << "metadata length " << metadata_bytes << " runs past the end of the file");
    TrainingState state;
    state.metadata_json.assign(reinterpret_cast<const char*>(bytes + offset), metadata_bytes);
    offset += metadata_bytes;
    check_metadata(state.metadata_json, source);

    const uint64_t tensor_count = get_u64(bytes + 32);
    ENGINE_CHECK(tensor_count <= remaining() / (record_head_bytes + 1 + 8),
                 where << "tensor count " << tensor_count << " cannot fit in the " << remaining() << " bytes left");
    state.tensors.reserve(tensor_count);
    std::unordered_set<std::string> names;
    for (uint64_t index = 0; index < tensor_count; ++index) {
        const std::string record = where + "tensor record " + std::to_string(index) + ": ";
        ENGINE_CHECK(remaining() >= record_head_bytes, record << "truncated record header");
        const uint32_t name_bytes = get_u32(bytes + offset);
        const uint32_t code = get_u32(bytes + offset + 4);
        const uint32_t rank = get_u32(bytes + offset + 8);
        ENGINE_CHECK(get_u32(bytes + offset + 12) == 0, record << "reserved field is not zero");
        offset += record_head_bytes;
        ENGINE_CHECK(name_bytes >= 1 && name_bytes <= max_name_bytes,
                     record << "name length " << name_bytes << " outside 1.." << max_name_bytes);
        ENGINE_CHECK(rank <= max_rank, record << "rank " << rank << " over " << max_rank);
        StateTensor tensor;
        ENGINE_CHECK(dtype_from_code(code, &tensor.dtype), record << "unknown dtype code " << code);
        ENGINE_CHECK(uint64_t{name_bytes} + 8ull * rank + 8 <= remaining(),
                     record << "name and shape run past the end of the file");
        tensor.name.assign(reinterpret_cast<const char*>(bytes + offset), name_bytes);
        offset += name_bytes;
        for (uint32_t axis = 0; axis < rank; ++axis, offset += 8)
            tensor.shape.push_back(static_cast<int64_t>(get_u64(bytes + offset)));
        const uint64_t data_bytes = get_u64(bytes + offset);
        offset += 8;
        uint64_t expected = 0;
        ENGINE_CHECK(tensor_bytes(tensor.shape, tensor.dtype, &expected),
                     record << tensor.name << " has an invalid shape " << shape_string(tensor.shape));
        ENGINE_CHECK(data_bytes == expected, record << tensor.name << " " << shape_string(tensor.shape) << " "
                                                    << dtype_name(tensor.dtype) << " declares " << data_bytes
                                                    << " data bytes, its shape needs " << expected);
        ENGINE_CHECK(data_bytes <= remaining(), record << tensor.name << " declares " << data_bytes
                                                       << " data bytes, only " << remaining() << " are left");
        ENGINE_CHECK(names.insert(tensor.name).second, record << "tensor name " << tensor.name << " appears twice");
        tensor.data.assign(bytes + offset, bytes + offset + data_bytes);
        offset += data_bytes;
        state.tensors.push_back(std::move(tensor));
    }
    ENGINE_CHECK(offset == body_end, where << remaining() << " unexplained bytes after the last tensor");
    return state;
}

} // namespace engine::io
