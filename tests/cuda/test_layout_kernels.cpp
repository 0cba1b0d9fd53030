// CUDA layout kernels (permute, slice/concat, batched GEMM) against their CPU twins on the same inputs, in f32
// and bf16, and the layout ops with backward on Device::cuda against Device::cpu. Copies are bitwise; the
// GEMMs are held to a rounding bound derived below.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/bfloat16.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

constexpr Tolerance exact{0.0, 0.0};

class LayoutKernelTest : public CudaKernelTest {
public:
    // Random values in storage type T (bf16: f32 draws rounded once).
    template <typename T>
    std::vector<T> random_values(size_t count) {
        const std::vector<float> floats = random_floats(count);
        std::vector<T> values(count);
        for (size_t i = 0; i < count; ++i) values[i] = narrow<T>(floats[i]);
        return values;
    }
};

template <typename T>
std::vector<float> widened(const std::vector<T>& values) {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = widen(values[i]);
    return out;
}
template <typename T>
std::vector<T> poisoned(size_t count) {
    return std::vector<T>(count, narrow<T>(std::numeric_limits<float>::quiet_NaN()));
}
template <typename T>
const char* type_name() {
    return std::is_same_v<T, float> ? "f32" : "bf16";
}

// ---- permute ----

struct PermuteCase {
    Shape shape;
    std::vector<int64_t> dims;
};

// Tiled (the last axis moves) and gather (it stays) paths, odd extents that fill no tile, size-1 axes that
// the launcher drops, merged axes, the identity, and enough (entry, row tile) pairs for several blocks.
const PermuteCase permute_cases[] = {
    {{37, 45}, {1, 0}},                  // tiled, one 2-D transpose
    {{3, 33, 5, 31}, {0, 3, 2, 1}},      // tiled with a batch axis between
    {{2, 3, 5, 7}, {0, 2, 1, 3}},        // gather: the last axis stays (attention's head split)
    {{4, 1, 6, 9}, {3, 1, 0, 2}},        // tiled, a size-1 axis dropped
    {{2, 3, 4, 5, 3}, {4, 3, 2, 1, 0}},  // tiled, full reversal
    {{5, 7, 3}, {0, 1, 2}},              // identity: one merged axis
    {{2, 1, 3, 1}, {1, 3, 0, 2}},        // gather over size-1 axes
    {{70, 3, 40}, {2, 1, 0}},            // tiled, 3 x 3 tiles per entry
    {{6, 4, 65}, {2, 0, 1}},             // tiled, merged (6,4) rows
    {{3, 0, 5}, {2, 1, 0}},              // empty
};

template <typename T>
void check_permute(LayoutKernelTest& test) {
    for (const PermuteCase& which : permute_cases) {
        std::ostringstream name;
        name << type_name<T>() << " permute " << shape_string(which.shape) << " dims";
        for (int64_t dim : which.dims) name << " " << dim;
        SCOPED_TRACE(name.str());
        const size_t count = static_cast<size_t>(shape_numel(which.shape));
        const int rank = static_cast<int>(which.shape.size());
        const std::vector<T> inp = test.random_values<T>(count), dout = test.random_values<T>(count);
        std::vector<T> expected(count), dinp = test.random_values<T>(count); // dinp: an accumulation base
        DeviceBuffer<T> inp_device(inp), dout_device(dout), out_device(poisoned<T>(count)), dinp_device(dinp);
        cpu::permute_forward<T>(expected.data(), inp.data(), which.shape.data(), which.dims.data(), rank);
        cpu::permute_backward<T>(dinp.data(), dout.data(), which.shape.data(), which.dims.data(), rank);
        gpu::permute_forward(out_device.get(), inp_device.get(), which.shape.data(), which.dims.data(), rank,
                             test.stream);
        gpu::permute_backward(dinp_device.get(), dout_device.get(), which.shape.data(), which.dims.data(), rank,
                              test.stream);
        EXPECT_TRUE(all_close(widened(out_device.to_host()), widened(expected), exact, name.str() + " out"));
        EXPECT_TRUE(all_close(widened(dinp_device.to_host()), widened(dinp), exact, name.str() + " dinp"));
    }
}

TEST_F(LayoutKernelTest, PermuteForwardAndBackwardF32) { check_permute<float>(*this); }
TEST_F(LayoutKernelTest, PermuteForwardAndBackwardBf16) { check_permute<bfloat16>(*this); }

