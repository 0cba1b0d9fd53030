// Host vectors in and out of bf16 for the bf16 tests: rounded with the engine's one rule, widened exactly.
#pragma once

#include <vector>

#include "base/bfloat16.h"

namespace engine::test {

inline std::vector<bfloat16> rounded(const std::vector<float>& values) {
    std::vector<bfloat16> out;
    out.reserve(values.size());
    for (const float value : values) out.push_back(to_bfloat16(value));
    return out;
}

inline std::vector<float> widened(const std::vector<bfloat16>& values) {
    std::vector<float> out;
    out.reserve(values.size());
    for (const bfloat16 value : values) out.push_back(to_float(value));
    return out;
}

} // namespace engine::test
