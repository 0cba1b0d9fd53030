// libFuzzer target: the training-state reader (engine/io/state_file.h). EngineError is the expected answer
// to bad bytes; crashes, leaks, undefined behaviour and any other exception are findings.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "engine/io/state_file.h"

namespace {

// Whatever parses must serialise back to exactly the same bytes: the format has one encoding per state.
void check_round_trip(const uint8_t* data, size_t size) {
    engine::io::TrainingState state;
    try {
        state = engine::io::parse_state(data, size, "fuzz-input");
    } catch (const engine::EngineError&) {
        return;
    }
    const std::vector<uint8_t> again = engine::io::serialize_state(state);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    check_round_trip(data, size);
    // Random mutations almost never keep the CRC32 right, so also try the input with its checksum fixed:
    // that reaches the length and record validation behind the checksum.
    if (size >= 44) {
        std::vector<uint8_t> sealed(data, data + size);
        const uint32_t crc = static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), sealed.data(), size - 4));
        for (int index = 0; index < 4; ++index) sealed[size - 4 + index] = static_cast<uint8_t>(crc >> (8 * index));
        check_round_trip(sealed.data(), sealed.size());
    }
    return 0;
}