// ---- slice / concat ----

struct BlockCase {
    int64_t outer, size, inner, start, length;
};
// Rows that take 128-bit packs (inner 4, start 4) and rows that do not (odd inner, odd start), a block as wide
// as its tensor, and an empty block.
const BlockCase block_cases[] = {
    {3, 10, 5, 2, 7}, {2, 16, 4, 4, 8}, {7, 9, 1, 3, 5}, {1, 1, 1, 0, 1}, {5, 12, 8, 0, 12}, {4, 6, 3, 2, 0},
    {33, 7, 3, 1, 4},
};

template <typename T>
void check_blocks(LayoutKernelTest& test) {
    for (const BlockCase& block : block_cases) {
        std::ostringstream name;
        name << type_name<T>() << " blocks (" << block.outer << "," << block.size << "," << block.inner << ") ["
             << block.start << ", +" << block.length << ")";
        SCOPED_TRACE(name.str());
        const size_t wide = size_t(block.outer * block.size * block.inner);
        const size_t narrow_count = size_t(block.outer * block.length * block.inner);
        const std::vector<T> wide_values = test.random_values<T>(wide);
        const std::vector<T> narrow_values = test.random_values<T>(narrow_count);
        // One kernel on both sides from the same destination: poisoned where the kernel must write all of it
        // (slice_forward), else random, so that an accumulation base, and concat_forward leaving everything
        // outside its block alone, are checked too.
        const auto check = [&](const char* kernel, std::vector<T> destination, const std::vector<T>& source,
                               auto cpu_kernel, auto gpu_kernel) {
            DeviceBuffer<T> destination_device(destination), source_device(source);
            cpu_kernel(destination.data(), source.data(), block.outer, block.size, block.inner, block.start,
                       block.length);
            gpu_kernel(destination_device.get(), source_device.get(), block.outer, block.size, block.inner, block.start,
                       block.length, test.stream);
            EXPECT_TRUE(all_close(widened(destination_device.to_host()), widened(destination), exact,
                                  name.str() + " " + kernel));
        };
        // The overload of each CUDA kernel for T.
        using GpuKernel = void (*)(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
        check("slice_forward", poisoned<T>(narrow_count), wide_values, cpu::slice_forward<T>,
              GpuKernel(gpu::slice_forward));
        check("slice_backward", test.random_values<T>(wide), narrow_values, cpu::slice_backward<T>,
              GpuKernel(gpu::slice_backward));
        check("concat_forward", test.random_values<T>(wide), narrow_values, cpu::concat_forward<T>,
              GpuKernel(gpu::concat_forward));
        check("concat_backward", test.random_values<T>(narrow_count), wide_values, cpu::concat_backward<T>,
              GpuKernel(gpu::concat_backward));
    }
}

TEST_F(LayoutKernelTest, SliceAndConcatBlocksF32) { check_blocks<float>(*this); }
TEST_F(LayoutKernelTest, SliceAndConcatBlocksBf16) { check_blocks<bfloat16>(*this); }

// ---- batched GEMM ----

// The bound. Both sides compute each c element as an f32 sum of K exact-or-rounded products, in orders we do
// not control (OpenBLAS here, cuBLAS or the emulator's BLAS there). Each result lies within γ_K·S of the exact
// value, with S = Σ_p |a_ip||b_pj| + |beta·c_ij| (the accumulated c counts as one more term) and γ_K =
// (K+1)u / (1 - (K+1)u), u = 2^-24 (Higham, Accuracy and Stability, §3.1): so |cuda - cpu| <= 2 γ_K S. A bf16 c
// is that f32 result rounded once more on each side, within 2^-8 relative (bf16's unit roundoff): add
// 2^-8 (|cuda| + |cpu|). With TF32 the CUDA side rounds each f32 operand to 10 mantissa bits first (relative
// error 2^-11 each), so each product moves by at most ((1 + 2^-11)^2 - 1) of its magnitude: add that times S.
struct GemmBoundCheck {
    double worst_ratio = 0.0, worst_error = 0.0;
    size_t failures = 0;
};

template <typename Out>
GemmBoundCheck check_gemm_bound(const std::vector<Out>& actual, const std::vector<Out>& expected,
                                const std::vector<double>& magnitude, int K, bool bf16_output, bool tf32) {
    const double u = std::ldexp(1.0, -24), terms = K + 1.0, gamma = terms * u / (1.0 - terms * u);
    GemmBoundCheck check;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double a = widen(actual[i]), e = widen(expected[i]);
        double bound = 2.0 * gamma * magnitude[i];
        if (tf32) bound += (std::pow(1.0 + std::ldexp(1.0, -11), 2) - 1.0) * magnitude[i];
        if (bf16_output) bound += std::ldexp(1.0, -8) * (std::fabs(a) + std::fabs(e));
        const double error = std::fabs(a - e);
        if (!(error <= bound)) ++check.failures; // NaN (a poisoned, unwritten element) fails too
        check.worst_error = std::max(check.worst_error, error);
        if (bound > 0) check.worst_ratio = std::max(check.worst_ratio, error / bound);
    }
    return check;
}

