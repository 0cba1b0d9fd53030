// The reductions family's CUDA kernels (kernels/cuda/{softmax,reduce_dimension,mse_loss,rms_norm}.cu) against
// their CPU twins on the same inputs, f32 and bf16, through both layouts (inner == 1: a warp per row; inner > 1:
// a thread per column), sizes that are no multiple of 32 or of the block; then the ops end to end with backward
// on Device::cuda against Device::cpu. Outputs start as NaN, so an unwritten element fails.
//
// Tolerances, with u = 2^-24 (f32's unit roundoff) and inputs in [-1, 1]:
// - A float sum of n terms (the CUDA side) against a double one rounded once (the CPU side) differs by at most
//   (n - 1) u sum|terms| + u |sum| (Higham's recursive-summation bound, the worst order; the warp's lane-strided
//   partials and shuffle tree are one such order), so each bound below is that with sum|terms| bounded from the
//   inputs' range. expf/logf/rsqrtf add a few ulps on a GPU (exact host functions on the emulated device).
// - bf16 results are rounded from those float values: the twins may straddle a rounding boundary, one bf16
//   ulp (at most 2^-7 relative), two where a value is rounded twice (rms_norm's norm, then the product).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "engine/autograd.h"
#include "base/bfloat16.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

constexpr double u = 1.0 / 16777216.0;   // 2^-24
constexpr double bf16_ulp = 1.0 / 128.0; // 2^-7: one bf16 ulp relative to the value, at most
constexpr int transcendental_ulps = 4;

struct Layout {
    int64_t outer, size, inner;
    std::string name() const {
        return "(" + std::to_string(outer) + "," + std::to_string(size) + "," + std::to_string(inner) + ")";
    }
    int64_t count() const { return outer * size * inner; }
};
// inner 1 with rows shorter and longer than a warp and a row count no multiple of 8 rows per block; inner > 1
// with a column count no multiple of the 256-thread block.
const std::vector<Layout> layouts = {{37, 45, 1}, {5, 7, 1}, {3, 13, 7}, {2, 33, 131}};

class ReductionOpsKernelTest : public CudaKernelTest {
public:
    std::vector<bfloat16> random_bf16(size_t count, float low = -1.0f, float high = 1.0f) {
        const auto floats = random_floats(count, low, high);
        std::vector<bfloat16> values(count);
        for (size_t i = 0; i < count; ++i) values[i] = to_bfloat16(floats[i]);
        return values;
    }
};

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& values) {
    std::vector<double> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = double(widen(values[i]));
    return out;
}

std::vector<bfloat16> bf16_nan_filled(size_t count) { return std::vector<bfloat16>(count, to_bfloat16(NAN)); }

