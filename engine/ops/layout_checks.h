// The dtype check every layout op makes before it allocates: a floating tensor, and on CUDA one of the CUDA
// kernels' storage types (f32, bf16).
#pragma once

#include "base/error.h"
#include "engine/tensor.h"

namespace engine::detail {

inline void check_layout_dtype(const char* op, const Tensor& tensor) {
    ENGINE_CHECK(is_floating(tensor.dtype()), op << ": expected a floating-point tensor, got " << tensor.describe());
    ENGINE_CHECK(tensor.device() == Device::cpu || tensor.dtype() != DType::f64,
                 op << ": CUDA kernels take f32 or bf16, got " << tensor.describe());
}

} // namespace engine::detail