// S_ij for every c element: Σ_p |op(a_i)[i,p]| |op(b_i)[p,j]| (+ |c| when accumulating), over the batch.
template <typename T, typename Out>
std::vector<double> gemm_magnitudes(const std::vector<T>& a, const std::vector<T>& b, const std::vector<Out>& c_before,
                                    double beta, int64_t batch, int m, int n, int k, bool transpose_a, bool transpose_b,
                                    int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    std::vector<double> magnitude(c_before.size(), 0.0);
    for (size_t i = 0; i < c_before.size(); ++i) magnitude[i] = std::fabs(beta * widen(c_before[i]));
    for (int64_t entry = 0; entry < batch; ++entry)
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double sum = 0.0;
                for (int p = 0; p < k; ++p) {
                    const double av = widen(a[size_t(entry * stride_a + (transpose_a ? p * m + i : i * k + p))]);
                    const double bv = widen(b[size_t(entry * stride_b + (transpose_b ? j * k + p : p * n + j))]);
                    sum += std::fabs(av * bv);
                }
                magnitude[size_t(entry * stride_c + i * n + j)] += sum;
            }
    return magnitude;
}

template <typename T, typename Out>
void check_batched_gemm(LayoutKernelTest& test, bool tf32, double& worst_error, double& worst_ratio) {
    const int m = 7, n = 13, k = 37;
    const int64_t batch = 5;
    for (int flags = 0; flags < 4; ++flags) {
        const bool transpose_a = (flags & 1) != 0, transpose_b = (flags & 2) != 0;
        // Separate outputs (beta 0, poisoned c), one b for all (beta 1), and the batch summed into one c.
        struct Mode {
            const char* name;
            int64_t stride_b, stride_c;
            float beta;
        };
        const Mode modes[] = {{"batched", int64_t(k) * n, int64_t(m) * n, 0.0f},
                              {"broadcast b", 0, int64_t(m) * n, 1.0f},
                              {"summed c", int64_t(k) * n, 0, 1.0f}};
        for (const Mode& mode : modes) {
            std::ostringstream name;
            name << type_name<T>() << "->" << type_name<Out>() << (tf32 ? " tf32 " : " ") << mode.name << " ta "
                 << transpose_a << " tb " << transpose_b;
            SCOPED_TRACE(name.str());
            const int64_t stride_a = int64_t(m) * k;
            const std::vector<T> a = test.random_values<T>(size_t(batch * stride_a));
            const int64_t b_count = mode.stride_b == 0 ? int64_t(k) * n : batch * mode.stride_b;
            const std::vector<T> b = test.random_values<T>(size_t(b_count));
            const size_t c_count = size_t(mode.stride_c == 0 ? int64_t(m) * n : batch * mode.stride_c);
            const std::vector<Out> c_before =
                mode.beta == 0.0f ? poisoned<Out>(c_count) : test.random_values<Out>(c_count);
            std::vector<Out> expected = mode.beta == 0.0f ? std::vector<Out>(c_count) : c_before;
            cpu::batched_gemm<T, Out>(expected.data(), a.data(), b.data(), batch, m, n, k, transpose_a, transpose_b,
                                      stride_a, mode.stride_b, mode.stride_c, 1.0f, mode.beta);
            DeviceBuffer<T> a_device(a), b_device(b);
            DeviceBuffer<Out> c_device(c_before);
            gpu::batched_gemm(c_device.get(), a_device.get(), b_device.get(), batch, m, n, k, transpose_a, transpose_b,
                              stride_a, mode.stride_b, mode.stride_c, 1.0f, mode.beta, tf32,
                              engine::cuda::cublas_handle(), test.stream);
            const std::vector<Out> actual = c_device.to_host();
            const std::vector<Out> magnitude_base = mode.beta == 0.0f ? std::vector<Out>(c_count) : c_before;
            const std::vector<double> magnitude =
                gemm_magnitudes(a, b, magnitude_base, mode.beta, batch, m, n, k, transpose_a, transpose_b, stride_a,
                                mode.stride_b, mode.stride_c);
            const int terms = mode.stride_c == 0 ? k * int(batch) : k;
            const bool bf16_output = std::is_same_v<Out, bfloat16>, tf32_operands = tf32 && std::is_same_v<T, float>;
            const GemmBoundCheck check = check_gemm_bound(actual, expected, magnitude, terms, bf16_output, tf32_operands);
            EXPECT_EQ(check.failures, 0u) << name.str() << ": worst error " << check.worst_error << ", "
                                          << check.worst_ratio << " of the bound";
            worst_error = std::max(worst_error, check.worst_error);
            worst_ratio = std::max(worst_ratio, check.worst_ratio);
        }
    }
}

