// safetensors reading (validated header, F32/BF16/F64 data), atomic saving, and loading into a module (every check
// before any change, then streamed a chunk at a time) with the Hugging Face GPT-2 name mapping.
#include "nn/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "base/bfloat16.h"
#include "engine/io/atomic_file.h"
#include "nn/io/files.h"

namespace engine::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

constexpr int64_t max_header_bytes = 100'000'000; // the reference implementation's limit
const std::string hf_prefix = "transformer.";

// Element sizes of every dtype the safetensors format defines; only F32, BF16 and F64 are converted.
int64_t safetensors_dtype_size(const std::string& dtype) {
    static const std::map<std::string, int64_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
    const auto found = sizes.find(dtype);
    return found == sizes.end() ? 0 : found->second;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& value,
                             int64_t data_bytes) {
    const std::string where = "safetensors '" + path + "': tensor '" + name + "'";
    ENGINE_CHECK(value.is_object() && value.contains("dtype") && value["dtype"].is_string() &&
                     value.contains("shape") && value["shape"].is_array() && value.contains("data_offsets") &&
                     value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
                 where << ": header entry needs dtype (string), shape (array) and data_offsets ([begin,end])");
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = value["dtype"].get<std::string>();
    const int64_t element_size = safetensors_dtype_size(entry.dtype);
    ENGINE_CHECK(element_size > 0, where << ": unknown dtype '" << entry.dtype << "'");
    // Saturates instead of overflowing: a lying shape then simply fails the size comparison below.
    constexpr int64_t saturated = int64_t{1} << 59;
    int64_t numel = 1;
    for (const nlohmann::json& dimension : value["shape"]) {
        ENGINE_CHECK(dimension.is_number_unsigned(), where << ": shape entries must be non-negative integers");
        const int64_t size = static_cast<int64_t>(std::min<uint64_t>(dimension.get<uint64_t>(), saturated));
        entry.shape.push_back(size);
        numel = (size != 0 && numel > saturated / size) ? saturated : numel * size;
    }
    for (const nlohmann::json& offset : value["data_offsets"])
        ENGINE_CHECK(offset.is_number_unsigned(), where << ": data_offsets must be non-negative integers");
    const auto begin = value["data_offsets"][0].get<uint64_t>();
    const auto end = value["data_offsets"][1].get<uint64_t>();
    ENGINE_CHECK(begin <= end && end <= static_cast<uint64_t>(data_bytes),
                 where << ": data_offsets [" << begin << "," << end << "] fall outside the " << data_bytes
                       << "-byte data section (truncated file or lying header)");
    entry.begin = static_cast<int64_t>(begin);
    entry.end = static_cast<int64_t>(end);
    ENGINE_CHECK(entry.end - entry.begin == numel * element_size,
                 where << ": data_offsets span " << entry.end - entry.begin << " bytes but shape "
                       << shape_string(entry.shape) << " of " << entry.dtype << " needs " << numel * element_size);
    return entry;
}

