// The Llama-family CUDA kernels (kernels/cuda/{rope,swiglu}.cu, and embedding.cu without a position table) against
// their CPU twins on the same inputs, f32 and bf16, forward and backward, through the packed and the scalar paths
// (odd sizes, pointers one element past an aligned address); then the ops with backward on Device::cuda against
// Device::cpu, and their device checks. Outputs start as NaN; += outputs start at U(-0.01, 0.01).
//
// Tolerances:
// - rope: bitwise. The CUDA kernel spells out each rounding with __fmul_rn/__fadd_rn/__fsub_rn (no FMA contraction)
//   in the CPU twin's order, the tables are the same f32 values, and the one bf16 rounding is the same
//   round-to-nearest-even, so the results are the same bits on a GPU as on the emulated device.
// - embedding without positions: bitwise. The forward copies rows; the token gradient adds the same dout rows in
//   the same (ascending position) order in float as the CPU twin (docs/CUDA.md).
// - swiglu: bitwise on the emulated device (the same float expressions compiled for the host, std::exp on both
//   sides). On a GPU expf is within 2 ulp of std::exp and nvcc may fuse a product and a sum, so each element is
//   held to a derived bound instead (swiglu_bound below), plus one bf16 ulp where the two straddle a rounding.
#include <cmath>
#include <string>

#include "engine/autograd.h"
#include "base/bfloat16.h"
#include "engine/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/llama_kernels.h"
#include "tests/cuda/compare.h"
#include "tests/expect_error.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

constexpr double u = 1.0 / 16777216.0; // 2^-24
constexpr Tolerance exact{0.0, 0.0};
constexpr bool emulated = ENGINE_CUDA_EMULATED;

class LlamaKernelTest : public CudaKernelTest {
public:
    std::vector<bfloat16> random_bf16(size_t count, float low = -1.0f, float high = 1.0f) {
        const auto floats = random_floats(count, low, high);
        std::vector<bfloat16> values(count);
        for (size_t i = 0; i < count; ++i) values[i] = to_bfloat16(floats[i]);
        return values;
    }
    // Storage-typed random values: floats, or floats rounded to bf16.
    template <typename S>
    std::vector<S> random_values(size_t count, float low = -1.0f, float high = 1.0f) {
        if constexpr (std::is_same_v<S, float>) return random_floats(count, low, high);
        else return random_bf16(count, low, high);
    }
};

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& values) {
    std::vector<double> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = double(widen(values[i]));
    return out;
}

template <typename S>
std::vector<S> poisoned(size_t count) {
    return std::vector<S>(count, narrow<S>(std::numeric_limits<float>::quiet_NaN()));
}

// `offset` elements of padding in front, so that `get() + offset` is one element past an aligned address.
template <typename T>
std::vector<T> shifted(const std::vector<T>& values, int offset) {
    std::vector<T> result(size_t(offset), T{});
    result.insert(result.end(), values.begin(), values.end());
    return result;
}
template <typename T>
std::vector<T> unshifted(std::vector<T> values, int offset) {
    values.erase(values.begin(), values.begin() + offset);
    return values;
}

template <typename S>
const char* storage_name() {
    return std::is_same_v<S, float> ? "f32" : "bf16";
}

// Per-element |actual - expected| <= bound[i]; prints the largest error and the ratio to its bound.
::testing::AssertionResult within_bounds(const std::vector<double>& actual, const std::vector<double>& expected,
                                         const std::vector<double>& bound, const std::string& what) {
    double max_error = 0.0, max_ratio = 0.0;
    size_t failures = 0, first = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
        const double error = std::fabs(actual[i] - expected[i]);
        const bool ok = error <= bound[i]; // false for NaN
        if (!ok && failures++ == 0) first = i;
        max_error = std::max(max_error, error);
        if (bound[i] > 0.0) max_ratio = std::max(max_ratio, error / bound[i]);
    }
    std::ostringstream summary;
    summary << what << ": " << actual.size() << " elements, max abs error " << max_error << ", max error/bound "
            << max_ratio;
    if (failures == 0) return ::testing::AssertionSuccess() << summary.str();
    return ::testing::AssertionFailure() << summary.str() << ", " << failures << " beyond the bound; first [" << first
                                         << "] cuda " << actual[first] << " cpu " << expected[first] << " bound "
                                         << bound[first];
}

