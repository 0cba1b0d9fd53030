// NF4 weights (QLoRA's frozen base in 4 bits, docs/TRAINING.md "QLoRA"; the layout in docs/FORMATS.md, "NF4
// weights") and the linear op that reads one: the weight is dequantised for the forward and again for the backward,
// and never kept whole. Defined in engine/ops/nf4_linear.cpp; kernels in kernels/{cpu,cuda}/nf4.*.
#pragma once

#include "engine/tensor.h"

namespace engine {

// A weight of `shape` in NF4 with double-quantised scales, as bitsandbytes' Linear4bit holds it
// (kernels/cpu/nf4_kernels.h): 0.5 bytes an element, 1 byte per 64 and 4 per 16384, plus the offset.
struct Nf4Weight {
    Tensor codes;        // (ceil(n/2)) u8: two 4-bit codes a byte, the even element in the high nibble
    Tensor scale_codes;  // (ceil(n/64)) u8: each block's absmax, in the dynamic 8-bit code
    Tensor scale_absmax; // (ceil(n/16384)) f32: each group of 256 scales' absmax
    float offset = 0.0f; // the scales' mean, subtracted before their quantisation
    Shape shape;         // the weight's

    bool defined() const { return codes.defined(); }
    int64_t numel() const;
    size_t bytes() const; // the three tensors' storage
    Device device() const { return codes.device(); }
    // The same weight on `device` (the tensors copied; the offset and shape as they are).
    Nf4Weight to(Device device) const;
};

// `weight` (f32 or bf16, on any device) in NF4, on its device, its tensors in `category`: codes and absmax there
// (kernels::*::nf4_quantize), the scales' double quantisation on the host (n/64 values, one f64 sum in a fixed order).
Nf4Weight quantize_nf4(const Tensor& weight, MemoryCategory category = MemoryCategory::parameters);
// The weight again in `dtype` (f32 or bf16), on its device: each element NF4[code] · its block's absmax, the absmax
// map[scale code] · scale_absmax + offset, each product and sum rounded once to f32.
Tensor dequantize_nf4(const Nf4Weight& weight, DType dtype, MemoryCategory category = MemoryCategory::workspace);

// A linear layer over a frozen NF4 weight: out = input · W (W (in,out), `transposed` false: nn::Linear's layout) or
// input · Wᵀ (W (out,in), true: torch.nn.Linear's), plus bias (frozen: its gradient is refused) when defined. The
// forward dequantises W into a workspace tensor, runs the dense op's GEMM (so the output is bitwise that of linear /
// matmul with the dequantised weight) and lets W go; the node saves only the NF4 weight, and its backward dequantises
// W again for the input gradient. The weight has no gradient: it is frozen by construction.
Tensor nf4_linear(const Tensor& input, const Nf4Weight& weight, bool transposed, const Tensor& bias = Tensor());

} // namespace engine
