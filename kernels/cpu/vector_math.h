// SIMD loops for the CPU kernels whose cost is a transcendental or a generator per element (GELU's tanh,
// cross-entropy's exp, dropout's Philox draws),
// through Google Highway with runtime dispatch: one binary, the widest vectors the machine has (SSSE3, SSE4, AVX2,
// AVX-512, or the scalar fallback). Each element's arithmetic is one fixed sequence of vector operations whatever its position, so the
// chunked threads of parallel.h still give bitwise the same results for any thread count. Across instruction
// sets the bits may differ (FMA on AVX2/AVX-512, not on SSE4; lane counts of the sums), so a run is bitwise
// reproducible on one kind of machine. tests/test_vector_math.cpp runs every target this CPU can run. docs/PERF.md, "SIMD through Highway", states each kernel's agreement with
// the scalar loops these replace.
#pragma once

#include <cstdint>

namespace engine::kernels::cpu::simd {

// out[i] = GELU(inp[i]), the tanh approximation, all in f32: s*(x + a*x^3) as one FMA chain, Highway's tanh.
void gelu_forward(float* out, const float* inp, int64_t count);
// dinp[i] += GELU'(inp[i]) * dout[i], the same tanh as gelu_forward; with accumulate false dinp is not read and
// gets 0 + GELU'(inp[i]) * dout[i].
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t count, bool accumulate);

// The largest of row[0..count), count >= 1; NaN when any element is NaN.
float row_max(const float* row, int64_t count);
// sum over i of exp(double(row[i]) - shift), in f64: the exponentials in f64 vectors, summed lane-wise. For a
// finite shift and elements that are finite or -inf only: Highway's exp gives 0, not NaN, for a NaN argument.
double exp_sum(const float* row, double shift, int64_t count);
// The softmax cross-entropy gradient of one row: g_i = (exp(double(row[i]) - logsumexp) - [i == target]) * dloss,
// each computed in f64 and rounded once to f32. `accumulate` adds it into out (out[i] += float(g_i)); otherwise
// out[i] = float(g_i). out may be row (the fused kernel overwrites the logits in place). For a finite logsumexp
// (then every element is finite or -inf), as exp_sum.
void softmax_cross_entropy_gradient(float* out, const float* row, double logsumexp, int64_t target, double dloss,
                                    int64_t count, bool accumulate);

// The instruction set the calls above dispatch to on this CPU ("AVX3", "AVX2", "SSE4", ...): for logs and tests.
const char* dispatched_target();

// draws[j] = philox4x32_10(offset + first_index + j, seed).value[0] >> 8 (kernels/common/philox.h): the 24 random
// bits behind philox_uniform, bitwise, for count consecutive elements of the stream; one counter per vector lane.
void philox_draws(uint32_t* draws, uint64_t seed, uint64_t offset, uint64_t first_index, int64_t count);

} // namespace engine::kernels::cpu::simd
