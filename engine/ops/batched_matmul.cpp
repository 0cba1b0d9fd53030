// Batched matmul with transposes, c (...,M,N) = op(a) op(b), over strided-batched GEMMs; a 2-D b is one
// matrix for the whole batch, folded into a single GEMM where the layout allows it.
#include <type_traits>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/layout_checks.h"

namespace engine {
using namespace detail;
namespace {

// One batched GEMM on the tensors' device: c_i = op(a_i) op(b_i) + beta c_i with the given element strides
// (stride_b 0: one b for every entry; stride_c 0: the entries summed into one c). c has a's dtype, or its
// compute dtype (an f32 parameter gradient of bf16 operands). Dispatched as batched_matmul, which the op
// profiler tells apart from the 2-D matmul (the LM head).
struct BatchedGemm {
    int64_t batch;
    int m, n, k;
    bool transpose_a, transpose_b;
    int64_t stride_a, stride_b, stride_c;
};

void batched_gemm_tensors(const Tensor& c, const Tensor& a, const Tensor& b, const BatchedGemm& gemm, double beta) {
    const bool compute_c = c.dtype() != a.dtype();
    if (c.device() == Device::cpu) {
        dispatch_cpu("batched_matmul", a.dtype(), [&]<typename T>() {
            using C = Compute<T>;
            auto run = [&]<typename Out>() {
                kernels::cpu::batched_gemm<T, Out>(c.data<Out>(), a.data<T>(), b.data<T>(), gemm.batch, gemm.m, gemm.n,
                                                   gemm.k, gemm.transpose_a, gemm.transpose_b, gemm.stride_a,
                                                   gemm.stride_b, gemm.stride_c, C(1), static_cast<C>(beta));
            };
            if (!compute_c) run.template operator()<T>();
            else if constexpr (!std::is_same_v<T, C>) run.template operator()<C>();
            else ENGINE_FAIL("matmul: output " << c.describe() << " for " << a.describe() << " must be "
                                               << dtype_name(a.dtype()));
        });
    } else {
        ENGINE_DISPATCH_CUDA("batched_matmul", a.dtype(), [&]<typename T>() {
            auto run = [&]<typename Out>() {
                kernels::cuda::batched_gemm(c.data<Out>(), a.data<T>(), b.data<T>(), gemm.batch, gemm.m, gemm.n, gemm.k,
                                            gemm.transpose_a, gemm.transpose_b, gemm.stride_a, gemm.stride_b,
                                            gemm.stride_c, 1.0f, static_cast<float>(beta), cuda::tf32_enabled(),
                                            cuda::cublas_handle(), cuda::compute_stream());
            };
            if (compute_c) run.template operator()<float>();
            else run.template operator()<T>();
        });
    }
}

int checked_int(const char* op, const Tensor& a, const Tensor& b, int64_t value) {
    ENGINE_CHECK(value <= 2147483647, op << ": a " << shape_string(a.shape()) << " and b " << shape_string(b.shape())
                                         << ": a matrix extent past 2^31-1 (the GEMMs' int)");
    return static_cast<int>(value);
}

} // namespace

Tensor matmul(const Tensor& a, const Tensor& b, MatmulOptions options) {
    constexpr const char* op = "matmul";
    const bool transpose_a = options.transpose_a, transpose_b = options.transpose_b;
    auto shapes = [&] {
        return std::string("a ") + shape_string(a.shape()) + (transpose_a ? "ᵀ" : "") + " and b " +
               shape_string(b.shape()) + (transpose_b ? "ᵀ" : "");
    };
    check_layout_dtype(op, a);
    check_same_device(op, a, b);
    check_same_dtype(op, a, b);
    ENGINE_CHECK(a.dim() >= 2 && b.dim() >= 2, op << ": " << shapes() << ": both need at least 2 dimensions (a batch "
                                                     "of matrices, or b one matrix)");
    const bool broadcast_b = b.dim() == 2;
    ENGINE_CHECK(broadcast_b || b.dim() == a.dim(),
                 op << ": " << shapes() << ": b must be 2-D or have a's rank (" << a.dim() << ")");
    int64_t batch = 1;
    for (int64_t axis = 0; axis + 2 < a.dim(); ++axis) {
        ENGINE_CHECK(broadcast_b || a.size(axis) == b.size(axis),
                     op << ": " << shapes() << ": batch dimension " << axis << " differs");
        batch *= a.size(axis);
    }
    const int64_t rows = transpose_a ? a.size(-1) : a.size(-2), a_inner = transpose_a ? a.size(-2) : a.size(-1);
    const int64_t b_inner = transpose_b ? b.size(-1) : b.size(-2), columns = transpose_b ? b.size(-2) : b.size(-1);
    ENGINE_CHECK(a_inner == b_inner, op << ": " << shapes() << ": inner dimensions differ (" << a_inner << " and "
                                        << b_inner << ")");
    const int M = checked_int(op, a, b, rows), N = checked_int(op, a, b, columns), K = checked_int(op, a, b, a_inner);
    // With a (...,M,K) untransposed and one b, the batch is one (batch*M, K) matrix: a single GEMM each way.
    const bool fold = broadcast_b && !transpose_a;
    ENGINE_CHECK(!fold || batch * M <= 2147483647, op << ": " << shapes() << ": more rows than the GEMMs' int");
    const int64_t a_stride = int64_t(M) * K, b_stride = broadcast_b ? 0 : int64_t(K) * N, c_stride = int64_t(M) * N;

    Shape out_shape(a.shape().begin(), a.shape().end() - 2);
    out_shape.push_back(M);
    out_shape.push_back(N);
    Tensor out = Tensor::empty(out_shape, a.dtype(), a.device()); // (...,M,N)
    const int folded_rows = fold ? static_cast<int>(batch * M) : 0;
    if (fold) batched_gemm_tensors(out, a, b, {1, folded_rows, N, K, false, transpose_b, 0, 0, 0}, 0.0);
    else batched_gemm_tensors(out, a, b, {batch, M, N, K, transpose_a, transpose_b, a_stride, b_stride, c_stride}, 0.0);

    GradTarget a_target(a), b_target(b);
    record_node(op, {&a, &b}, {&out}, [=, saved_a = a, saved_b = b, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // (...,M,N)
        // d op(a) = dc op(b)ᵀ (M,K); a stored (K,M) takes its transpose, op(b) dcᵀ.
        if (Tensor da = context.input_grad(a_target); da.defined()) {
            if (fold)
                batched_gemm_tensors(da, dout, saved_b, {1, folded_rows, K, N, false, !transpose_b, 0, 0, 0}, 1.0);
            else if (!transpose_a)
                batched_gemm_tensors(da, dout, saved_b,
                                     {batch, M, K, N, false, !transpose_b, c_stride, b_stride, a_stride}, 1.0);
            else
                batched_gemm_tensors(da, saved_b, dout,
                                     {batch, K, M, N, transpose_b, true, b_stride, c_stride, a_stride}, 1.0);
        }
        // d op(b) = op(a)ᵀ dc (K,N); b stored (N,K) takes dcᵀ op(a). A 2-D b sums over the batch (stride_c 0),
        // or, folded, as one GEMM over batch*M rows. b is the parameter side: its gradient in the compute dtype.
        if (Tensor db = context.parameter_grad(b_target); db.defined()) {
            if (fold && !transpose_b)
                batched_gemm_tensors(db, saved_a, dout, {1, K, N, folded_rows, true, false, 0, 0, 0}, 1.0);
            else if (fold)
                batched_gemm_tensors(db, dout, saved_a, {1, N, K, folded_rows, true, false, 0, 0, 0}, 1.0);
            else if (!transpose_b)
                batched_gemm_tensors(db, saved_a, dout,
                                     {batch, K, N, M, !transpose_a, false, a_stride, c_stride, b_stride}, 1.0);
            else
                batched_gemm_tensors(db, dout, saved_a,
                                     {batch, N, K, M, true, transpose_a, c_stride, a_stride, b_stride}, 1.0);
        }
    });
    return out;
}

} // namespace engine