// softmax: y in (0,1), relative error that of the row sum (size terms of exp <= 1): (size + ulps) u.
// log_softmax: |error| <= size u + ulp(|y|). Backward: s = sum(dy y) (|dy| <= 1, sum y = 1) is off by size u,
// moving dx by y size u <= size u; log_softmax's sum(dy) (sum|dy| <= size) by size^2 u.
template <bool logarithm>
void check_softmax(ReductionOpsKernelTest& test, const Layout& layout) {
    const int64_t n = layout.count();
    const std::string what = std::string(logarithm ? "log_softmax " : "softmax ") + layout.name();
    const double size = double(layout.size);
    const auto inp = test.random_floats(n, -4.0f, 4.0f), dout = test.random_floats(n);
    const auto dinp_start = test.random_floats(n);
    std::vector<float> out(n), dinp = dinp_start;
    DeviceBuffer<float> inp_d(inp), dout_d(dout), out_d(nan_filled(n)), dinp_d(dinp_start);
    const Tolerance forward = logarithm ? Tolerance{(size + transcendental_ulps) * u * 8, 4 * u}
                                        : Tolerance{1e-12, (size + transcendental_ulps) * u};
    const Tolerance backward{(logarithm ? size * size : size + transcendental_ulps) * u + 4 * u, 4 * u};
    if constexpr (logarithm) {
        cpu::log_softmax_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner);
        cpu::log_softmax_backward(dinp.data(), dout.data(), out.data(), layout.outer, layout.size, layout.inner);
        gpu::log_softmax_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, test.stream);
    } else {
        cpu::softmax_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner);
        cpu::softmax_backward(dinp.data(), dout.data(), out.data(), layout.outer, layout.size, layout.inner);
        gpu::softmax_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, test.stream);
    }
    EXPECT_TRUE(all_close(out_d.to_host(), out, forward, what + " out"));
    // Backward from the CPU's output on both sides, so only the backward kernels differ.
    DeviceBuffer<float> saved_d(out);
    if constexpr (logarithm)
        gpu::log_softmax_backward(dinp_d.get(), dout_d.get(), saved_d.get(), layout.outer, layout.size, layout.inner,
                                  test.stream);
    else
        gpu::softmax_backward(dinp_d.get(), dout_d.get(), saved_d.get(), layout.outer, layout.size, layout.inner,
                              test.stream);
    const auto result = all_close(dinp_d.to_host(), dinp, backward, what + " dinp");
    std::cout << "[ measured ] " << result.message() << "\n";
    EXPECT_TRUE(result);
}

TEST_F(ReductionOpsKernelTest, SoftmaxAndLogSoftmaxF32) {
    for (const Layout& layout : layouts) {
        check_softmax<false>(*this, layout);
        check_softmax<true>(*this, layout);
    }
}

// bf16: the float bounds above plus one bf16 ulp of rounding on each stored value.
TEST_F(ReductionOpsKernelTest, SoftmaxAndLogSoftmaxBf16) {
    for (const Layout& layout : layouts) {
        const int64_t n = layout.count();
        const double size = double(layout.size);
        const auto inp = random_bf16(n, -4.0f, 4.0f), dout = random_bf16(n), dinp_start = random_bf16(n);
        for (const bool logarithm : {false, true}) {
            const std::string what = std::string(logarithm ? "bf16 log_softmax " : "bf16 softmax ") + layout.name();
            std::vector<bfloat16> out(n), dinp = dinp_start;
            DeviceBuffer<bfloat16> inp_d(inp), dout_d(dout), out_d(bf16_nan_filled(n)), dinp_d(dinp_start);
            if (logarithm) {
                cpu::log_softmax_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner);
                cpu::log_softmax_backward(dinp.data(), dout.data(), out.data(), layout.outer, layout.size,
                                          layout.inner);
                gpu::log_softmax_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, stream);
            } else {
                cpu::softmax_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner);
                cpu::softmax_backward(dinp.data(), dout.data(), out.data(), layout.outer, layout.size, layout.inner);
                gpu::softmax_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, stream);
            }
            DeviceBuffer<bfloat16> saved_d(out);
            if (logarithm)
                gpu::log_softmax_backward(dinp_d.get(), dout_d.get(), saved_d.get(), layout.outer, layout.size,
                                          layout.inner, stream);
            else
                gpu::softmax_backward(dinp_d.get(), dout_d.get(), saved_d.get(), layout.outer, layout.size,
                                      layout.inner, stream);
            const double float_bound = (logarithm ? size * size : size + transcendental_ulps) * u * 8;
            const auto forward = all_close(as_doubles(out_d.to_host()), as_doubles(out),
                                           {float_bound, bf16_ulp}, what + " out");
            const auto backward = all_close(as_doubles(dinp_d.to_host()), as_doubles(dinp),
                                            {float_bound, bf16_ulp}, what + " dinp");
            std::cout << "[ measured ] " << forward.message() << "\n[ measured ] " << backward.message() << "\n";
            EXPECT_TRUE(forward);
            EXPECT_TRUE(backward);
        }
    }
}