TEST_F(LayoutKernelTest, BatchedGemmEveryTransposeAndStride) {
    double worst_error = 0.0, worst_ratio = 0.0;
    check_batched_gemm<float, float>(*this, false, worst_error, worst_ratio);
    std::cout << "[ measured ] batched gemm f32: max |cuda - cpu| " << worst_error << ", " << worst_ratio
              << " of the bound\n";
    worst_error = worst_ratio = 0.0;
    check_batched_gemm<float, float>(*this, true, worst_error, worst_ratio);
    std::cout << "[ measured ] batched gemm f32 with TF32: max |cuda - cpu| " << worst_error << ", " << worst_ratio
              << " of the bound\n";
    worst_error = worst_ratio = 0.0;
    check_batched_gemm<bfloat16, bfloat16>(*this, false, worst_error, worst_ratio);
    std::cout << "[ measured ] batched gemm bf16->bf16: max |cuda - cpu| " << worst_error << ", " << worst_ratio
              << " of the bound\n";
    worst_error = worst_ratio = 0.0;
    check_batched_gemm<bfloat16, float>(*this, false, worst_error, worst_ratio);
    std::cout << "[ measured ] batched gemm bf16->f32: max |cuda - cpu| " << worst_error << ", " << worst_ratio
              << " of the bound\n";
}

// ---- the ops with backward, Device::cuda against Device::cpu ----

using LayoutOpsCuda = LayoutKernelTest;

// Leaves with the same values on both devices.
struct LeafPair {
    Tensor cpu, cuda;
};
LeafPair leaf_pair(LayoutKernelTest& test, const Shape& shape, DType dtype) {
    const std::vector<float> values = test.random_floats(size_t(shape_numel(shape)));
    Tensor host = dtype == DType::bf16
                      ? Tensor::from_vector<bfloat16>(std::vector<bfloat16>(values.size()), shape, Device::cpu)
                      : Tensor::from_vector<float>(values, shape, Device::cpu);
    if (dtype == DType::bf16) {
        bfloat16* data = host.data<bfloat16>();
        for (size_t i = 0; i < values.size(); ++i) data[i] = to_bfloat16(values[i]);
    }
    Tensor device = host.to(Device::cuda);
    host.set_requires_grad(true);
    device.set_requires_grad(true);
    return {host, device};
}

// Σ out · weights: the weights are exact in every dtype (multiples of 1/8), so d out = weights on both devices.
Tensor weighted(const Tensor& out, const Tensor& weights) {
    return matmul(out.reshape({1, out.numel()}), weights.reshape({weights.numel(), 1}));
}
Tensor exact_weights(int64_t count, DType dtype, Device device) {
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) values[size_t(i)] = float((i * 7) % 17 - 8) / 8.0f;
    Tensor weights = Tensor::from_vector<float>(values, {count}, Device::cpu);
    return (dtype == DType::f32 ? weights : cast(weights, dtype)).to(device);
}

