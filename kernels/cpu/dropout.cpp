// Dropout whose mask is redrawn from the shared Philox stream (kernels/common/philox.h), the reference for
// kernels/cuda/dropout.cu: the same bits, drawn here a vector of counters at a time.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include "kernels/cpu/vector_math.h"

#include <algorithm>

namespace engine::kernels::cpu {

namespace {

// The Philox draws (vector_math.h, one counter per SIMD lane, bitwise philox_uniform's bits) come a block at a
// time into stack scratch; an element is kept when its uniform is >= p, the expression of philox_uniform.
constexpr int64_t draw_block = 1024;
// ~2 ns an element with the vector draws: 16 Ki elements a chunk, ~30 us.
constexpr int64_t dropout_elements_per_chunk = costly_elements_per_chunk * 4;

template <typename Body>
void for_each_kept(float p, uint64_t seed, uint64_t offset, int64_t begin, int64_t end, Body&& body) {
    uint32_t draws[draw_block];
    for (int64_t first = begin; first < end; first += draw_block) {
        const int64_t count = std::min(draw_block, end - first);
        simd::philox_draws(draws, seed, offset, static_cast<uint64_t>(first), count);
        for (int64_t j = 0; j < count; ++j) body(first + j, static_cast<float>(draws[j]) * (1.0f / 16777216.0f) >= p);
    }
}

} // namespace

template <typename T>
void dropout_forward(T* out, const T* inp, float p, uint64_t seed, uint64_t offset, int64_t N) {
    // p == 0 is an exact copy: multiplying by a computed 1/(1-p) could still round, and no draws are needed.
    if (p == 0.0f) {
        parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) out[i] = inp[i];
        });
        return;
    }
    // In Compute<T>: for bf16 the float scale the CUDA twin's host computes, 1/(1-p).
    const Compute<T> keep_scale = Compute<T>(1) / (Compute<T>(1) - Compute<T>(p));
    // Counter-based: element i's draw depends on (seed, offset, i) alone, so any split gives the same mask.
    parallel_for(N, dropout_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for_each_kept(p, seed, offset, begin, end, [&](int64_t i, bool keep) {
            out[i] = keep ? narrow<T>(widen(inp[i]) * keep_scale) : narrow<T>(0);
        });
    });
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, float p, uint64_t seed, uint64_t offset, int64_t N) {
    if (p == 0.0f) {
        parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) dinp[i] = narrow<T>(widen(dinp[i]) + widen(dout[i]));
        });
        return;
    }
    const Compute<T> keep_scale = Compute<T>(1) / (Compute<T>(1) - Compute<T>(p));
    parallel_for(N, dropout_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for_each_kept(p, seed, offset, begin, end, [&](int64_t i, bool keep) {
            if (keep) dinp[i] = narrow<T>(widen(dinp[i]) + widen(dout[i]) * keep_scale);
        });
    });
}

template void dropout_forward<float>(float*, const float*, float, uint64_t, uint64_t, int64_t);
template void dropout_forward<double>(double*, const double*, float, uint64_t, uint64_t, int64_t);
template void dropout_backward<float>(float*, const float*, float, uint64_t, uint64_t, int64_t);
template void dropout_backward<double>(double*, const double*, float, uint64_t, uint64_t, int64_t);
template void dropout_forward<bfloat16>(bfloat16*, const bfloat16*, float, uint64_t, uint64_t, int64_t);
template void dropout_backward<bfloat16>(bfloat16*, const bfloat16*, float, uint64_t, uint64_t, int64_t);

} // namespace engine::kernels::cpu