// sum: |error| <= (size - 1) u sum|x| + u |sum| <= size^2 u (|x| <= 1); mean scales both sides by 1/size (plus
// one rounding of 1/size on the device). Backward is elementwise, the same float expression: a rounding apart at
// most. max and its indices are exact, ties included (inputs drawn from 5 values, so most columns tie).
TEST_F(ReductionOpsKernelTest, SumMeanMaxF32) {
    for (const Layout& layout : layouts) {
        const int64_t n = layout.count(), columns = layout.outer * layout.inner;
        const double size = double(layout.size);
        const auto inp = random_floats(n);
        for (const bool average : {false, true}) {
            const std::string what = std::string(average ? "mean " : "sum ") + layout.name();
            const float scale = average ? 1.0f / float(layout.size) : 1.0f;
            std::vector<float> out(columns);
            DeviceBuffer<float> inp_d(inp), out_d(nan_filled(columns));
            cpu::sum_over_dimension_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner, scale);
            gpu::sum_over_dimension_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, scale,
                                            stream);
            const double bound = (size * size + 2) * u * (average ? 1.0 / size : 1.0);
            const auto forward = all_close(out_d.to_host(), out, {bound, 2 * u}, what + " out");
            std::cout << "[ measured ] " << forward.message() << "\n";
            EXPECT_TRUE(forward);
            const auto dout = random_floats(columns), dinp_start = random_floats(n);
            std::vector<float> dinp = dinp_start;
            DeviceBuffer<float> dout_d(dout), dinp_d(dinp_start);
            cpu::sum_over_dimension_backward(dinp.data(), dout.data(), layout.outer, layout.size, layout.inner, scale);
            gpu::sum_over_dimension_backward(dinp_d.get(), dout_d.get(), layout.outer, layout.size, layout.inner,
                                             scale, stream);
            EXPECT_TRUE(all_close(dinp_d.to_host(), dinp, {4 * u, 2 * u}, what + " dinp"));
        }
        auto tied = random_ints(n, -2, 2);
        std::vector<float> values(tied.begin(), tied.end());
        std::vector<float> out(columns);
        std::vector<int32_t> indices(columns);
        DeviceBuffer<float> inp_d(values), out_d(nan_filled(columns));
        DeviceBuffer<int32_t> indices_d(std::vector<int32_t>(columns, -1));
        cpu::max_over_dimension_forward(out.data(), indices.data(), values.data(), layout.outer, layout.size,
                                        layout.inner);
        gpu::max_over_dimension_forward(out_d.get(), indices_d.get(), inp_d.get(), layout.outer, layout.size,
                                        layout.inner, stream);
        EXPECT_TRUE(all_close(out_d.to_host(), out, {0.0, 0.0}, "max " + layout.name()));
        EXPECT_EQ(indices_d.to_host(), indices) << "max indices " << layout.name();
        const auto dout = random_floats(columns), dinp_start = random_floats(n);
        std::vector<float> dinp = dinp_start;
        DeviceBuffer<float> dout_d(dout), dinp_d(dinp_start);
        cpu::max_over_dimension_backward(dinp.data(), dout.data(), indices.data(), layout.outer, layout.size,
                                         layout.inner);
        gpu::max_over_dimension_backward(dinp_d.get(), dout_d.get(), indices_d.get(), layout.outer, layout.size,
                                         layout.inner, stream);
        EXPECT_TRUE(all_close(dinp_d.to_host(), dinp, {0.0, 0.0}, "max dinp " + layout.name()));
    }
}

