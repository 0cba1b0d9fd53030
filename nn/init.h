// Seeded, platform-independent initialisation: the generator that hands each parameter its Philox stream, and
// normals and uniforms drawn from a stream (not std::normal_distribution, whose output differs between
// standard libraries).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/random.h"
#include "engine/tensor.h"

namespace engine::nn {

// A seed and a stream counter: each parameter created from it takes the next Philox stream (seed, stream), so a
// model's initial values depend only on the seed and the order in which its parameters are made. Held by
// shared_ptr (ParameterOptions::generator, GPT's own): every layer built from it shares the counter, and it
// lives as long as the last holder, so nothing can dangle.
class Generator {
public:
    explicit Generator(uint64_t seed = 0) : seed_(seed) {}
    uint64_t seed() const { return seed_; }
    uint64_t next_stream() const { return next_stream_; } // the stream the next parameter takes
    uint64_t take_stream() { return next_stream_++; }

private:
    uint64_t seed_;
    uint64_t next_stream_ = 0;
};

// This thread's default generator: what layers built without one draw from (seed 0 until manual_seed). Per
// thread, as the engine's dropout stream (engine/random.h): two threads building models never race on it.
const std::shared_ptr<Generator>& default_generator();
// As torch.manual_seed: restarts this thread's default generator at `seed`, stream 0 (in place: holders of
// default_generator() see the restart), and seeds the engine's dropout stream with it (engine::manual_seed).
void manual_seed(uint64_t seed);

// Normals and uniforms from a Philox stream (seed, stream), the same on every platform: the engine draws them
// (engine/random.h); a layer takes its stream from a Generator.
using engine::normal_tensor;
using engine::uniform_tensor;

} // namespace engine::nn
