// CPU reference kernels of 4-bit NormalFloat (NF4) weights, QLoRA's storage as bitsandbytes lays it out
// (load_in_4bit, bnb_4bit_quant_type nf4, bnb_4bit_use_double_quant); conventions as in kernels/cpu/cpu_kernels.h.
// The CUDA twins are declared in kernels/cuda/nf4_kernels.h. docs/FORMATS.md ("NF4 weights") describes the layout;
// tests/test_nf4.cpp checks these bit for bit against bitsandbytes (tests/golden/make_nf4_golden.py).
// Why this layout: a weight of n elements costs n/2 bytes of codes, one byte of scale per 64 of them and four
// bytes per 16384 (0.516 bytes an element, 3.9x less than bf16); dequantising is one table lookup and two f32
// products an element, so a layer's weight is rebuilt on the fly, for its forward, recompute and backward.
#pragma once

#include <array>
#include <cstdint>

#include "base/bfloat16.h"

namespace engine::kernels::cpu {

inline constexpr int64_t nf4_block = 64;        // elements that share one absmax scale
inline constexpr int64_t nf4_scale_block = 256; // absmax scales that share one second-level scale

// The 16 NF4 values (QLoRA's normal-float code: quantiles of N(0,1) scaled to [-1, 1], with an exact 0), and the
// 15 thresholds between neighbours that bitsandbytes' quantiser compares against (their midpoints, each rounded
// to f32). Code c decodes to nf4_values[c]; a normalised value x encodes to the number of thresholds it exceeds
// (x > t), so a tie goes to the lower code and NaN (the 0 · inf of an all-zero block) to code 0.
extern const std::array<float, 16> nf4_values;
const std::array<float, 15>& nf4_thresholds();
// The signed dynamic 8-bit map that quantises the absmax scales (bitsandbytes' create_dynamic_map(signed=True):
// 127 magnitudes over seven decades, both signs, 0 and 1), ascending, with its first entry -1.0 as bitsandbytes'
// CPU quantiser sets it.
const std::array<float, 256>& dynamic_map();

// NF4 quantisation of n values: per block of 64 (the last may be shorter), absmax = max |x|, then each x · (1 /
// absmax) (both rounded to f32) is encoded; element 2i goes to the high nibble of codes[i], 2i+1 to the low one
// (an odd n leaves the last low nibble 0). codes: (n+1)/2 bytes; absmax: ceil(n/64).
void nf4_quantize(uint8_t* codes, float* absmax, const float* inp, int64_t n);
// Double quantisation of `blocks` absmax scales: offset = their mean (summed in f64, rounded once to f32); per block
// of 256, the centred scales v = absmax - offset have absmax2 = max |v|, and each v / absmax2 gets the nearest
// dynamic_map() entry (the lower one on a tie). scale_codes: blocks bytes; scale_absmax: ceil(blocks/256); offset: 1.
void nf4_quantize_scales(uint8_t* scale_codes, float* scale_absmax, float* offset, const float* absmax, int64_t blocks);
// absmax[b] = dynamic_map()[scale_codes[b]] · scale_absmax[b / 256] + offset, the product and the sum each
// rounded to f32 (no FMA).
void nf4_dequantize_scales(float* absmax, const uint8_t* scale_codes, const float* scale_absmax, float offset,
                           int64_t blocks);
// out[i] = nf4_values[code of i] · absmax[i / 64], rounded to f32, then to Scalar (bf16: to nearest even).
template <typename Scalar>
void nf4_dequantize(Scalar* out, const uint8_t* codes, const float* absmax, int64_t n);

} // namespace engine::kernels::cpu
