// The largest model a config may describe (issue 30 item 3): sizes past these could not be held anywhere or pass
// the kernels' index range, and are refused at once, naming the field, instead of being planned or allocated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"

namespace engine::nn {

// The deepest published transformers have under 200 layers; the planner's search and the step walk visit every one.
inline constexpr int64_t max_layers = 1024;
// Widths (hidden, intermediate): a (T,C) row and its index fit 32 bits many times over.
inline constexpr int64_t max_dimension = int64_t(1) << 20;
// Positions: long-context checkpoints reach 2^22 (4M); the RoPE tables at 2^23 are 4 GiB for a head of 128.
inline constexpr int64_t max_positions = int64_t(1) << 23;
inline constexpr int64_t max_vocabulary = int64_t(1) << 24;
// One weight matrix: BLAS and cuBLAS take int dimensions, and the kernels index a matrix's elements in 32 bits.
inline constexpr int64_t max_matrix_elements = (int64_t(1) << 31) - 1;
// Four bytes each would be 4 TiB of masters alone: no machine this engine plans for holds it.
inline constexpr int64_t max_parameters = int64_t(1) << 40;

// The first of the limits above that `value` (the config field `field`) passes, as a ConfigProblem.
inline std::optional<ConfigProblem> over_limit(const char* field, int64_t value, int64_t limit, const char* what) {
    if (value <= limit) return std::nullopt;
    return ConfigProblem{field, std::to_string(value) + " is past the limit of " + std::to_string(limit) + " " + what};
}

// A weight matrix of rows x columns past max_matrix_elements, named.
inline std::optional<ConfigProblem> matrix_over_limit(const char* field, int64_t rows, int64_t columns, const char* matrix) {
    if (rows * columns <= max_matrix_elements) return std::nullopt;
    return ConfigProblem{field, "makes " + std::string(matrix) + " " + std::to_string(rows) + " x " + std::to_string(columns) +
                                    " = " + std::to_string(rows * columns) + " elements, past the limit of " +
                                    std::to_string(max_matrix_elements) + " for one weight matrix (BLAS's int dimensions)"};
}

// A parameter count past max_parameters.
inline std::optional<ConfigProblem> parameters_over_limit(const char* field, int64_t parameters) {
    if (parameters <= max_parameters) return std::nullopt;
    return ConfigProblem{field, "makes " + std::to_string(parameters) + " parameters, past the limit of " +
                                    std::to_string(max_parameters) + " (4 TiB of f32 masters alone)"};
}

} // namespace engine::nn
