// Training-state files: one self-checking container (JSON metadata + named raw tensors + CRC32) written
// atomically, and a rotating directory of them that keeps the newest complete state plus one before it.
// docs/RELIABILITY.md gives the byte layout and the write protocol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

// The file's bytes, checksum included.
std::vector<uint8_t> serialize_state(const TrainingState& state);
// Validates everything (magic, version, every declared length against the bytes, checksum, JSON, tensor
// sizes, unique names) and throws EngineError naming `source` and the first thing wrong; returns nothing
// partial.
TrainingState parse_state(const uint8_t* bytes, size_t size, const std::string& source);

// Atomic: writes `path`.tmp-<pid> in the same directory, fsyncs it, renames it over `path` and fsyncs the
// directory. On failure the temporary file is removed and an existing `path` is untouched.
void write_state_file(const std::string& path, const TrainingState& state);
TrainingState read_state_file(const std::string& path);

// ---- rotation in a directory of state-<step>.bin files (one writer per directory) ----

std::string state_file_name(uint64_t step); // "state-000000000042.bin"

// Writes state-<step>.bin durably, then deletes every other state file except the newest one with a
// smaller step (files with a larger step belong to an abandoned run and go too) and stale temporary files.
// Creates the directory when missing. Returns the path written.
std::string save_state_rotating(const std::string& directory, uint64_t step, const TrainingState& state);

struct LoadedState {
    TrainingState state;
    std::string path;           // the file that was used
    uint64_t step = 0;
    std::string refused_reason; // empty when the newest file was used; else why each newer one was refused
};

// Loads the newest state file that validates, falling back to older ones; throws EngineError naming the
// directory (and every refusal) when none does or there are none.
LoadedState load_latest_state(const std::string& directory);

} // namespace engine::io