// Any floating tensor's values as doubles (exact: f32 and bf16 widen exactly), read back to the host.
std::vector<double> doubles_of(const Tensor& tensor) {
    NoGradGuard no_grad;
    return cast(tensor.to(Device::cpu), DType::f64).to_vector<double>();
}

void report(const ::testing::AssertionResult& result) {
    std::cout << "[ measured ] " << result.message() << "\n";
    EXPECT_TRUE(result);
}

// ---- rope ----
struct RopeShape {
    int B, T, H, D, P, offset;
    std::string name() const {
        return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) + " D=" +
               std::to_string(D) + " P=" + std::to_string(P) + (offset ? " misaligned" : "");
    }
};
// D/2 = 4 and 32: packs; D/2 = 3 (odd) and a misaligned pointer: scalars. T < P, so reading a wrong table row
// changes the result.
const std::vector<RopeShape> rope_shapes = {
    {2, 5, 3, 8, 7, 0}, {3, 7, 2, 64, 9, 0}, {2, 3, 5, 6, 4, 0}, {2, 5, 3, 8, 7, 1}};

// Packed documents: each batch row restarts its positions at documents of lengths 1 + (b + document) % 4, so rows
// differ and a position is often not its t.
std::vector<int32_t> document_positions(int B, int T) {
    std::vector<int32_t> positions(size_t(B) * T);
    for (int b = 0; b < B; ++b)
        for (int t = 0, document = 0, length = 1 + b % 4, position = 0; t < T; ++t) {
            if (position == length) position = 0, length = 1 + (b + ++document) % 4;
            positions[size_t(b) * T + t] = position++;
        }
    return positions;
}

template <typename S>
void check_rope(LlamaKernelTest& test, const RopeShape& shape, bool documents = false) {
    const std::string what =
        std::string(storage_name<S>()) + " rope " + shape.name() + (documents ? " packed documents" : "");
    const std::vector<int32_t> positions = document_positions(shape.B, shape.T);
    const int32_t* host_positions = documents ? positions.data() : nullptr;
    DeviceBuffer<int32_t> positions_d(positions);
    const int32_t* device_positions = documents ? positions_d.get() : nullptr;
    const size_t count = size_t(shape.B) * shape.T * shape.H * shape.D;
    const int offset = shape.offset;
    const RopeTables tables = rope_tables(shape.P, shape.D, 10000.0, DType::f32, Device::cpu);
    const std::vector<float> cos = tables.cos.to_vector<float>(), sin = tables.sin.to_vector<float>();
    const auto x = test.random_values<S>(count, -2.0f, 2.0f), dout = test.random_values<S>(count);
    const auto dx_start = test.random_values<S>(count, -0.01f, 0.01f);
    std::vector<S> out(count), dx = dx_start;
    cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), host_positions, shape.B, shape.T, shape.H, shape.D);
    cpu::rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), host_positions, shape.B, shape.T, shape.H,
                       shape.D);
    DeviceBuffer<S> x_d(shifted(x, offset)), dout_d(shifted(dout, offset)), out_d(shifted(poisoned<S>(count), offset));
    DeviceBuffer<S> dx_d(shifted(dx_start, offset));
    DeviceBuffer<float> cos_d(cos), sin_d(sin);
    gpu::rope_forward(out_d.get() + offset, x_d.get() + offset, cos_d.get(), sin_d.get(), device_positions, shape.B,
                      shape.T, shape.H, shape.D, test.stream);
    gpu::rope_backward(dx_d.get() + offset, dout_d.get() + offset, cos_d.get(), sin_d.get(), device_positions, shape.B,
                       shape.T, shape.H, shape.D, test.stream);
    report(all_close(as_doubles(unshifted(out_d.to_host(), offset)), as_doubles(out), exact, what + " out"));
    report(all_close(as_doubles(unshifted(dx_d.to_host(), offset)), as_doubles(dx), exact, what + " dx"));
}

