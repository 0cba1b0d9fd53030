// linear (x·W + b, W stored (in,out)) and matmul (a·b or a·bᵀ): forward, backward and checks, over GEMM.
#include <type_traits>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"
#include "engine/ops/gemm.h"

namespace engine {
using namespace detail;

namespace detail {

void gemm_tensors(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, int m, int n, int k,
                  bool transpose_a, bool transpose_b, double beta, GemmOffsets offsets) {
    const bool compute_c = c.dtype() != a.dtype();
    ENGINE_CHECK(!compute_c || c.dtype() == compute_dtype(a.dtype()),
                 "gemm: c " << c.describe() << " must be " << dtype_name(a.dtype()) << " or "
                            << dtype_name(compute_dtype(a.dtype())) << " for operands " << a.describe() << " and "
                            << b.describe());
    // The offsets pick row blocks of contiguous matrices (the streaming LM head's chunks): each block must lie
    // inside its tensor.
    const auto inside = [](const Tensor& tensor, int64_t offset, int64_t count) {
        return offset >= 0 && offset + count <= tensor.numel();
    };
    ENGINE_CHECK(inside(c, offsets.c, int64_t(m) * n) && inside(a, offsets.a, int64_t(m) * k) &&
                     inside(b, offsets.b, int64_t(k) * n),
                 "gemm: a (" << m << "x" << k << ") at " << offsets.a << ", b (" << k << "x" << n << ") at " << offsets.b
                             << " or c at " << offsets.c << " passes the end of " << a.describe() << ", "
                             << b.describe() << " or " << c.describe());
    if (c.device() == Device::cpu) {
        dispatch_cpu(op, a.dtype(), [&]<typename T>() {
            using C = Compute<T>;
            const T* a_data = a.data<T>() + offsets.a;
            const T* b_data = b.data<T>() + offsets.b;
            if (compute_c) {
                if constexpr (!std::is_same_v<T, C>)
                    kernels::cpu::gemm<T>(c.data<C>() + offsets.c, a_data, b_data, m, n, k, transpose_a, transpose_b,
                                          C(1), static_cast<C>(beta));
            } else {
                kernels::cpu::gemm<T>(c.data<T>() + offsets.c, a_data, b_data, m, n, k, transpose_a, transpose_b, C(1),
                                      static_cast<C>(beta));
            }
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, a.dtype(), [&]<typename T>() {
            const T* a_data = a.data<T>() + offsets.a;
            const T* b_data = b.data<T>() + offsets.b;
            if (compute_c) {
                kernels::cuda::gemm(c.data<float>() + offsets.c, a_data, b_data, m, n, k, transpose_a, transpose_b, 1.0f,
                                    static_cast<float>(beta), cuda::tf32_enabled(), cuda::cublas_handle(),
                                    cuda::compute_stream());
            } else {
                kernels::cuda::gemm(c.data<T>() + offsets.c, a_data, b_data, m, n, k, transpose_a, transpose_b, 1.0f,
                                    static_cast<float>(beta), cuda::tf32_enabled(), cuda::cublas_handle(),
                                    cuda::compute_stream());
            }
        });
    }
}

} // namespace detail
namespace {

// out(rows,columns) = input·weight + bias. On CUDA the bias rides in the GEMM's cuBLASLt epilogue, which
// saves a read and a write of `out`; the CPU twin (gemm_bias) adds it after the GEMM, in bf16 before the one
// rounding, as the epilogue does.
void gemm_bias_tensors(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias, int rows,
                       int columns, int inner) {
    if (out.device() == Device::cpu) {
        dispatch_cpu("linear", out.dtype(), [&]<typename T>() {
            kernels::cpu::gemm_bias<T>(out.data<T>(), input.data<T>(), weight.data<T>(), bias.data<T>(), rows, columns,
                                       inner, false, false);
        });
    } else {
        ENGINE_DISPATCH_CUDA("linear", out.dtype(), [&]<typename T>() {
            kernels::cuda::gemm_bias(out.data<T>(), input.data<T>(), weight.data<T>(), bias.data<T>(), rows, columns,
                                     inner, false, false, cuda::tf32_enabled(), cuda::cublaslt_handle(),
                                     cuda::cublaslt_workspace(), cuda::cublaslt_workspace_bytes, cuda::compute_stream());
        });
    }
}

// dbias (compute dtype: f32 for bf16 dout) += column sums of dout. Named linear_bias, not linear: the op
// profiler's GEMM share must not include this column walk.
void bias_backward_tensors(const Tensor& dbias, const Tensor& dout, int rows, int columns) {
    if (dbias.device() == Device::cpu) {
        dispatch_cpu("linear_bias", dout.dtype(), [&]<typename T>() {
            kernels::cpu::bias_backward<T>(dbias.data<Compute<T>>(), dout.data<T>(), rows, columns);
        });
    } else {
        ENGINE_DISPATCH_CUDA("linear_bias", dout.dtype(), [&]<typename T>() {
            const cuda::Scratch<float> partials(kernels::cuda::bias_backward_workspace_count(rows, columns),
                                                cuda::compute_stream()); // (row chunks, OC)
            kernels::cuda::bias_backward(dbias.data<float>(), partials.get(), dout.data<T>(), rows, columns,
                                         cuda::compute_stream());
        });
    }
}

Shape with_last(const Shape& shape, int64_t last) {
    Shape result = shape;
    result.back() = last;
    return result;
}

} // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
    constexpr const char* op = "linear";
    ENGINE_CHECK(input.dim() >= 1 && weight.dim() == 2,
                 op << ": input " << input.describe() << " and weight " << weight.describe() << " must be (...,in), (in,out)");
    ENGINE_CHECK(input.size(-1) == weight.size(0), op << ": input " << shape_string(input.shape()) << " and weight "
                                                      << shape_string(weight.shape()) << ": inner dimensions differ");
    check_same_device(op, input, weight);
    check_same_dtype(op, input, weight);
    const int in_features = static_cast<int>(weight.size(0)), out_features = static_cast<int>(weight.size(1));
    if (bias.defined()) {
        check_shape(op, "bias", bias, {out_features});
        check_same_device(op, input, bias);
        check_same_dtype(op, input, bias);
    }
    const int rows = leading_rows(op, input);
    Tensor out = Tensor::empty(with_last(input.shape(), out_features), input.dtype(), input.device()); // (...,out)
    if (bias.defined()) gemm_bias_tensors(out, input, weight, bias, rows, out_features, in_features);
    else gemm_tensors(op, out, input, weight, rows, out_features, in_features, false, false, 0.0);

