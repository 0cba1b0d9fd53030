// Element types and devices a tensor can have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/bfloat16.h"

namespace engine {

// u8: storage only (NF4 weights' codes, docs/FORMATS.md); no op computes in it.
enum class DType { f32, f64, i32, bf16, u8 };
enum class Device { cpu, cuda };

constexpr size_t dtype_size(DType dtype) {
    switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::u8: return 1;
    }
    return 0;
}

inline const char* dtype_name(DType dtype) {
    switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::u8: return "u8";
    }
    return "?";
}

inline const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

constexpr bool is_floating(DType dtype) { return dtype != DType::i32 && dtype != DType::u8; }
// The dtype kernels compute in and parameter gradients accumulate in: f32 for bf16 storage (mixed
// precision), the dtype itself otherwise. A bf16 leaf's persistent gradient buffer has this dtype.
constexpr DType compute_dtype(DType dtype) { return dtype == DType::bf16 ? DType::f32 : dtype; }

} // namespace engine