TEST_F(LlamaKernelTest, RopeF32AndBf16AreBitwiseTheCpu) {
    for (const RopeShape& shape : rope_shapes) {
        check_rope<float>(*this, shape);
        check_rope<bfloat16>(*this, shape);
        check_rope<float>(*this, shape, true);
        check_rope<bfloat16>(*this, shape, true);
    }
}

// ---- swiglu ----
// A GPU's expf errs by <= 2 ulp (4u relative), so s = 1/(1 + e^-g) by <= 4u·e/(1+e) + 2u (the sum, the
// reciprocal) <= 6u relative, silu = g·s by 7u, out = silu·up by 8u. silu' = s(1 + g(1 - s)): 1 - s is off by
// <= 6u·s + u, g(1 - s) by |g|(7u s + 2u), and the rest of the chain (one more sum, the product with s, each
// fused or not) adds a few u of |s|(1 + |g|): |Δsilu'| <= 16u (1 + |g|) covers it. dgate adds dout·up·silu' to
// its start (one more rounding of the result, 2u counting a fused one), dup adds dout·silu (8u relative).
struct SwigluBounds {
    std::vector<double> out, dgate, dup;
};
template <typename S>
SwigluBounds swiglu_bounds(const std::vector<S>& gate, const std::vector<S>& up, const std::vector<S>& dout,
                           const std::vector<S>& out, const std::vector<S>& dgate, const std::vector<S>& dup) {
    const size_t n = gate.size();
    SwigluBounds bounds{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
    for (size_t i = 0; i < n; ++i) {
        const double g = widen(gate[i]), x = widen(up[i]), dy = widen(dout[i]);
        const double silu = g / (1.0 + std::exp(-g));
        // bf16: the two float results may round to neighbouring bf16 values, one ulp apart.
        const auto rounding = [&](double value) {
            return std::is_same_v<S, float> ? 0.0 : bfloat16_ulp(value) * 1.0000001;
        };
        bounds.out[i] = 8 * u * std::fabs(silu * x) + rounding(widen(out[i]));
        bounds.dgate[i] = 16 * u * std::fabs(dy * x) * (1.0 + std::fabs(g)) + 2 * u * std::fabs(widen(dgate[i])) +
                          rounding(widen(dgate[i]));
        bounds.dup[i] = 8 * u * std::fabs(dy * silu) + 2 * u * std::fabs(widen(dup[i])) + rounding(widen(dup[i]));
    }
    return bounds;
}

template <typename S>
void check_swiglu(LlamaKernelTest& test, int64_t n, int offset) {
    const std::string what = std::string(storage_name<S>()) + " swiglu N=" + std::to_string(n) +
                             (offset ? " misaligned" : "");
    // gate over silu's curved range (its derivative's zero near -1.28, saturation past +-6); up, dout O(1).
    const auto gate = test.random_values<S>(n, -8.0f, 8.0f), up = test.random_values<S>(n);
    const auto dout = test.random_values<S>(n), dgate_start = test.random_values<S>(n, -0.01f, 0.01f);
    const auto dup_start = test.random_values<S>(n, -0.01f, 0.01f);
    std::vector<S> out(n), dgate = dgate_start, dup = dup_start;
    cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
    cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), n);
    DeviceBuffer<S> gate_d(shifted(gate, offset)), up_d(shifted(up, offset)), dout_d(shifted(dout, offset));
    DeviceBuffer<S> out_d(shifted(poisoned<S>(n), offset)), dgate_d(shifted(dgate_start, offset));
    DeviceBuffer<S> dup_d(shifted(dup_start, offset));
    gpu::swiglu_forward(out_d.get() + offset, gate_d.get() + offset, up_d.get() + offset, n, test.stream);
    gpu::swiglu_backward(dgate_d.get() + offset, dup_d.get() + offset, dout_d.get() + offset, gate_d.get() + offset,
                         up_d.get() + offset, n, test.stream);
    const auto out_cuda = as_doubles(unshifted(out_d.to_host(), offset));
    const auto dgate_cuda = as_doubles(unshifted(dgate_d.to_host(), offset));
    const auto dup_cuda = as_doubles(unshifted(dup_d.to_host(), offset));
    const SwigluBounds bounds = swiglu_bounds(gate, up, dout, out, dgate, dup);
    report(within_bounds(out_cuda, as_doubles(out), bounds.out, what + " out"));
    report(within_bounds(dgate_cuda, as_doubles(dgate), bounds.dgate, what + " dgate"));
    report(within_bounds(dup_cuda, as_doubles(dup), bounds.dup, what + " dup"));
    if (emulated) { // the same expressions on the host: the same bits
        EXPECT_TRUE(all_close(out_cuda, as_doubles(out), exact, what + " out (emulated: bitwise)"));
        EXPECT_TRUE(all_close(dgate_cuda, as_doubles(dgate), exact, what + " dgate (emulated: bitwise)"));
        EXPECT_TRUE(all_close(dup_cuda, as_doubles(dup), exact, what + " dup (emulated: bitwise)"));
    }

    // One gradient alone (the other operand needs none): the kernel skips the null one.
    std::vector<S> dup_only = dup_start;
    cpu::swiglu_backward(static_cast<S*>(nullptr), dup_only.data(), dout.data(), gate.data(), up.data(), n);
    DeviceBuffer<S> dup_only_d(shifted(dup_start, offset));
    gpu::swiglu_backward(nullptr, dup_only_d.get() + offset, dout_d.get() + offset, gate_d.get() + offset,
                         up_d.get() + offset, n, test.stream);
    report(within_bounds(as_doubles(unshifted(dup_only_d.to_host(), offset)), as_doubles(dup_only), bounds.dup,
                         what + " dup alone"));
}

