// A module's parameters or gradients read back as float64 vectors, one per parameter, for the trainer tests'
// comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/ops.h"
#include "nn/module.h"

namespace engine::testing {

inline std::vector<double> as_doubles(const Tensor& tensor) {
    if (tensor.dtype() == DType::f64) return tensor.to_vector<double>();
    // bf16 (a frozen parameter stored in its compute dtype) widens exactly.
    const std::vector<float> values = tensor.dtype() == DType::bf16 ? cast(tensor, DType::f32).to_vector<float>()
                                                                     : tensor.to_vector<float>();
    return {values.begin(), values.end()};
}

using Snapshot = std::vector<std::vector<double>>;

// Every tensor's bytes end to end, in order, from any device: what a bitwise comparison of two runs' weights or
// optimizer states reads.
inline std::vector<uint8_t> bytes_of(const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::vector<uint8_t> bytes;
    for (const auto& [name, tensor] : tensors) {
        const Tensor host = tensor.device() == Device::cpu ? tensor : tensor.to(Device::cpu, MemoryCategory::workspace);
        const auto* data = static_cast<const uint8_t*>(host.raw_data());
        bytes.insert(bytes.end(), data, data + host.nbytes());
    }
    return bytes;
}

// Values rounded to bf16 as the engine rounds (to nearest even), then widened: what a frozen f32 parameter holds
// once set_compute_dtype(bf16) has stored it in bf16.
inline std::vector<double> bf16_rounded(const std::vector<double>& values) {
    const Tensor exact = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())}, Device::cpu);
    return as_doubles(cast(cast(exact, DType::f32), DType::bf16));
}
inline Snapshot gradients_of(const nn::Module& model) {
    Snapshot snapshot;
    for (const Tensor& parameter : model.parameters()) snapshot.push_back(as_doubles(parameter.grad()));
    return snapshot;
}
inline Snapshot values_of(const nn::Module& model) {
    Snapshot snapshot;
    for (const Tensor& parameter : model.parameters()) snapshot.push_back(as_doubles(parameter));
    return snapshot;
}

// The global L2 norm over every tensor of a snapshot, in double: what the trainer's clip sees.
inline double global_norm(const Snapshot& snapshot) {
    double squares = 0.0;
    for (const auto& tensor : snapshot)
        for (double value : tensor) squares += value * value;
    return std::sqrt(squares);
}

} // namespace engine::testing