// permute, transpose, reshape, view, slice and concat (one input twice) chained, then backward: only copies and
// single additions in a fixed order, so the gradients are bitwise equal.
void check_layout_chain(LayoutKernelTest& test, DType dtype) {
    SCOPED_TRACE(dtype_name(dtype));
    LeafPair x = leaf_pair(test, {2, 3, 5, 7}, dtype), y = leaf_pair(test, {2, 5, 4, 3}, dtype);
    std::vector<std::vector<float>> gradients[2];
    for (int side = 0; side < 2; ++side) {
        current_tape().clear();
        const Tensor& xs = side == 0 ? x.cpu : x.cuda;
        const Tensor& ys = side == 0 ? y.cpu : y.cuda;
        zero_grad({xs, ys});
        Tensor permuted = permute(xs, {0, 2, 1, 3});                  // (2,5,3,7) gather
        Tensor swapped = transpose(permuted, -1, -2);                  // (2,5,7,3) tiled
        Tensor sliced = slice(swapped, 2, -5, -1);                     // (2,5,4,3)
        Tensor joined = concat({sliced, ys, sliced}, -2);             // (2,5,12,3)
        Tensor flat = view(reshape(joined, {10, -1}), {-1, 12, 3});    // (10,12,3)
        Tensor out = transpose(flat, 0, 2);                            // (3,12,10) tiled
        backward(weighted(out, exact_weights(out.numel(), dtype, xs.device())));
        gradients[side] = {xs.grad().to_vector<float>(), ys.grad().to_vector<float>()};
    }
    EXPECT_TRUE(all_close(gradients[1][0], gradients[0][0], exact, "x gradient"));
    EXPECT_TRUE(all_close(gradients[1][1], gradients[0][1], exact, "y gradient"));
}

TEST_F(LayoutOpsCuda, LayoutChainWithBackwardMatchesCpuBitwise) {
    check_layout_chain(*this, DType::f32);
    check_layout_chain(*this, DType::bf16);
}

// matmul(a, b, options) forward and backward for all four transposes, batched and with a broadcast 2-D b.
// The gradients are GEMMs over M or N or the batch: held to the bound above with S from |a|, |b| and the
// weights (|d out| <= 1), summed over up to batch * max(M,N,K) terms. Simpler and looser than per element:
// every gradient element's S <= terms * max|a or b| * 1, with |a|, |b| <= 1.
TEST_F(LayoutOpsCuda, BatchedMatmulWithBackwardMatchesCpu) {
    const int64_t M = 5, K = 9, N = 6, batch = 6; // batch as (2,3)
    double worst = 0.0;
    for (int flags = 0; flags < 8; ++flags) {
        const MatmulOptions options{(flags & 1) != 0, (flags & 2) != 0};
        const bool broadcast = (flags & 4) != 0;
        std::ostringstream name;
        name << "ta " << options.transpose_a << " tb " << options.transpose_b << (broadcast ? " broadcast b" : "");
        SCOPED_TRACE(name.str());
        LeafPair a = leaf_pair(*this, options.transpose_a ? Shape{2, 3, K, M} : Shape{2, 3, M, K}, DType::f32);
        Shape b_shape = options.transpose_b ? Shape{N, K} : Shape{K, N};
        if (!broadcast) b_shape.insert(b_shape.begin(), {2, 3});
        LeafPair b = leaf_pair(*this, b_shape, DType::f32);
        std::vector<float> results[2][3];
        for (int side = 0; side < 2; ++side) {
            current_tape().clear();
            const Tensor& as = side == 0 ? a.cpu : a.cuda;
            const Tensor& bs = side == 0 ? b.cpu : b.cuda;
            zero_grad({as, bs});
            Tensor out = matmul(as, bs, options); // (2,3,M,N)
            backward(weighted(out, exact_weights(out.numel(), DType::f32, as.device())));
            results[side][0] = out.to_vector<float>();
            results[side][1] = as.grad().to_vector<float>();
            results[side][2] = bs.grad().to_vector<float>();
        }
        // out sums K terms; da sums N; db sums M, or batch * M for the broadcast b. Each |term| <= 1.
        const double u = std::ldexp(1.0, -24);
        const int64_t terms[3] = {K, N, broadcast ? batch * M : M};
        const char* names[3] = {"out", "da", "db"};
        for (int which = 0; which < 3; ++which) {
            const double count = double(terms[which]), bound = 2.0 * count * (count * u / (1.0 - count * u));
            EXPECT_TRUE(all_close(results[1][which], results[0][which], Tolerance{bound, 0.0},
                                  name.str() + " " + names[which]));
            for (size_t i = 0; i < results[0][which].size(); ++i)
                worst = std::max(worst, double(std::fabs(results[1][which][i] - results[0][which][i])));
        }
    }
    std::cout << "[ measured ] batched matmul op, cuda vs cpu: max |diff| " << worst << "\n";
}

} // namespace
} // namespace engine::test