TEST_F(LlamaKernelTest, SwigluF32AndBf16MatchTheCpu) {
    for (const int offset : {0, 1}) {
        // 558 = 4·139 + 2: packs plus a tail; offset 1: the scalar path.
        check_swiglu<float>(*this, 3 * 37 * 5 + 3, offset);
        check_swiglu<bfloat16>(*this, 3 * 37 * 5 + 3, offset);
    }
}

// ---- embedding without a position table ----
template <typename S>
void check_plain_embedding(LlamaKernelTest& test, int B, int T, int V, int C) {
    const std::string what = std::string(storage_name<S>()) + " plain embedding C=" + std::to_string(C);
    const auto tokens = test.random_ints(size_t(B) * T, 0, V - 1);
    const auto table = test.random_values<S>(size_t(V) * C);
    std::vector<S> out(size_t(B) * T * C);
    cpu::embedding_forward(out.data(), tokens.data(), table.data(), static_cast<const S*>(nullptr), nullptr, B, T, C);
    DeviceBuffer<int32_t> tokens_d(tokens);
    DeviceBuffer<S> table_d(table), out_d(poisoned<S>(out.size()));
    gpu::embedding_forward(out_d.get(), tokens_d.get(), table_d.get(), nullptr, nullptr, B, T, C, test.stream);
    report(all_close(as_doubles(out_d.to_host()), as_doubles(out), exact, what + " out"));

    const auto dout = test.random_values<S>(out.size());
    auto dtable = test.random_floats(size_t(V) * C, -0.01f, 0.01f);
    DeviceBuffer<float> dtable_d(dtable);
    DeviceBuffer<S> dout_d(dout);
    cpu::embedding_backward(dtable.data(), static_cast<float*>(nullptr), dout.data(), tokens.data(), nullptr, B, T, C);
    const gpu::TokenGroups groups = gpu::group_positions_by_token(tokens.data(), B * T);
    DeviceBuffer<int32_t> groups_d(groups.packed);
    gpu::embedding_backward(dtable_d.get(), nullptr, dout_d.get(), groups_d.get(), groups.distinct, nullptr, 0, B, T, C,
                            test.stream);
    report(all_close(dtable_d.to_host(), dtable, exact, what + " dtoken_table"));
}

