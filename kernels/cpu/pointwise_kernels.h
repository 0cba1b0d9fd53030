// CPU reference kernels of the pointwise ops (conventions: kernels/cpu/cpu_kernels.h): the unary functions and
// the broadcasting binary ones. The formulas live in kernels/common/pointwise_functions.h, shared with CUDA.
// Why: one formula per function in that shared header, so the CPU and the GPU evaluate the same expression
// (libm here, the CUDA functions there). The op builds the broadcast layout on the host
// (kernels/common/broadcast_layout.h) with size-1 dimensions dropped and neighbours that broadcast alike
// merged, so a kernel indexes at most a few dimensions. A broadcast operand's gradient sums its output elements
// in output order, in double, the order the CUDA lanes cover too.
// Where one op lives, relu for instance (add: engine/ops/broadcast.cpp, broadcast.cpp/.cu): engine/ops/unary.cpp
// (declared in engine/ops/pointwise.h), kernels/cpu/unary.cpp, kernels/cuda/unary.cu;
// tests/test_pointwise_gradcheck.cpp (f64 finite differences), tests/cuda/test_pointwise_ops_kernels.cpp.
#pragma once

#include <cstdint>

#include "base/bfloat16.h"
#include "kernels/common/pointwise_functions.h"

namespace engine::kernels::cpu {

// out = f(inp), elementwise, in Compute<Scalar>.
template <typename Scalar>
void unary_forward(Scalar* out,       // (N)
                   const Scalar* inp, // (N)
                   int64_t N, UnaryFunction function);
// dinp += f'(·) · dout, from `saved`: the forward's output where unary_backward_reads_output(function), else
// its input.
template <typename Scalar>
void unary_backward(Scalar* dinp,        // (N) +=
                    const Scalar* dout,  // (N)
                    const Scalar* saved, // (N)
                    int64_t N, UnaryFunction function);

// out = f(a, b) with a and b broadcast to out (layout: kernels/common/broadcast_layout.h).
template <typename Scalar>
void binary_forward(Scalar* out,     // (layout.count)
                    const Scalar* a, // a's own shape
                    const Scalar* b, // b's own shape
                    const BroadcastLayout& layout, BinaryFunction function);
// d(operand gradient.which) += Σ over the output elements that read it of dout · ∂f/∂operand, summed in double
// in output order. a and b may be null where binary_partial_reads_a / _b says the partial does not read them.
template <typename Scalar>
void binary_backward(Scalar* doperand,   // the operand's shape +=
                     const Scalar* dout, // (layout.count)
                     const Scalar* a, const Scalar* b, const GradientLayout& gradient, BinaryFunction function);

} // namespace engine::kernels::cpu