TEST_F(ReductionOpsKernelTest, SumMaxBf16) {
    for (const Layout& layout : layouts) {
        const int64_t n = layout.count(), columns = layout.outer * layout.inner;
        const double size = double(layout.size);
        const auto inp = random_bf16(n);
        std::vector<bfloat16> out(columns), maxima(columns);
        std::vector<int32_t> indices(columns);
        DeviceBuffer<bfloat16> inp_d(inp), out_d(bf16_nan_filled(columns)), maxima_d(bf16_nan_filled(columns));
        DeviceBuffer<int32_t> indices_d(std::vector<int32_t>(columns, -1));
        cpu::sum_over_dimension_forward(out.data(), inp.data(), layout.outer, layout.size, layout.inner, 1.0f);
        gpu::sum_over_dimension_forward(out_d.get(), inp_d.get(), layout.outer, layout.size, layout.inner, 1.0f,
                                        stream);
        const auto forward = all_close(as_doubles(out_d.to_host()), as_doubles(out),
                                       {(size * size + 2) * u, bf16_ulp}, "bf16 sum " + layout.name());
        std::cout << "[ measured ] " << forward.message() << "\n";
        EXPECT_TRUE(forward);
        cpu::max_over_dimension_forward(maxima.data(), indices.data(), inp.data(), layout.outer, layout.size,
                                        layout.inner);
        gpu::max_over_dimension_forward(maxima_d.get(), indices_d.get(), inp_d.get(), layout.outer, layout.size,
                                        layout.inner, stream);
        EXPECT_TRUE(all_close(as_doubles(maxima_d.to_host()), as_doubles(maxima), {0.0, 0.0}, "bf16 max"));
        EXPECT_EQ(indices_d.to_host(), indices) << "bf16 max indices " << layout.name();
    }
}

// Elementwise: the same float expressions on both sides (an FMA contraction on a GPU: one rounding). The reduced
// loss: each float square is within 2u of the CPU's double one (a rounded difference, then a rounded product),
// all terms positive, double sums, then one rounding to float: 4u relative.
TEST_F(ReductionOpsKernelTest, MseLossF32AndBf16) {
    const int64_t n = 3 * 37 * 5 + 3;
    const auto inp = random_floats(n), target = random_floats(n), dout = random_floats(n);
    const auto dinp_start = random_floats(n), dtarget_start = random_floats(n);
    std::vector<float> squares(n), dinp = dinp_start, dtarget = dtarget_start;
    float loss = 0.0f;
    DeviceBuffer<float> inp_d(inp), target_d(target), dout_d(dout), squares_d(nan_filled(n)), loss_d(nan_filled(1));
    DeviceBuffer<float> workspace_d(n), dinp_d(dinp_start), dtarget_d(dtarget_start);
    DeviceBuffer<double> partials_d(static_cast<size_t>(gpu::reduction_workspace_count(n)));
    const float scale = 1.0f / float(n);
    cpu::squared_error_forward(squares.data(), inp.data(), target.data(), n);
    cpu::mse_loss_forward(&loss, inp.data(), target.data(), n, scale);
    cpu::squared_error_backward(dinp.data(), dtarget.data(), dout.data(), inp.data(), target.data(), n);
    const float dloss = 0.625f;
    cpu::mse_loss_backward(dinp.data(), static_cast<float*>(nullptr), &dloss, inp.data(), target.data(), n, scale);
    gpu::squared_error_forward(squares_d.get(), inp_d.get(), target_d.get(), n, stream);
    gpu::mse_loss_forward(loss_d.get(), workspace_d.get(), partials_d.get(), inp_d.get(), target_d.get(), n, scale,
                          stream);
    gpu::squared_error_backward(dinp_d.get(), dtarget_d.get(), dout_d.get(), inp_d.get(), target_d.get(), n, stream);
    DeviceBuffer<float> dloss_d(std::vector<float>{dloss});
    gpu::mse_loss_backward(dinp_d.get(), nullptr, dloss_d.get(), inp_d.get(), target_d.get(), n, scale, stream);
    EXPECT_TRUE(all_close(squares_d.to_host(), squares, {0.0, 2 * u}, "squared error"));
    const auto reduced = all_close(loss_d.to_host(), std::vector<float>{loss}, {0.0, 4 * u}, "mse loss");
    std::cout << "[ measured ] " << reduced.message() << "\n";
    EXPECT_TRUE(reduced);
    EXPECT_TRUE(all_close(dinp_d.to_host(), dinp, {8 * u, 4 * u}, "mse dinp"));
    EXPECT_TRUE(all_close(dtarget_d.to_host(), dtarget, {8 * u, 4 * u}, "mse dtarget"));

    const auto inp16 = random_bf16(n), target16 = random_bf16(n);
    std::vector<bfloat16> squares16(n);
    float loss16 = 0.0f;
    DeviceBuffer<bfloat16> inp16_d(inp16), target16_d(target16), squares16_d(bf16_nan_filled(n));
    cpu::squared_error_forward(squares16.data(), inp16.data(), target16.data(), n);
    cpu::mse_loss_forward(&loss16, inp16.data(), target16.data(), n, scale);
    gpu::squared_error_forward(squares16_d.get(), inp16_d.get(), target16_d.get(), n, stream);
    gpu::mse_loss_forward(loss_d.get(), workspace_d.get(), partials_d.get(), inp16_d.get(), target16_d.get(), n, scale,
                          stream);
    EXPECT_TRUE(all_close(as_doubles(squares16_d.to_host()), as_doubles(squares16), {0.0, 0.0}, "bf16 squared error"));
    EXPECT_TRUE(all_close(loss_d.to_host(), std::vector<float>{loss16}, {0.0, 4 * u}, "bf16 mse loss"));
}