TEST_F(LlamaKernelTest, PlainEmbeddingF32AndBf16AreBitwiseTheCpu) {
    // Few tokens, so rows repeat; C = 36: packs with a partial tile; C = 37: scalars.
    for (const int C : {36, 37}) {
        check_plain_embedding<float>(*this, 3, 11, 7, C);
        check_plain_embedding<bfloat16>(*this, 3, 11, 7, C);
    }
}

// ---- the ops with backward on the device ----
// loss = sum(out · w) on each device; every gradient against the CPU's. rope and the embedding are bitwise
// kernels, so their ops are bitwise too. swiglu's gradients are held to the kernel bound above (up here is the
// same for both operands' gradients: dout = w).
TEST_F(LlamaKernelTest, OpsWithBackwardOnCudaMatchTheCpu) {
    current_tape().clear();
    for (const DType dtype : {DType::f32, DType::bf16}) {
        const std::string name = dtype_name(dtype);
        auto leaf = [&](const std::vector<float>& values, const Shape& shape, Device device) {
            NoGradGuard no_grad;
            Tensor tensor = cast(Tensor::from_vector<float>(values, shape, Device::cpu), dtype).to(device);
            tensor.set_requires_grad(true);
            return tensor;
        };
        auto constant = [&](const std::vector<float>& values, const Shape& shape, Device device) {
            NoGradGuard no_grad;
            return cast(Tensor::from_vector<float>(values, shape, Device::cpu), dtype).to(device);
        };
        const int B = 2, T = 5, H = 3, D = 8, P = 7, V = 9;
        const Shape x_shape = {B, T, H * D};
        const auto x = random_floats(size_t(B) * T * H * D, -2.0f, 2.0f);
        const auto w = random_floats(x.size());
        const auto up = random_floats(x.size());
        const auto table = random_floats(size_t(V) * H * D);
        const auto ids = random_ints(size_t(B) * T, 0, V - 1);
        struct Result {
            std::vector<double> rope_out, rope_dx, swiglu_out, dgate, dup, embedding_out, dtable;
        };
        auto run = [&](Device device) {
            Result result;
            const RopeTables tables = rope_tables(P, D, 10000.0, dtype, device);
            Tensor xs = leaf(x, x_shape, device), ws = constant(w, x_shape, device);
            Tensor rotated = rope(xs, tables.cos, tables.sin, D);
            backward(sum(mul(rotated, ws)));
            result.rope_out = doubles_of(rotated);
            result.rope_dx = doubles_of(xs.grad());

            Tensor gate = leaf(x, x_shape, device), ups = leaf(up, x_shape, device);
            Tensor activated = swiglu(gate, ups);
            backward(sum(mul(activated, ws)));
            result.swiglu_out = doubles_of(activated);
            result.dgate = doubles_of(gate.grad());
            result.dup = doubles_of(ups.grad());

            Tensor tokens = Tensor::from_vector<int32_t>(ids, {B, T}, device);
            Tensor rows = leaf(table, {V, H * D}, device);
            Tensor embedded = embedding(tokens, rows);
            backward(sum(mul(embedded, ws)));
            result.embedding_out = doubles_of(embedded);
            result.dtable = doubles_of(rows.grad());
            EXPECT_EQ(rotated.dtype(), dtype);
            EXPECT_EQ(activated.device(), device);
            return result;
        };
        const Result host = run(Device::cpu), device = run(Device::cuda);
        report(all_close(device.rope_out, host.rope_out, exact, name + " rope op out"));
        report(all_close(device.rope_dx, host.rope_dx, exact, name + " rope op dx"));
        report(all_close(device.embedding_out, host.embedding_out, exact, name + " plain embedding op out"));
        report(all_close(device.dtable, host.dtable, exact, name + " plain embedding op dtable"));
        // swiglu: mul's gradient (dout = w, in the storage dtype on both devices) feeds the kernel; the bound is
        // the kernel's, from the CPU's values. The leaf gradients of bf16 tensors are f32 sums of one bf16 term.
        std::vector<float> gate_values(x.size()), up_values(x.size()), w_values(x.size());
        {
            NoGradGuard no_grad;
            gate_values = cast(constant(x, x_shape, Device::cpu), DType::f32).to_vector<float>();
            up_values = cast(constant(up, x_shape, Device::cpu), DType::f32).to_vector<float>();
            w_values = cast(constant(w, x_shape, Device::cpu), DType::f32).to_vector<float>();
        }
        const std::vector<float> out_f(host.swiglu_out.begin(), host.swiglu_out.end());
        const std::vector<float> dgate_f(host.dgate.begin(), host.dgate.end()), dup_f(host.dup.begin(), host.dup.end());
        SwigluBounds bounds = swiglu_bounds(gate_values, up_values, w_values, out_f, dgate_f, dup_f);
        if (dtype == DType::bf16) // one bf16 rounding of each value, as in the bf16 kernel test
            for (size_t i = 0; i < x.size(); ++i) {
                bounds.out[i] += bfloat16_ulp(host.swiglu_out[i]);
                bounds.dgate[i] += bfloat16_ulp(host.dgate[i]);
                bounds.dup[i] += bfloat16_ulp(host.dup[i]);
            }
        report(within_bounds(device.swiglu_out, host.swiglu_out, bounds.out, name + " swiglu op out"));
        report(within_bounds(device.dgate, host.dgate, bounds.dgate, name + " swiglu op dgate"));
        report(within_bounds(device.dup, host.dup, bounds.dup, name + " swiglu op dup"));
    }
}

