// The batch-invariant mode's gradient fold (docs/TRAINING.md, "The big batch, bitwise"): a chunk's f32 gradient
// rounded onto a fixed grid and added into a double sum that stays exact; the reference for
// kernels/cuda/fixed_point.cu.
#include <atomic>
#include <bit>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

// Each term is an integer multiple of 2^-exponent below 2^53 of them (the caller's bound), so the double add is exact
// and the sum is the same whatever order the chunks, micro-batches and ranks bring the terms in. The gradient goes
// back to zero for the next chunk's backward (`+=` from zero). `largest` keeps the bits of the largest |g| seen: for
// non-negative floats (and NaN with its sign cleared, which orders above infinity) the bits order as the values, so a
// max of the bits is exact in any order, and a NaN anywhere wins.
void fixed_point_fold(double* sum, uint32_t* largest, float* gradient, int exponent, int64_t N) {
    const double up = std::ldexp(1.0, exponent), down = std::ldexp(1.0, -exponent); // exact powers of two
    std::atomic<uint32_t> seen{*largest};
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        uint32_t local = 0;
        for (int64_t i = begin; i < end; ++i) {
            const float value = gradient[i];
            local = std::max(local, std::bit_cast<uint32_t>(std::fabs(value)));
            sum[i] += std::nearbyint(static_cast<double>(value) * up) * down; // ties to even (the default mode)
            gradient[i] = 0.0f;
        }
        uint32_t current = seen.load();
        while (local > current && !seen.compare_exchange_weak(current, local)) {
        }
    });
    *largest = seen.load();
}

// The window's gradient from its exact sum, rounded once to f32 (to nearest, ties to even).
void fixed_point_round(float* gradient, const double* sum, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) gradient[i] = static_cast<float>(sum[i]);
    });
}

} // namespace engine::kernels::cpu
