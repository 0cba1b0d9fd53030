// The per-thread counter-based RNG position, and Philox streams to initial values: Box-Muller normals and
// 53-bit uniforms, reproducible for a given seed (see engine/random.h).
#include "engine/random.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/common/philox.h"

namespace engine {
namespace {
thread_local RngState thread_rng;

// value(bits) for each element of the stream, then rounded once to the dtype.
template <typename Transform>
Tensor philox_tensor(const Shape& shape, uint64_t seed, uint64_t stream, DType dtype, Transform transform) {
    const int64_t count = shape_numel(shape);
    std::vector<double> values(static_cast<size_t>(count));
    // Each parameter gets its own region of the counter space, 2^40 values apart.
    const uint64_t base = stream << 40;
    for (int64_t index = 0; index < count; ++index)
        values[static_cast<size_t>(index)] =
            transform(kernels::philox4x32_10(base + static_cast<uint64_t>(index), seed));
    if (dtype == DType::f64) return Tensor::from_vector<double>(values, shape, Device::cpu);
    return Tensor::from_vector<float>(std::vector<float>(values.begin(), values.end()), shape, Device::cpu);
}
} // namespace

Tensor normal_tensor(const Shape& shape, double standard_deviation, uint64_t seed, uint64_t stream, DType dtype) {
    return philox_tensor(shape, seed, stream, dtype, [standard_deviation](const kernels::Philox4x32& bits) {
        const double u1 = (static_cast<double>(bits.value[0]) + 1.0) / 4294967296.0; // (0,1]
        const double u2 = static_cast<double>(bits.value[1]) / 4294967296.0;         // [0,1)
        return standard_deviation * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    });
}

Tensor uniform_tensor(const Shape& shape, double bound, uint64_t seed, uint64_t stream, DType dtype) {
    return philox_tensor(shape, seed, stream, dtype, [bound](const kernels::Philox4x32& bits) {
        // 53 bits: exactly representable, so u is in [0,1) and the value in [-bound, bound) before rounding.
        const uint64_t mantissa = (static_cast<uint64_t>(bits.value[0]) << 21) | (bits.value[1] >> 11);
        const double u = static_cast<double>(mantissa) * 0x1p-53;
        return bound * (2.0 * u - 1.0);
    });
}

RngState& rng_state() { return thread_rng; }
void manual_seed(uint64_t seed) { thread_rng = RngState{seed, 0}; }
uint64_t advance_rng(uint64_t count) {
    const uint64_t first = thread_rng.offset;
    thread_rng.offset += count;
    return first;
}
} // namespace engine
