// libFuzzer target: the training-state readers (engine/io/state_file.h): parse_state over bytes in memory, and the
// reader that opens a file in place (StateFileReader, what a resume uses). EngineError is the expected answer to bad
// bytes; crashes, leaks, undefined behaviour and any other exception are findings, and so is any disagreement
// between the two readers (one accepting what the other refuses, other messages, other bytes).
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/state_file.h"
#include "fuzz_input_file.h"

namespace {

// Whatever parses must serialise back to exactly the same bytes: the format has one encoding per state. The reader
// in place must accept the same file with the same metadata and tensors, or refuse it with the same message.
void check(const uint8_t* data, size_t size) {
    const std::string& path = engine::fuzz::input_as_file(data, size, ".bin");
    std::optional<engine::io::TrainingState> state;
    std::string refusal;
    try {
        state = engine::io::parse_state(data, size, path);
    } catch (const engine::EngineError& error) {
        refusal = error.what();
    }
    try {
        const engine::io::StateFileReader reader(path);
        if (!state || reader.metadata_json() != state->metadata_json || reader.entries().size() != state->tensors.size())
            std::abort();
        for (size_t index = 0; index < state->tensors.size(); ++index) {
            const engine::io::StateTensor& tensor = state->tensors[index];
            const engine::io::StateReader::Entry& entry = reader.entries()[index];
            if (entry.name != tensor.name || entry.dtype != tensor.dtype || entry.shape != tensor.shape) std::abort();
            std::vector<uint8_t> bytes(entry.bytes);
            reader.read(entry, 0, bytes.data(), engine::Device::cpu, bytes.size());
            if (bytes != tensor.data) std::abort();
        }
    } catch (const engine::EngineError& error) {
        if (state || refusal != error.what()) std::abort();
    }
    if (!state) return;
    const std::vector<uint8_t> again = engine::io::serialize_state(*state);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    check(data, size);
    // Random mutations almost never keep the CRC32 right, so also try the input with its checksum fixed:
    // that reaches the length and record validation behind the checksum.
    if (size >= 44) {
        std::vector<uint8_t> sealed(data, data + size);
        const uint32_t crc = static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), sealed.data(), size - 4));
        for (int index = 0; index < 4; ++index) sealed[size - 4 + index] = static_cast<uint8_t>(crc >> (8 * index));
        check(sealed.data(), sealed.size());
    }
    return 0;
}
