// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), shared verbatim by CPU and CUDA kernels so that
// dropout masks are bit-for-bit identical on both devices for a given (seed, offset).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ENGINE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ENGINE_HOST_DEVICE inline
#endif

namespace engine::kernels {

struct Philox4x32 {
    uint32_t value[4];
};

ENGINE_HOST_DEVICE void philox_multiply(uint32_t a, uint32_t b, uint32_t& high, uint32_t& low) {
    const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
    high = static_cast<uint32_t>(product >> 32);
    low = static_cast<uint32_t>(product);
}

// Ten rounds of Philox on counter (c0..c3) with 64-bit key `seed`.
ENGINE_HOST_DEVICE Philox4x32 philox4x32_10(uint64_t counter, uint64_t seed) {
    constexpr uint32_t multiplier0 = 0xD2511F53u, multiplier1 = 0xCD9E8D57u;
    constexpr uint32_t weyl0 = 0x9E3779B9u, weyl1 = 0xBB67AE85u;
    uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        uint32_t high0, low0, high1, low1;
        philox_multiply(multiplier0, c0, high0, low0);
        philox_multiply(multiplier1, c2, high1, low1);
        const uint32_t next0 = high1 ^ c1 ^ k0, next2 = high0 ^ c3 ^ k1;
        c0 = next0;
        c1 = low1;
        c2 = next2;
        c3 = low0;
        k0 += weyl0;
        k1 += weyl1;
    }
    return Philox4x32{{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) for element `index` of the stream (seed, offset): 24 random bits, exact in
// float on every device.
ENGINE_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t offset, uint64_t index) {
    const Philox4x32 bits = philox4x32_10(offset + index, seed);
    return static_cast<float>(bits.value[0] >> 8) * (1.0f / 16777216.0f);
}

} // namespace engine::kernels
