// CUDA twins of kernels/cpu/nf4_kernels.h (NF4 weights: quantisation, the double-quantised scales, dequantisation):
// the same names and argument order plus a trailing stream, bitwise the CPU kernels' results. The tables come from
// the CPU side (kernels::cpu::nf4_values, dynamic_map()) as kernel arguments and are staged in shared memory, where
// a warp's 32 different codes are one access instead of a serialised constant-bank read.
// Why: dequantisation runs for every forward, recompute and backward of a 4-bit layer, so it is a memory-bound pass
// (n/2 code bytes and n/64 scales in, n values out) with 16-byte stores; quantisation and the scales' pass run at
// load time or per use on n/64 values, and are plain one-thread-per-block loops.
#pragma once

#include <cstdint>

#include "base/cuda/headers.h"
#include "base/bfloat16.h"

namespace engine::kernels::cuda {

void nf4_quantize(uint8_t* codes, float* absmax, const float* inp, int64_t n, cudaStream_t stream);
void nf4_dequantize_scales(float* absmax, const uint8_t* scale_codes, const float* scale_absmax, float offset,
                           int64_t blocks, cudaStream_t stream);
void nf4_dequantize(float* out, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream);
void nf4_dequantize(bfloat16* out, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream);

} // namespace engine::kernels::cuda
