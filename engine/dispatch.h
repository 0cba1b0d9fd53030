// One switch per op entry point: CPU kernels by storage type (f32, f64, bf16), CUDA kernels (f32, bf16) on the
// compute stream. The CPU helpers also time the kernel for the op profiler (engine/profiling.h) when it is on.
#pragma once

#include "engine/memory_timeline.h"
#include "engine/profiling.h"
#include "engine/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/llama_kernels.h"

namespace engine::detail {

// Calls fn.template operator()<T>() with T = float or double: the kernels that have no bf16 form.
template <typename Function>
void select_floating(const char* op, DType dtype, Function& function) {
    switch (dtype) {
    case DType::f32: function.template operator()<float>(); return;
    case DType::f64: function.template operator()<double>(); return;
    case DType::bf16: ENGINE_FAIL(op << ": has no bf16 kernel; cast the input to f32 first");
    case DType::i32:
    case DType::u8: break;
    }
    ENGINE_FAIL(op << ": expected a floating-point tensor, got " << dtype_name(dtype));
}

// Calls fn.template operator()<T>() with T = float, double or bfloat16: a CPU kernel in every storage type.
template <typename Function>
void select_cpu(const char* op, DType dtype, Function& function) {
    switch (dtype) {
    case DType::f32: function.template operator()<float>(); return;
    case DType::f64: function.template operator()<double>(); return;
    case DType::bf16: function.template operator()<bfloat16>(); return;
    case DType::i32:
    case DType::u8: break;
    }
    ENGINE_FAIL(op << ": expected a floating-point tensor, got " << dtype_name(dtype));
}

// The CPU entry points. Profiling off costs the one branch; on, the kernel call is one profiler region named
// `op` (a string literal: the region keeps the pointer). Only the CPU is timed: a CUDA kernel returns at
// launch, so timing ENGINE_DISPATCH_CUDA would measure launches, not kernels; CUDA time stays in the
// profiler's unprofiled remainder.
// A recording memory timeline files the allocations since the last kernel under this op (one relaxed load when
// off).
// An out-of-memory record names the last kernel dispatched (one store).
inline void note_dispatch(const char* op) {
    note_last_kernel(op);
    if (memory_timeline_recording()) [[unlikely]]
        note_kernel(op);
}

template <typename Function>
void dispatch_floating(const char* op, DType dtype, Function&& function) {
    note_dispatch(op);
    if (profiling::enabled()) [[unlikely]] {
        const profiling::Region region(op);
        select_floating(op, dtype, function);
        return;
    }
    select_floating(op, dtype, function);
}

template <typename Function>
void dispatch_cpu(const char* op, DType dtype, Function&& function) {
    note_dispatch(op);
    if (profiling::enabled()) [[unlikely]] {
        const profiling::Region region(op);
        select_cpu(op, dtype, function);
        return;
    }
    select_cpu(op, dtype, function);
}

inline void require_cuda_f32(const char* op, DType dtype) {
    ENGINE_CHECK(dtype == DType::f32, op << ": this CUDA kernel takes f32, got " << dtype_name(dtype));
}

// Calls fn.template operator()<T>() with T = float or bfloat16: the CUDA kernels' storage types (f64 is the
// CPU's gradient-check type only).
template <typename Function>
void dispatch_cuda(const char* op, DType dtype, Function&& function) {
    note_dispatch(op);
    switch (dtype) {
    case DType::f32: function.template operator()<float>(); return;
    case DType::bf16: function.template operator()<bfloat16>(); return;
    case DType::f64:
    case DType::i32:
    case DType::u8: break;
    }
    ENGINE_FAIL(op << ": CUDA kernels take f32 or bf16, got " << dtype_name(dtype));
}

[[noreturn]] inline void fail_without_cuda(const char* op) {
    ENGINE_FAIL(op << ": tensor is on cuda, but libengine was built without CUDA");
}

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
    ENGINE_CHECK(a.device() == b.device(), op << ": " << a.describe() << " and " << b.describe()
                                                << " are on different devices");
}
inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
    ENGINE_CHECK(a.dtype() == b.dtype(), op << ": dtype mismatch between " << a.describe() << " and "
                                            << b.describe());
}
inline void check_shape(const char* op, const char* what, const Tensor& tensor, const Shape& expected) {
    ENGINE_CHECK(tensor.shape() == expected, op << ": " << what << " has shape " << shape_string(tensor.shape())
                                                << ", expected " << shape_string(expected));
}
// The product of every dimension but the last (the rows a row-wise kernel sees), checked to fit the kernels'
// int row count. Computed by multiplication, so a zero-width last dimension cannot divide by zero.
inline int leading_rows(const char* op, const Tensor& tensor) {
    int64_t rows = 1;
    for (int64_t axis = 0; axis + 1 < tensor.dim(); ++axis) rows *= tensor.shape()[static_cast<size_t>(axis)];
    ENGINE_CHECK(rows <= 2147483647 && tensor.size(-1) <= 2147483647,
                 op << ": " << tensor.describe() << " has more rows or columns than the kernels index (2^31-1)");
    return static_cast<int>(rows);
}

// Returns the pointer to a gradient buffer, or null when the input needs none.
template <typename T>
T* grad_pointer(const Tensor& gradient) {
    return gradient.defined() ? gradient.data<T>() : nullptr;
}

} // namespace engine::detail

// The CUDA side of the switch (ENGINE_DISPATCH_CUDA, ENGINE_ON_CUDA, ENGINE_CUDA_ONLY) and the CUDA kernels'
// declarations: the device layer's, whichever backend this build has.
#include "engine/cuda/dispatch.h"
