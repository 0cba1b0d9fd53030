// The per-thread counter-based RNG position (see engine/random.h).
#include "engine/random.h"

namespace engine {
namespace {
thread_local RngState thread_rng;
}
RngState& rng_state() { return thread_rng; }
void manual_seed(uint64_t seed) { thread_rng = RngState{seed, 0}; }
uint64_t advance_rng(uint64_t count) {
    const uint64_t first = thread_rng.offset;
    thread_rng.offset += count;
    return first;
}
} // namespace engine