bool is_mask_buffer(const std::string& name) {
    auto ends_with = [&](const std::string& suffix) {
        return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with(".rotary_emb.inv_freq");
}

// The dtypes a load converts: F32 and BF16 (into f32, bf16 or f64), F64.
void check_loadable(const SafetensorsHeader& header, const SafetensorsEntry& entry) {
    ENGINE_CHECK(entry.dtype == "F32" || entry.dtype == "BF16" || entry.dtype == "F64",
                 "safetensors '" << header.path << "': tensor '" << entry.name << "' has dtype " << entry.dtype
                                 << "; only F32, BF16 and F64 can be loaded");
}

// Elements a load converts at a time: 2 MiB of F64 in, at most 2 MiB out.
constexpr int64_t load_chunk_elements = int64_t(1) << 18;

// Elements of one file tensor converted to `dtype` (as read_safetensors_tensor and a cast give them: the same dtype's
// bytes as they are, exact widening, F64 to f32 rounded to nearest, bf16 rounded to nearest even from f32), a chunk
// at a time through two buffers of at most 2 MiB: the host never holds the tensor.
class ChunkReader {
public:
    ChunkReader(const SafetensorsHeader& header, const SafetensorsEntry& entry, DType dtype)
        : header_(header), entry_(entry), dtype_(dtype) {
        check_loadable(header, entry);
        ENGINE_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                     "safetensors '" << header.path << "': tensor '" << entry.name << "' cannot be loaded into "
                                     << dtype_name(dtype));
        int64_t size = 0;
        file_ = io_detail::open_for_reading(header.path, &size);
        ENGINE_CHECK(header.data_start + entry.end <= size, "safetensors '" << header.path << "': tensor '" << entry.name
                                                                            << "' ends beyond the file (it changed since open)");
        source_size_ = safetensors_dtype_size(entry.dtype);
        count_ = (entry.end - entry.begin) / source_size_;
        const bool same = (entry.dtype == "F32" && dtype == DType::f32) || (entry.dtype == "F64" && dtype == DType::f64) ||
                          (entry.dtype == "BF16" && dtype == DType::bf16);
        conversion_ = same ? Conversion::same
                      : entry.dtype == "BF16" && dtype == DType::f32 ? Conversion::bf16_to_f32
                                                                      : Conversion::through_double;
        raw_.resize(static_cast<size_t>(std::min(count_, load_chunk_elements) * source_size_));
        if (conversion_ != Conversion::same)
            converted_.resize(static_cast<size_t>(std::min(count_, load_chunk_elements)) * dtype_size(dtype));
    }
    int64_t count() const { return count_; }
    // Elements [first, first + chunk), chunk at most load_chunk_elements; valid until the next call. A file dtype that
    // is the parameter's is its bytes as they are (a NaN's payload too); BF16 into f32 is the exact shift.
    const void* read(int64_t first, int64_t chunk) {
        io_detail::read_exactly(file_, header_.path, header_.data_start + entry_.begin + first * source_size_, raw_.data(),
                                chunk * source_size_, "tensor '" + entry_.name + "'");
        if (conversion_ == Conversion::same) return raw_.data();
        const size_t out_size = dtype_size(dtype_);
        for (int64_t index = 0; index < chunk; ++index) {
            const uint8_t* in = raw_.data() + index * source_size_;
            uint8_t* out = converted_.data() + static_cast<size_t>(index) * out_size;
            if (conversion_ == Conversion::bf16_to_f32) {
                const uint32_t bits = uint32_t{load_u16(in)} << 16; // bf16 is an f32's top half
                std::memcpy(out, &bits, 4);
                continue;
            }
            double value = 0; // every F32, BF16 and F64 value exactly
            if (entry_.dtype == "F64") std::memcpy(&value, in, 8);
            else if (entry_.dtype == "F32") value = std::bit_cast<float>(load_u32(in));
            else value = std::bit_cast<float>(uint32_t{load_u16(in)} << 16);
            if (dtype_ == DType::f64) {
                std::memcpy(out, &value, 8);
            } else if (dtype_ == DType::f32) {
                const float rounded = static_cast<float>(value); // F64 to f32: to nearest, as a cast
                std::memcpy(out, &rounded, 4);
            } else {
                const bfloat16 rounded = to_bfloat16(static_cast<float>(value));
                std::memcpy(out, &rounded, 2);
            }
        }
        return converted_.data();
    }

private:
    static uint32_t load_u32(const uint8_t* at) { uint32_t value; std::memcpy(&value, at, 4); return value; }
    static uint16_t load_u16(const uint8_t* at) { uint16_t value; std::memcpy(&value, at, 2); return value; }
    const SafetensorsHeader& header_;
    const SafetensorsEntry& entry_;
    DType dtype_;
    std::ifstream file_;
    enum class Conversion { same, bf16_to_f32, through_double } conversion_ = Conversion::same; // chosen per tensor
    int64_t source_size_ = 0, count_ = 0;
    std::vector<uint8_t> raw_, converted_;
};

} // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
    for (const SafetensorsEntry& entry : entries)
        if (entry.name == name) return &entry;
    return nullptr;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
    int64_t size = 0;
    std::ifstream file = io_detail::open_for_reading(path, &size);
    ENGINE_CHECK(size >= 8, "safetensors '" << path << "': file too short (" << size
                                            << " bytes) to hold the 8-byte header length");
    unsigned char length_bytes[8];
    io_detail::read_exactly(file, path, 0, length_bytes, 8, "the header length");
    uint64_t header_length = 0;
    for (int index = 7; index >= 0; --index) header_length = header_length << 8 | length_bytes[index];
    ENGINE_CHECK(header_length <= static_cast<uint64_t>(size - 8) && header_length <= max_header_bytes,
                 "safetensors '" << path << "': header length " << header_length << " runs beyond the file of "
                                 << size << " bytes (truncated file or lying header)");
    std::string text(header_length, '\0');
    io_detail::read_exactly(file, path, 8, text.data(), static_cast<int64_t>(header_length), "the JSON header");
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(!json.is_discarded(), "safetensors '" << path << "': the header is not valid JSON");
    ENGINE_CHECK(json.is_object(), "safetensors '" << path << "': the header is JSON but not an object");

    SafetensorsHeader header;
    header.path = path;
    header.data_start = 8 + static_cast<int64_t>(header_length);
    const int64_t data_bytes = size - header.data_start;
    for (const auto& [name, value] : json.items()) {
        if (name == "__metadata__") {
            ENGINE_CHECK(value.is_object(), "safetensors '" << path << "': __metadata__ must be an object");
            for (const auto& [key, item] : value.items()) {
                ENGINE_CHECK(item.is_string(), "safetensors '" << path << "': __metadata__ value '" << key
                                                               << "' must be a string");
                header.metadata[key] = item.get<std::string>();
            }
            continue;
        }
        header.entries.push_back(parse_entry(path, name, value, data_bytes));
    }
    std::sort(header.entries.begin(), header.entries.end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& entry : header.entries) {
        if (entry.begin == entry.end) continue; // an empty tensor occupies nothing
        ENGINE_CHECK(previous == nullptr || entry.begin >= previous->end,
                     "safetensors '" << path << "': tensor '" << entry.name << "' [" << entry.begin << ","
                                     << entry.end << ") overlaps tensor '" << previous->name << "' ["
                                     << previous->begin << "," << previous->end << ")");
        previous = &entry;
    }
    return header;
}

Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry) {
    const std::string what = "tensor '" + entry.name + "'";
    check_loadable(header, entry);
    int64_t size = 0;
    std::ifstream file = io_detail::open_for_reading(header.path, &size);
    ENGINE_CHECK(header.data_start + entry.end <= size,
                 "safetensors '" << header.path << "': " << what << " ends beyond the file (it changed since open)");
    const int64_t offset = header.data_start + entry.begin;
    const int64_t bytes = entry.end - entry.begin;
    if (entry.dtype == "BF16") {
        std::vector<uint16_t> halves(static_cast<size_t>(bytes / 2));
        if (bytes > 0) io_detail::read_exactly(file, header.path, offset, halves.data(), bytes, what);
        Tensor out = Tensor::empty(entry.shape, DType::f32, Device::cpu);
        float* values = out.data<float>();
        // bfloat16 is the top half of an IEEE float32: widening is exact.
        for (size_t i = 0; i < halves.size(); ++i) values[i] = std::bit_cast<float>(uint32_t{halves[i]} << 16);
        return out;
    }
    Tensor out = Tensor::empty(entry.shape, entry.dtype == "F32" ? DType::f32 : DType::f64, Device::cpu);
    if (bytes > 0) io_detail::read_exactly(file, header.path, offset, out.raw_data(), bytes, what);
    return out;
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
    const SafetensorsHeader header = read_safetensors_header(path);
    std::map<std::string, Tensor> tensors;
    for (const SafetensorsEntry& entry : header.entries) tensors.emplace(entry.name, read_safetensors_tensor(header, entry));
    return tensors;
}