TEST_F(LlamaKernelTest, DeviceMismatchAndF64AreNamedInTheError) {
    using engine::testing::expect_error;
    NoGradGuard no_grad;
    const RopeTables host_tables = rope_tables(4, 8, 10000.0, DType::f32, Device::cpu);
    const RopeTables device_tables = rope_tables(4, 8, 10000.0, DType::f32, Device::cuda);
    EXPECT_EQ(device_tables.cos.device(), Device::cuda);
    Tensor x = Tensor::zeros({2, 3, 16}, DType::f32, Device::cuda);
    expect_error([&] { rope(x, host_tables.cos, device_tables.sin, 8); }, {"rope", "(2,3,16)", "cuda", "cpu"});
    const RopeTables double_tables = rope_tables(4, 8, 10000.0, DType::f64, Device::cuda);
    expect_error([&] { rope(Tensor::zeros({2, 3, 16}, DType::f64, Device::cuda), double_tables.cos, double_tables.sin, 8); },
                 {"rope", "f64"});
    Tensor gate = Tensor::zeros({3, 4}, DType::f32, Device::cuda);
    expect_error([&] { swiglu(gate, Tensor::zeros({3, 4}, DType::f32, Device::cpu)); }, {"swiglu", "(3,4)", "cuda", "cpu"});
    expect_error([&] { embedding(Tensor::zeros({1, 2}, DType::i32, Device::cpu), Tensor::zeros({5, 4}, DType::f32, Device::cuda)); },
                 {"embedding", "cuda", "cpu"});
}

} // namespace
} // namespace engine::test
