// Seeded, platform-independent initialisation: normals from the Philox stream, not std::normal_distribution
// (whose output differs between standard libraries).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace engine::nn {

// A host tensor of N(0, std²) values drawn from Philox stream (seed, stream); same on every platform.
Tensor normal_tensor(const Shape& shape, double standard_deviation, uint64_t seed, uint64_t stream, DType dtype);

} // namespace engine::nn