void save_safetensors(const Module& module, const std::string& path, std::optional<DType> file_dtype,
                      const std::string& name_prefix) {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const auto& [name, parameter] : module.named_parameters()) named.emplace_back(name_prefix + name, parameter);
    save_safetensors(named, path, file_dtype);
}

void save_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
                      std::optional<DType> file_dtype) {
    ENGINE_CHECK(!file_dtype || *file_dtype == DType::f32 || *file_dtype == DType::f64 || *file_dtype == DType::bf16,
                 "save_safetensors '" << path << "': cannot write " << dtype_name(*file_dtype)
                                      << " (F32, F64 or BF16 only)");
    nlohmann::ordered_json json;
    json["__metadata__"] = {{"format", "pt"}};
    std::vector<std::vector<char>> payloads;
    int64_t offset = 0;
    for (const auto& [name, parameter] : tensors) {
        ENGINE_CHECK(parameter.dtype() == DType::f32 || parameter.dtype() == DType::f64 || parameter.dtype() == DType::bf16,
                     "save_safetensors '" << path << "': parameter " << parameter.describe() << " is not a float");
        const DType dtype = file_dtype.value_or(parameter.dtype());
        Tensor host = parameter.to(Device::cpu, MemoryCategory::workspace);
        if (dtype != parameter.dtype()) { // rounded on the host: no device memory for the file's copy
            Tensor converted = Tensor::empty(parameter.shape(), dtype, Device::cpu, MemoryCategory::workspace);
            convert_into(converted, host);
            host = converted;
        }
        std::vector<char> bytes(host.nbytes());
        std::memcpy(bytes.data(), host.raw_data(), bytes.size());
        const int64_t size = static_cast<int64_t>(bytes.size());
        json[name] = {{"dtype", dtype == DType::f32 ? "F32" : dtype == DType::f64 ? "F64" : "BF16"},
                      {"shape", parameter.shape()},
                      {"data_offsets", {offset, offset + size}}};
        offset += size;
        payloads.push_back(std::move(bytes));
    }
    std::string header = json.dump();
    header.append((8 - header.size() % 8) % 8, ' '); // aligns the data section to 8 bytes, as the reference does
    io::write_file_atomically(path, [&](const io::ByteSink& sink) {
        unsigned char length_bytes[8];
        for (int index = 0; index < 8; ++index)
            length_bytes[index] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * index));
        sink(length_bytes, 8);
        sink(header.data(), header.size());
        for (const std::vector<char>& bytes : payloads) sink(bytes.data(), bytes.size());
    });
}

