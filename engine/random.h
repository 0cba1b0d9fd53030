// The engine's counter-based random streams. Dropout's: a seed plus an offset that every random op advances
// by the number of values it draws; checkpoint recompute saves and restores the offset to replay its masks.
// And initial values: normals and uniforms drawn from a Philox stream (seed, stream) on the host, the same on
// every platform (not std::normal_distribution, whose output differs between standard libraries).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace engine {

struct RngState {
    uint64_t seed = 0;
    uint64_t offset = 0;
};

RngState& rng_state(); // per thread
// Puts this thread's RNG state back where it was when the scope began, also when the scope throws: a
// recompute (checkpoint, tiled_rows) replays earlier draws and must leave the stream where the plain run would.
class RngStateRestore {
public:
    RngStateRestore() : saved_(rng_state()) {}
    ~RngStateRestore() { rng_state() = saved_; }
    RngStateRestore(const RngStateRestore&) = delete;
    RngStateRestore& operator=(const RngStateRestore&) = delete;

private:
    RngState saved_;
};
void manual_seed(uint64_t seed); // sets seed and resets offset to 0
// Reserves `count` values of the stream and returns the offset of the first.
uint64_t advance_rng(uint64_t count);

// A host tensor of N(0, std²) values drawn from Philox stream (seed, stream) by Box-Muller. dtype f64 gives f64
// values, any other dtype f32 (each value rounded once).
Tensor normal_tensor(const Shape& shape, double standard_deviation, uint64_t seed, uint64_t stream, DType dtype);
// A host tensor of U[-bound, bound) values from Philox stream (seed, stream), 53 random bits per value,
// rounded once to the dtype (f64 or f32, as normal_tensor).
Tensor uniform_tensor(const Shape& shape, double bound, uint64_t seed, uint64_t stream, DType dtype);

} // namespace engine
