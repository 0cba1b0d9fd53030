// Box-Muller over Philox uniforms: reproducible initial weights for a given seed.
#include "nn/init.h"

#include <cmath>
#include <numbers>

#include "kernels/common/philox.h"

namespace engine::nn {

Tensor normal_tensor(const Shape& shape, double standard_deviation, uint64_t seed, uint64_t stream, DType dtype) {
    const int64_t count = shape_numel(shape);
    std::vector<double> values(static_cast<size_t>(count));
    // Each parameter gets its own region of the counter space, 2^40 values apart.
    const uint64_t base = stream << 40;
    for (int64_t index = 0; index < count; ++index) {
        const kernels::Philox4x32 bits = kernels::philox4x32_10(base + static_cast<uint64_t>(index), seed);
        const double u1 = (static_cast<double>(bits.value[0]) + 1.0) / 4294967296.0; // (0,1]
        const double u2 = static_cast<double>(bits.value[1]) / 4294967296.0;         // [0,1)
        values[static_cast<size_t>(index)] =
            standard_deviation * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }
    if (dtype == DType::f64) return Tensor::from_vector<double>(values, shape, Device::cpu);
    return Tensor::from_vector<float>(std::vector<float>(values.begin(), values.end()), shape, Device::cpu);
}

} // namespace engine::nn
