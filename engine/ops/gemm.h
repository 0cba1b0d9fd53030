// The GEMM the ops share (linear, matmul, the streaming LM head): one call on the tensors' device, with row
// blocks picked by element offsets. For engine/ops sources only.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace engine::detail {

// Where each operand's block starts, in elements: a row block of a contiguous row-major matrix is contiguous,
// so an offset of first_row · columns picks rows [first_row, first_row + m).
struct GemmOffsets {
    int64_t c = 0, a = 0, b = 0;
};

// c(m,n) = op(a)·op(b) + beta·c on the tensors' device. a and b share a dtype; c has it too, or is
// compute_dtype of it (an f32 parameter gradient of bf16 operands, accumulated in f32 straight from the GEMM).
// `op` (linear, matmul, linear_cross_entropy) names the dispatch, so that the op profiler files the GEMM under
// the op that ran it.
void gemm_tensors(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, int m, int n, int k,
                  bool transpose_a, bool transpose_b, double beta, GemmOffsets offsets = {});

} // namespace engine::detail
