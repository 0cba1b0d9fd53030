// Training-state files: one self-checking container (JSON metadata + named raw tensors + CRC32) written
// atomically, and a rotating directory of them that keeps the newest complete state plus one before it.
// docs/RELIABILITY.md gives the byte layout and the write protocol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/atomic_file.h"
#include "engine/tensor.h"

namespace engine::io {

inline constexpr char state_file_magic[8] = {'L', 'I', 'B', 'E', 'N', 'G', 'S', 'T'};
inline constexpr uint32_t state_file_version = 1;

// One named tensor as stored: host bytes in little-endian order, numel(shape) * dtype_size(dtype) long.
struct StateTensor {
    std::string name;
    DType dtype = DType::f32;
    Shape shape;
    std::vector<uint8_t> data;
};

struct TrainingState {
    std::string metadata_json = "{}"; // must be a JSON object
    std::vector<StateTensor> tensors; // names are unique

    // Copies a tensor's contents (from any device) under `name`; throws on a duplicate name.
    void add_tensor(const std::string& name, const Tensor& tensor);
    void add_tensor(StateTensor tensor);
    // nullptr when absent.
    const StateTensor* find(std::string_view name) const;
    // Overwrites `destination` (any device) with the stored tensor `name`; throws EngineError, changing
    // nothing, when it is absent or its dtype or shape differs.
    void copy_into(const std::string& name, Tensor& destination) const;
};

// ---- streaming: a state written and read tensor by tensor, never whole in memory ----

// A tensor to be written whose bytes are fetched only when the writer reaches it: `emit` passes exactly
// numel(shape)·dtype_size(dtype) bytes to its sink, in order, in as many calls as it likes. An empty sink means
// "drop the bytes": a data-parallel rank that does not write runs every emit all the same, because an emit may
// be a collective (ZeRO-1 gathers each tensor from the ranks that hold its parts).
struct StateTensorSource {
    std::string name;
    DType dtype = DType::f32;
    Shape shape;
    std::function<void(const ByteSink& sink)> emit;
};

struct StateSource {
    std::string metadata_json = "{}";
    std::vector<StateTensorSource> tensors; // in file order; names unique
};

// A source over a state held in memory (its vectors, which must outlive the source).
StateSource source_of(const TrainingState& state);

// The pinned host block through which the streaming paths move a device's tensors (one per save or resume, and
// only when a tensor lives on a device): the host never holds more of the state than this at once.
inline constexpr size_t state_staging_bytes = size_t(8) << 20;

// Passes `bytes` (`size` of them, on `device`) to `sink`: straight from host memory, or from a device through
// `staging` (a pinned block of state_staging_bytes, allocated on first use and kept for the next tensor). An
// empty sink drops them and copies nothing.
class StateStaging {
public:
    StateStaging() = default;
    ~StateStaging();
    StateStaging(const StateStaging&) = delete;
    StateStaging& operator=(const StateStaging&) = delete;
    void emit(const void* bytes, Device device, size_t size, const ByteSink& sink);
    // Copies `size` bytes into `destination` on `device`, pulling them through `read(host, offset, bytes)` in pieces:
    // straight into host memory, or through the pinned block to a device.
    void fill(void* destination, Device device, size_t size,
              const std::function<void(void* host, size_t offset, size_t bytes)>& read);

private:
    void* block();
    void* block_ = nullptr;
};

// Writes the file through `sink`. Every emit runs to the end even when the sink fails part way (a full disk): the
// failure is thrown after the last tensor, so that ranks taking part in an emit's collective are not left waiting.
void write_state(const StateSource& source, const ByteSink& sink);

// What a restore reads from: a state held in memory, or a file read in place.
class StateReader {
public:
    virtual ~StateReader() = default;
    struct Entry {
        std::string name;
        DType dtype = DType::f32;
        Shape shape;
        uint64_t bytes = 0; // numel·dtype_size
    };
    virtual const std::string& metadata_json() const = 0;
    virtual const std::vector<Entry>& entries() const = 0; // in file order
    const Entry* find(std::string_view name) const;
    // Copies bytes [first, first + size) of tensor `name`'s data into `destination` on `device`; throws EngineError
    // when the range is outside the tensor.
    virtual void read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const = 0;
};

// A TrainingState read as a StateReader (it must outlive the reader).
class MemoryStateReader : public StateReader {
public:
    explicit MemoryStateReader(const TrainingState& state);
    const std::string& metadata_json() const override { return state_.metadata_json; }
    const std::vector<Entry>& entries() const override { return entries_; }
    void read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const override;

private:
    const TrainingState& state_;
    std::vector<Entry> entries_;
};

// A state file opened in place. Opening validates the whole file as parse_state does (the same checks and
// messages) in two passes through a 256 KiB buffer (the checksum, then the records' heads), keeping the metadata and
// an index of the tensors; reads then come from the file at each tensor's offset, into host memory directly or to a
// device through one pinned block. The file stays open, so a newer save renamed over its path does not change what
// is read; the data is not checksummed again when read (a file changed in place between the two would be read as it
// is then).
class StateFileReader : public StateReader {
public:
    explicit StateFileReader(const std::string& path); // throws EngineError naming the path and what is wrong
    ~StateFileReader() override;
    StateFileReader(const StateFileReader&) = delete;
    StateFileReader& operator=(const StateFileReader&) = delete;
    const std::string& path() const { return path_; }
    const std::string& metadata_json() const override { return metadata_json_; }
    const std::vector<Entry>& entries() const override { return entries_; }
    void read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const override;

private:
    std::string path_;
    int descriptor_ = -1;
    std::string metadata_json_;
    std::vector<Entry> entries_;
    std::vector<uint64_t> offsets_; // each entry's data in the file
    mutable StateStaging staging_;  // the pinned block a device's reads pass through, made at the first
};

// The file's bytes, checksum included.
std::vector<uint8_t> serialize_state(const TrainingState& state);
// Validates everything (magic, version, every declared length against the bytes, checksum, JSON, tensor
// sizes, unique names) and throws EngineError naming `source` and the first thing wrong; returns nothing
// partial.
TrainingState parse_state(const uint8_t* bytes, size_t size, const std::string& source);

// Atomic: writes `path`.tmp-<pid> in the same directory, fsyncs it, renames it over `path` and fsyncs the
// directory. On failure the temporary file is removed and an existing `path` is untouched.
void write_state_file(const std::string& path, const TrainingState& state);
void write_state_file(const std::string& path, const StateSource& source);
TrainingState read_state_file(const std::string& path);

// ---- rotation in a directory of state-<step>.bin files (one writer per directory) ----

std::string state_file_name(uint64_t step); // "state-000000000042.bin"

// Writes state-<step>.bin durably, then deletes every other state file except the newest one with a
// smaller step (files with a larger step belong to an abandoned run and go too) and stale temporary files.
// Creates the directory when missing. Returns the path written.
std::string save_state_rotating(const std::string& directory, uint64_t step, const TrainingState& state);
std::string save_state_rotating(const std::string& directory, uint64_t step, const StateSource& source);

struct LoadedState {
    TrainingState state;
    std::string path;           // the file that was used
    uint64_t step = 0;
    std::string refused_reason; // empty when the newest file was used; else why each newer one was refused
};

// Loads the newest state file that validates, falling back to older ones; throws EngineError naming the
// directory (and every refusal) when none does or there are none.
LoadedState load_latest_state(const std::string& directory);

// The same choice, the newest file that validates, opened in place (StateFileReader) instead of read whole.
struct OpenedState {
    std::unique_ptr<StateFileReader> reader;
    uint64_t step = 0;
    std::string refused_reason;
};
OpenedState open_latest_state(const std::string& directory);

} // namespace engine::io