void load_safetensors_into(Module& module, const std::string& path) {
    load_safetensors_into(module, std::vector<std::string>{path}, CheckpointNames{});
}

void load_safetensors_into(Module& module, const std::vector<std::string>& paths, const CheckpointNames& names) {
    ENGINE_CHECK(!paths.empty(), "load_safetensors_into: no file given");
    std::vector<SafetensorsHeader> headers;
    headers.reserve(paths.size());
    for (const std::string& path : paths) headers.push_back(read_safetensors_header(path));
    // One file: its path; shards: the first and how many more, as errors name where a tensor was looked for.
    const std::string where = paths.size() == 1 ? "safetensors '" + paths[0] + "'"
                                                : "safetensors '" + paths[0] + "' (and " +
                                                      std::to_string(paths.size() - 1) + " more shards)";
    std::map<std::string, Tensor> parameters;
    for (const auto& [name, parameter] : module.named_parameters()) parameters.emplace(name, parameter);

    // Map every file name to a parameter, a skipped buffer, or the tied head; anything else is an error.
    struct Found {
        const SafetensorsHeader* header;
        const SafetensorsEntry* entry;
    };
    std::map<std::string, Found> by_parameter;
    std::optional<Found> lm_head;
    const std::string& prefix = names.accepted_prefix;
    for (const SafetensorsHeader& header : headers) {
        for (const SafetensorsEntry& entry : header.entries) {
            std::string name = entry.name;
            if (!prefix.empty() && name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
            if (parameters.count(name)) {
                ENGINE_CHECK(!by_parameter.count(name),
                             "safetensors '" << header.path << "': tensor '" << name << "' appears twice"
                                             << (prefix.empty() ? "" : " (with and without '" + prefix + "')"));
                by_parameter[name] = {&header, &entry};
            } else if (is_mask_buffer(name)) {
                continue;
            } else if (name == "lm_head.weight") {
                lm_head = Found{&header, &entry};
            } else {
                ENGINE_FAIL("safetensors '" << header.path << "': tensor '" << entry.name
                                            << "' matches no parameter of the model (wrong model size?)");
            }
        }
    }
    for (const auto& [name, parameter] : parameters) {
        const auto found = by_parameter.find(name);
        ENGINE_CHECK(found != by_parameter.end(), where << ": parameter '" << name << "' "
                                                        << shape_string(parameter.shape()) << " is missing from the file");
        ENGINE_CHECK(found->second.entry->shape == parameter.shape(),
                     "safetensors '" << found->second.header->path << "': tensor '" << found->second.entry->name
                                     << "' has shape " << shape_string(found->second.entry->shape) << " but parameter '"
                                     << name << "' needs " << shape_string(parameter.shape()));
    }

    // Everything that can fail is checked before the model changes: the names and shapes above, every dtype, and
    // a tied head's values against its table's, compared a chunk at a time in the table's dtype.
    for (const auto& [name, found] : by_parameter) {
        check_loadable(*found.header, *found.entry);
        const DType dtype = parameters.at(name).dtype();
        ENGINE_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                     where << ": parameter '" << name << "' is " << dtype_name(dtype) << ", not a float to load into");
    }
    if (lm_head) {
        const std::string& head_path = lm_head->header->path;
        const std::string& head_name = lm_head->entry->name;
        check_loadable(*lm_head->header, *lm_head->entry);
        const auto table = by_parameter.find(names.tied_table);
        ENGINE_CHECK(table != by_parameter.end(), "safetensors '" << head_path << "': tensor '" << head_name
                                                                  << "' given but the model has no " << names.tied_table
                                                                  << " to tie it to");
        ENGINE_CHECK(lm_head->entry->shape == table->second.entry->shape,
                     "safetensors '" << head_path << "': tensor '" << head_name << "' has shape "
                                     << shape_string(lm_head->entry->shape) << ", not " << names.tied_table << "'s "
                                     << shape_string(table->second.entry->shape));
        const DType dtype = parameters.at(names.tied_table).dtype();
        ChunkReader head(*lm_head->header, *lm_head->entry, dtype), tied(*table->second.header, *table->second.entry, dtype);
        bool same = true;
        for (int64_t first = 0; same && first < head.count(); first += load_chunk_elements) {
            const int64_t chunk = std::min(load_chunk_elements, head.count() - first);
            const void* head_values = head.read(first, chunk);
            same = std::memcmp(head_values, tied.read(first, chunk), static_cast<size_t>(chunk) * dtype_size(dtype)) == 0;
        }
        ENGINE_CHECK(same, "safetensors '" << head_path << "': tensor '" << head_name << "' differs from "
                                           << names.tied_table << "; this model's LM head is tied to it");
    }
    // Then each tensor in turn, a chunk at a time, straight into its parameter (on its device): the host holds two
    // buffers of at most 2 MiB, never a copy of the model. A read that fails now (the file shrank, the disk failed)
    // leaves the model part-loaded; the error says which tensor.
    for (auto& [name, parameter] : parameters) {
        const Found& found = by_parameter.at(name);
        detail::impl_of(parameter).storage->set_host_copy(nullptr);
        const size_t element = dtype_size(parameter.dtype());
        ChunkReader reader(*found.header, *found.entry, parameter.dtype());
        for (int64_t first = 0; first < reader.count(); first += load_chunk_elements) {
            const int64_t chunk = std::min(load_chunk_elements, reader.count() - first);
            copy_bytes(static_cast<uint8_t*>(parameter.raw_data()) + static_cast<size_t>(first) * element,
                       parameter.device(), reader.read(first, chunk), Device::cpu, static_cast<size_t>(chunk) * element);
        }
    }
    module.refresh_working_copies();
}

} // namespace engine::nn