// rstd: the sum of squares has C positive terms: relative error C u, halved by the square root, plus the
// rsqrt's ulps. out = w * x * rstd inherits it (|out| <= max rstd). dinp = rstd (dnorm - norm mean(dnorm norm)),
// |dnorm| <= 1: the mean of C terms |dnorm norm| <= max|norm| is off by (C + 4) u max|norm|, which moves dinp by
// rstd |norm| times that: (C + 4) u max(rstd) max|norm|^2, with max rstd and max |norm| read off the CPU's
// results. dweight sums N rows of |dout round(norm)| <= max|norm| in float on both sides, in different orders:
// 2 (N + 2) u max|norm| per column.
struct RmsNormBounds {
    double rstd, out, dinp, dweight;
};
template <typename S>
RmsNormBounds rms_norm_bounds(const std::vector<S>& inp, const std::vector<float>& rstd, int N, int C) {
    double max_rstd = 0.0, max_norm = 0.0;
    for (int row = 0; row < N; ++row) {
        max_rstd = std::max(max_rstd, double(rstd[row]));
        for (int c = 0; c < C; ++c)
            max_norm = std::max(max_norm, std::fabs(double(widen(inp[size_t(row) * C + c])) * rstd[row]));
    }
    const double statistics = (C / 2.0 + transcendental_ulps) * u;
    return {statistics, max_rstd * statistics, (C + 4) * u * max_rstd * max_norm * max_norm,
            2.0 * (N + 2) * u * max_norm};
}
void check_rms_norm(ReductionOpsKernelTest& test, int N, int C, int offset) {
    const std::string what = "rms_norm N=" + std::to_string(N) + " C=" + std::to_string(C) +
                             (offset ? " misaligned" : "");
    const size_t count = size_t(N) * C;
    const auto inp = test.random_floats(count), weight = test.random_floats(C), dout = test.random_floats(count);
    const auto dinp_start = test.random_floats(count), dweight_start = test.random_floats(C);
    std::vector<float> out(count), rstd(N), dinp = dinp_start, dweight = dweight_start;
    cpu::rms_norm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-6);
    cpu::rms_norm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
    auto padded = [&](const std::vector<float>& values) {
        std::vector<float> result(size_t(offset), 0.0f);
        result.insert(result.end(), values.begin(), values.end());
        return result;
    };
    DeviceBuffer<float> inp_d(padded(inp)), weight_d(weight), dout_d(padded(dout)), out_d(padded(nan_filled(count)));
    DeviceBuffer<float> rstd_d(nan_filled(N)), dinp_d(padded(dinp_start)), dweight_d(dweight_start);
    DeviceBuffer<float> partials_d(static_cast<size_t>(gpu::rms_norm_backward_workspace_count(N, C)));
    gpu::rms_norm_forward(out_d.get() + offset, rstd_d.get(), inp_d.get() + offset, weight_d.get(), N, C, 1e-6f,
                          test.stream);
    // Backward from the CPU's rstd, so only the backward kernel differs.
    DeviceBuffer<float> saved_rstd_d(rstd);
    gpu::rms_norm_backward(dinp_d.get() + offset, dweight_d.get(), partials_d.get(), dout_d.get() + offset,
                           inp_d.get() + offset, weight_d.get(), saved_rstd_d.get(), N, C, test.stream);
    auto unpadded = [&](std::vector<float> values) {
        values.erase(values.begin(), values.begin() + offset);
        return values;
    };
    const RmsNormBounds bound = rms_norm_bounds(inp, rstd, N, C);
    const auto checks = {
        all_close(rstd_d.to_host(), rstd, {0.0, bound.rstd}, what + " rstd"),
        all_close(unpadded(out_d.to_host()), out, {bound.out, 2 * u}, what + " out"),
        all_close(unpadded(dinp_d.to_host()), dinp, {bound.dinp, 4 * u}, what + " dinp"),
        all_close(dweight_d.to_host(), dweight, {bound.dweight, 4 * u}, what + " dweight")};
    for (const auto& check : checks) {
        std::cout << "[ measured ] " << check.message() << "\n";
        EXPECT_TRUE(check);
    }
}

