// bfloat16: the storage type of mixed precision (docs/TRAINING.md, "bf16"), with the one rounding rule every
// kernel uses, on the host, on the GPU and on the emulated device, so CPU and CUDA kernels round alike.
//
// Kernels are templated on their storage type and compute in Compute<T>: float for bfloat16, T itself for
// float and double. widen() loads a value into the compute type, narrow<T>() rounds it back on store
// (round to nearest, ties to even), so a kernel written once serves f32, f64 and bf16 with its rounding
// points explicit. Parameter gradients of a bf16 op are Compute<T> too (fp32 accumulation).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define ENGINE_BFLOAT16_FUNCTION __host__ __device__ inline
#else
#define ENGINE_BFLOAT16_FUNCTION inline
#endif

namespace engine {

// The upper 16 bits of an IEEE binary32: 8 exponent bits, 7 explicit mantissa bits. Layout-compatible with
// CUDA's __nv_bfloat16, so CUDA launchers may hand the pointer to cuBLAS and wmma as that type.
struct bfloat16 {
    uint16_t bits;
};
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

ENGINE_BFLOAT16_FUNCTION uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(value);
#else
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

ENGINE_BFLOAT16_FUNCTION float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

// Exact: every bfloat16 is a float.
ENGINE_BFLOAT16_FUNCTION float to_float(bfloat16 value) { return float_from_bits(static_cast<uint32_t>(value.bits) << 16); }

// Round to nearest, ties to even. Overflow rounds to infinity as IEEE does; NaN stays a (quiet) NaN of the
// same sign instead of possibly rounding into infinity.
ENGINE_BFLOAT16_FUNCTION bfloat16 to_bfloat16(float value) {
    const uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return bfloat16{static_cast<uint16_t>((bits + rounding) >> 16)};
}

template <typename T>
struct compute_type {
    using type = T;
};
template <>
struct compute_type<bfloat16> {
    using type = float;
};
// The arithmetic (and parameter-gradient) type of a kernel over storage type T.
template <typename T>
using Compute = typename compute_type<T>::type;

template <typename T>
ENGINE_BFLOAT16_FUNCTION Compute<T> widen(T value) {
    if constexpr (std::is_same_v<T, bfloat16>) return to_float(value);
    else return value;
}

// Stores a computed value in T: the one rounding point of an element.
template <typename T>
ENGINE_BFLOAT16_FUNCTION T narrow(Compute<T> value) {
    if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(value);
    else return value;
}

// The spacing of bfloat16 values at `value` (one unit in the last place): 2^(e-7) for |value| in [2^e, 2^(e+1)),
// never below the subnormal step 2^-133. Host only: tests derive their tolerances from it.
inline double bfloat16_ulp(double value) {
    if (value == 0.0 || !std::isfinite(value)) return std::ldexp(1.0, -133);
    int exponent = 0;
    std::frexp(value, &exponent); // |value| = m·2^exponent, m in [0.5,1)
    return std::ldexp(1.0, std::max(exponent - 8, -133));
}

} // namespace engine
