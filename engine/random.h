// The engine's counter-based random stream: a seed plus an offset that every random op advances by the
// number of values it draws. Checkpoint recompute saves and restores the offset to replay dropout masks.
#pragma once

#include <cstdint>

namespace engine {

struct RngState {
    uint64_t seed = 0;
    uint64_t offset = 0;
};

RngState& rng_state(); // per thread
void manual_seed(uint64_t seed); // sets seed and resets offset to 0
// Reserves `count` values of the stream and returns the offset of the first.
uint64_t advance_rng(uint64_t count);

} // namespace engine