TEST_F(ReductionOpsKernelTest, RmsNormF32) {
    check_rms_norm(*this, 37, 45, 0); // scalar path, C no multiple of 32
    check_rms_norm(*this, 21, 64, 0); // 128-bit packs
    check_rms_norm(*this, 21, 64, 1); // the same shape through the scalar path
}

// bf16 against the bf16 CPU twin: out is rounded twice (norm, then the product), two bf16 ulps; dinp once, one
// ulp on top of the float bound; rstd and dweight are float, the bounds above.
TEST_F(ReductionOpsKernelTest, RmsNormBf16) {
    const int N = 19, C = 68;
    const size_t count = size_t(N) * C;
    const auto inp = random_bf16(count), weight = random_bf16(C), dout = random_bf16(count);
    const auto dinp_start = random_bf16(count);
    const auto dweight_start = random_floats(C);
    std::vector<bfloat16> out(count), dinp = dinp_start;
    std::vector<float> rstd(N), dweight = dweight_start;
    cpu::rms_norm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-6);
    cpu::rms_norm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
    DeviceBuffer<bfloat16> inp_d(inp), weight_d(weight), dout_d(dout), out_d(bf16_nan_filled(count)), dinp_d(dinp_start);
    DeviceBuffer<float> rstd_d(nan_filled(N)), dweight_d(dweight_start), saved_rstd_d(rstd);
    DeviceBuffer<float> partials_d(static_cast<size_t>(gpu::rms_norm_backward_workspace_count(N, C)));
    gpu::rms_norm_forward(out_d.get(), rstd_d.get(), inp_d.get(), weight_d.get(), N, C, 1e-6f, stream);
    gpu::rms_norm_backward(dinp_d.get(), dweight_d.get(), partials_d.get(), dout_d.get(), inp_d.get(), weight_d.get(),
                           saved_rstd_d.get(), N, C, stream);
    const RmsNormBounds bound = rms_norm_bounds(inp, rstd, N, C);
    const auto checks = {
        all_close(rstd_d.to_host(), rstd, {0.0, bound.rstd}, "bf16 rms_norm rstd"),
        all_close(as_doubles(out_d.to_host()), as_doubles(out), {bound.out, 2 * bf16_ulp}, "bf16 rms_norm out"),
        all_close(as_doubles(dinp_d.to_host()), as_doubles(dinp), {bound.dinp, bf16_ulp}, "bf16 rms_norm dinp"),
        all_close(dweight_d.to_host(), dweight, {bound.dweight, 4 * u}, "bf16 rms_norm dweight")};
    for (const auto& check : checks) {
        std::cout << "[ measured ] " << check.message() << "\n";
        EXPECT_TRUE(check);
    }
}

