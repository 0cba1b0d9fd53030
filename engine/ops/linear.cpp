// linear (x·W + b, W stored (in,out)) and matmul (a·b or a·bᵀ): forward, backward and checks, over GEMM.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#if ENGINE_HAS_CUDA
#include "engine/cuda/scratch.h"
#endif

namespace engine {
using namespace detail;
namespace {

// c(m,n) = alpha·op(a)·op(b) + beta·c on the tensors' device.
void gemm_tensors(const Tensor& c, const Tensor& a, const Tensor& b, int m, int n, int k, bool transpose_a,
                  bool transpose_b, double beta) {
    if (c.device() == Device::cpu) {
        dispatch_floating("gemm", c.dtype(), [&]<typename T>() {
            kernels::cpu::gemm<T>(c.data<T>(), a.data<T>(), b.data<T>(), m, n, k, transpose_a, transpose_b, T(1),
                                  static_cast<T>(beta));
        });
    } else {
        ENGINE_ON_CUDA("gemm", c.dtype(),
                       kernels::cuda::gemm(c.data<float>(), a.data<float>(), b.data<float>(), m, n, k, transpose_a,
                                           transpose_b, 1.0f, static_cast<float>(beta), cuda::tf32_enabled(),
                                           cuda::cublas_handle(), cuda::compute_stream()));
    }
}

// out(rows,columns) = input·weight + bias. On CUDA the bias rides in the GEMM's cuBLASLt epilogue, which
// saves a read and a write of `out`; the CPU adds it after the GEMM, as the reference does.
void gemm_bias_tensors(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias, int rows,
                       int columns, int inner) {
    if (out.device() == Device::cpu) {
        gemm_tensors(out, input, weight, rows, columns, inner, false, false, 0.0);
        dispatch_floating("linear", out.dtype(), [&]<typename T>() {
            kernels::cpu::bias_add_forward<T>(out.data<T>(), bias.data<T>(), rows, columns);
        });
    } else {
        ENGINE_ON_CUDA("linear", out.dtype(),
                       kernels::cuda::gemm_bias(out.data<float>(), input.data<float>(), weight.data<float>(),
                                                bias.data<float>(), rows, columns, inner, false, false,
                                                cuda::tf32_enabled(), cuda::cublaslt_handle(), cuda::cublaslt_workspace(),
                                                cuda::cublaslt_workspace_bytes, cuda::compute_stream()));
    }
}

void bias_backward_tensors(const Tensor& dbias, const Tensor& dout, int rows, int columns) {
    if (dbias.device() == Device::cpu) {
        dispatch_floating("linear", dbias.dtype(), [&]<typename T>() {
            kernels::cpu::bias_backward<T>(dbias.data<T>(), dout.data<T>(), rows, columns);
        });
    } else {
        ENGINE_ON_CUDA("linear", dbias.dtype(), {
            const cuda::Scratch<float> partials(kernels::cuda::bias_backward_workspace_count(rows, columns),
                                                cuda::compute_stream()); // (row chunks, OC)
            kernels::cuda::bias_backward(dbias.data<float>(), partials.get(), dout.data<float>(), rows, columns,
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
    else gemm_tensors(out, input, weight, rows, out_features, in_features, false, false, 0.0);

    GradTarget input_target(input), weight_target(weight), bias_target;
    if (bias.defined()) bias_target = GradTarget(bias);
    record_node(op, {&input, &weight, &bias}, {&out},
                [=, saved_input = input, saved_weight = weight, output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id); // (rows,out)
                    if (Tensor dinput = context.input_grad(input_target); dinput.defined())
                        gemm_tensors(dinput, dout, saved_weight, rows, in_features, out_features, false, true, 1.0);
                    if (Tensor dweight = context.input_grad(weight_target); dweight.defined())
                        gemm_tensors(dweight, saved_input, dout, in_features, out_features, rows, true, false, 1.0);
                    if (Tensor dbias = context.input_grad(bias_target); dbias.defined())
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
    gemm_tensors(out, a, b, rows, columns, inner, false, transpose_b, 0.0);

    GradTarget a_target(a), b_target(b);
    record_node(op, {&a, &b}, {&out}, [=, saved_a = a, saved_b = b, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // (rows,N)
        if (Tensor da = context.input_grad(a_target); da.defined())
            gemm_tensors(da, dout, saved_b, rows, inner, columns, false, !transpose_b, 1.0);
        if (Tensor db = context.input_grad(b_target); db.defined()) {
            if (transpose_b) gemm_tensors(db, dout, saved_a, columns, inner, rows, true, false, 1.0); // (N,K)
            else gemm_tensors(db, saved_a, dout, inner, columns, rows, true, false, 1.0);              // (K,N)
        }
    });
    return out;
}

} // namespace engine