    GradTarget input_target(input), weight_target(weight), bias_target;
    if (bias.defined()) bias_target = GradTarget(bias);
    // Each side is saved only for the other's gradient: a frozen weight (LoRA's base) needs no saved input, which
    // would otherwise stay alive to the backward for nothing.
    record_node(op, {&input, &weight, &bias}, {&out},
                [=, saved_input = weight_target.requires_grad ? input : Tensor(),
                 saved_weight = input_target.requires_grad ? weight : Tensor(),
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id); // (rows,out)
                    // Written (β = 0) when this is the input's first gradient, else added (β = 1).
                    if (const auto dinput = context.input_grad_to_write(input_target); dinput.buffer.defined())
                        gemm_tensors(op, dinput.buffer, dout, saved_weight, rows, in_features, out_features, false,
                                     true, dinput.fresh ? 0.0 : 1.0);
                    // Parameter gradients in the compute dtype: f32 for bf16, accumulated by the GEMM itself.
                    if (Tensor dweight = context.parameter_grad(weight_target); dweight.defined())
                        gemm_tensors(op, dweight, saved_input, dout, in_features, out_features, rows, true, false, 1.0);
                    if (Tensor dbias = context.parameter_grad(bias_target); dbias.defined())
                        bias_backward_tensors(dbias, dout, rows, out_features);
                });
    return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_b) {
    constexpr const char* op = "matmul";
    ENGINE_CHECK(a.dim() >= 1 && b.dim() == 2, op << ": a " << a.describe() << " and b " << b.describe()
                                                  << " must be (...,K) and 2-D");
    check_same_device(op, a, b);
    check_same_dtype(op, a, b);
    const int inner = static_cast<int>(transpose_b ? b.size(1) : b.size(0));
    const int columns = static_cast<int>(transpose_b ? b.size(0) : b.size(1));
    ENGINE_CHECK(a.size(-1) == inner, op << ": a " << shape_string(a.shape()) << " and b" << (transpose_b ? "ᵀ " : " ")
                                         << shape_string(b.shape()) << ": inner dimensions differ");
    const int rows = leading_rows(op, a);
    Tensor out = Tensor::empty(with_last(a.shape(), columns), a.dtype(), a.device()); // (...,N)
    gemm_tensors(op, out, a, b, rows, columns, inner, false, transpose_b, 0.0);

    GradTarget a_target(a), b_target(b);
    // As linear's: each side saved only for the other's gradient (a frozen b needs no saved a).
    record_node(op, {&a, &b}, {&out}, [=, saved_a = b_target.requires_grad ? a : Tensor(),
                                       saved_b = a_target.requires_grad ? b : Tensor(),
                                       output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // (rows,N)
        if (const auto da = context.input_grad_to_write(a_target); da.buffer.defined()) // β = 0 when first
            gemm_tensors(op, da.buffer, dout, saved_b, rows, inner, columns, false, !transpose_b, da.fresh ? 0.0 : 1.0);
        // b is the parameter side (the LM head's tied token table): its gradient in the compute dtype.
        if (Tensor db = context.parameter_grad(b_target); db.defined()) {
            if (transpose_b) gemm_tensors(op, db, dout, saved_a, columns, inner, rows, true, false, 1.0); // (N,K)
            else gemm_tensors(op, db, saved_a, dout, inner, columns, rows, true, false, 1.0);              // (K,N)
        }
    });
    return out;
}

} // namespace engine