// The ops with backward on the device against the CPU: loss = sum_i out_i w_i, the gradient of every input. The
// kernels are bounded above; shapes here are small (dimensions <= 5, rows of 5), so those bounds are all under
// 1e-6 on O(1) values; 1e-5 absolute covers the loss's 60-term weighted sum (60 u sum|out w| ~ 60^2 u ~ 2e-4 at
// worst, so the loss gets that) and gradients up to ~10 in magnitude.
TEST_F(ReductionOpsKernelTest, OpsWithBackwardOnCudaMatchTheCpu) {
    current_tape().clear();
    const Shape shape = {3, 4, 5};
    const int64_t count = shape_numel(shape);
    auto leaf = [&](const std::vector<float>& values, const Shape& leaf_shape, Device device) {
        Tensor tensor = Tensor::from_vector<float>(values, leaf_shape, device);
        tensor.set_requires_grad(true);
        return tensor;
    };
    const auto x = random_floats(count, -2.0f, 2.0f), t = random_floats(count), w = random_floats(5);
    using Build = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
    const std::vector<std::pair<std::string, Build>> cases = {
        {"softmax dim 1", [](const Tensor& a, const Tensor&, const Tensor&) { return softmax(a, 1); }},
        {"log_softmax dim -1", [](const Tensor& a, const Tensor&, const Tensor&) { return log_softmax(a, -1); }},
        {"sum dim 1 keepdim", [](const Tensor& a, const Tensor&, const Tensor&) { return sum(a, 1, true); }},
        {"mean dim -1", [](const Tensor& a, const Tensor&, const Tensor&) { return mean(a, -1); }},
        {"max dim 0", [](const Tensor& a, const Tensor&, const Tensor&) { return max(a, 0); }},
        {"mse_loss none", [](const Tensor& a, const Tensor& b, const Tensor&) { return mse_loss(a, b, Reduction::none); }},
        {"mse_loss mean", [](const Tensor& a, const Tensor& b, const Tensor&) { return mse_loss(a, b); }},
        {"rms_norm", [](const Tensor& a, const Tensor&, const Tensor& c) { return rms_norm(a, c); }},
    };
    for (const auto& [name, build] : cases) {
        std::vector<std::vector<float>> losses, gradients;
        for (const Device device : {Device::cpu, Device::cuda}) {
            Tensor a = leaf(x, shape, device), b = leaf(t, shape, device), c = leaf(w, {5}, device);
            Tensor out = build(a, b, c);
            std::vector<float> loss_weights(size_t(out.numel()));
            for (size_t i = 0; i < loss_weights.size(); ++i) loss_weights[i] = float(int(i % 7) - 3) / 3.0f;
            Tensor weight_column = Tensor::from_vector<float>(loss_weights, {out.numel(), 1}, device);
            Tensor loss = matmul(out.reshape({1, out.numel()}), weight_column);
            backward(loss);
            losses.push_back(loss.to(Device::cpu).to_vector<float>());
            std::vector<float> all;
            for (const Tensor& input : {a, b, c}) {
                const auto grad = input.grad().to(Device::cpu).to_vector<float>();
                all.insert(all.end(), grad.begin(), grad.end());
            }
            gradients.push_back(all);
        }
        EXPECT_TRUE(all_close(losses[1], losses[0], {2e-4, 0.0}, name + " loss"));
        const auto result = all_close(gradients[1], gradients[0], {1e-5, 0.0}, name + " gradients");
        std::cout << "[ measured ] " << result.message() << "\n";
        EXPECT_TRUE(result);
    }
}

} // namespace
} // namespace engine::test
