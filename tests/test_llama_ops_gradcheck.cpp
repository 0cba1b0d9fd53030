// The Llama-family ops (engine/ops/llama.h: rope, rope_tables, swiglu; the plain embedding of engine/ops.h) on
// the CPU: float64 central finite differences, values against independent evaluations of Hugging Face's formulas,
// rope_tables against transformers' float32 recipe and against double-precision angles, rope's orthogonality, and
// bad input named in the error.
#include <cmath>
#include <numbers>

#include "expect_error.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

constexpr double float_unit = 1.0 / 16777216.0;              // 2^-24, f32's unit roundoff
constexpr double double_unit = 1.0 / 9007199254740992.0;     // 2^-53

// Any floating tensor's values as doubles (exact: f32 and bf16 widen exactly).
std::vector<double> doubles_of(const Tensor& tensor) {
    NoGradGuard no_grad;
    return tensor.dtype() == DType::f64 ? tensor.to_vector<double>() : cast(tensor, DType::f64).to_vector<double>();
}

class LlamaOpsGradcheck : public TapeTest {};

struct RopeShape {
    int B, T, H, D, P;
    std::string name() const {
        return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
               " D=" + std::to_string(D) + " P=" + std::to_string(P);
    }
};
// Several heads and head sizes (D = 2: one pair; 6: D/2 odd; 8, 16), T < P throughout, so a kernel reading the
// wrong table row (or past T) shows.
const std::vector<RopeShape> rope_shapes = {{2, 3, 1, 2, 5}, {2, 4, 3, 6, 7}, {1, 5, 2, 8, 9}, {2, 3, 2, 16, 4}};
// A small theta spreads the angles over several turns within these few positions.
constexpr double small_theta = 50.0;

// HF's apply_rotary_pos_emb for one head, evaluated here in double: q * cos + rotate_half(q) * sin with the
// (T, D) tables cat(freqs, freqs), rotate_half(q) = cat(-q2, q1).
std::vector<double> rope_reference(const std::vector<double>& x, const std::vector<double>& cos,
                                   const std::vector<double>& sin, const RopeShape& shape) {
    const int half = shape.D / 2;
    std::vector<double> out(x.size());
    for (int b = 0; b < shape.B; ++b)
        for (int t = 0; t < shape.T; ++t)
            for (int h = 0; h < shape.H; ++h) {
                const size_t head = ((size_t(b) * shape.T + t) * shape.H + h) * shape.D;
                for (int j = 0; j < shape.D; ++j) {
                    const int i = j % half; // cat(freqs, freqs)
                    const double rotated = j < half ? -x[head + j + half] : x[head + j - half];
                    out[head + j] = x[head + j] * cos[size_t(t) * half + i] + rotated * sin[size_t(t) * half + i];
                }
            }
    return out;
}

TEST_F(LlamaOpsGradcheck, RopeGradientsForSeveralShapes) {
    for (const RopeShape& shape : rope_shapes) {
        const RopeTables tables = rope_tables(shape.P, shape.D, small_theta, DType::f64, Device::cpu);
        Tensor x = random_leaf(generator, {shape.B, shape.T, int64_t(shape.H) * shape.D});
        Tensor weights = random_tensor(generator, {x.numel()});
        auto result = gradcheck([&] { return weighted_sum(rope(x, tables.cos, tables.sin, shape.D), weights); }, {x});
        EXPECT_GRADCHECK(result, "rope " + shape.name());
    }
}

// The tables are constants: one that requires grad still gets none.
TEST_F(LlamaOpsGradcheck, RopeTablesReceiveNoGradient) {
    RopeTables tables = rope_tables(4, 4, small_theta, DType::f64, Device::cpu);
    tables.cos.set_requires_grad(true);
    Tensor x = random_leaf(generator, {1, 3, 8});
    backward(sum(rope(x, tables.cos, tables.sin, 4)));
    const Tensor grad = tables.cos.grad();
    if (grad.defined())
        for (const double value : grad.to_vector<double>()) EXPECT_EQ(value, 0.0);
    EXPECT_TRUE(x.grad().defined());
}

// Against HF's formula in double, written out as transformers does it (q * cos + rotate_half(q) * sin with the
// tables cat(freqs, freqs)), from the same f64 tables (they are checked on their own below). Both sides add two
// rounded products of doubles and round the sum: each is within 2^-53·(|x_i c| + |x_j s| + |out|) <=
// 2·2^-53·(|x_i| + |x_j|) of the exact value, so they differ by at most 4·2^-53·(|x_i| + |x_j|).
TEST_F(LlamaOpsGradcheck, RopeValuesMatchTheHuggingFaceFormula) {
    NoGradGuard no_grad;
    for (const RopeShape& shape : rope_shapes) {
        const int half = shape.D / 2;
        Tensor x = random_tensor(generator, {shape.B, shape.T, int64_t(shape.H) * shape.D});
        const RopeTables tables = rope_tables(shape.P, shape.D, small_theta, DType::f64, Device::cpu);
        const std::vector<double> values = x.to_vector<double>();
        const std::vector<double> expected =
            rope_reference(values, tables.cos.to_vector<double>(), tables.sin.to_vector<double>(), shape);
        const std::vector<double> actual = rope(x, tables.cos, tables.sin, shape.D).to_vector<double>();
        double worst = 0.0;
        for (size_t k = 0; k < actual.size(); ++k) {
            const size_t head_start = k - k % shape.D, i = k % shape.D % half;
            const double magnitude = std::fabs(values[head_start + i]) + std::fabs(values[head_start + i + half]);
            const double error = std::fabs(actual[k] - expected[k]);
            worst = std::max(worst, error / magnitude);
            EXPECT_LE(error, 4 * double_unit * magnitude) << shape.name() << " element " << k;
        }
        std::printf("[ measured ] rope f64 %s: max |error| / (|x_i|+|x_j|) %.3g\n", shape.name().c_str(), worst);
    }
}

// f32 and bf16 against the same formula in double from the f32 tables: f32 rounds each product and the sum,
// |error| <= 3·2^-24·(|x_i| + |x_j|); bf16 computes that in f32 and rounds once more, half a bf16 ulp of the
// result on top.
TEST_F(LlamaOpsGradcheck, RopeF32AndBf16RoundOnceOnStore) {
    NoGradGuard no_grad;
    const RopeShape shape = {2, 5, 3, 8, 7};
    const RopeTables tables = rope_tables(shape.P, shape.D, 10000.0, DType::f32, Device::cpu);
    const std::vector<double> cos = doubles_of(tables.cos), sin = doubles_of(tables.sin);
    for (const DType dtype : {DType::f32, DType::bf16}) {
        Tensor x = cast(random_tensor(generator, {shape.B, shape.T, int64_t(shape.H) * shape.D}, DType::f32), dtype);
        const std::vector<double> values = doubles_of(x);
        const std::vector<double> expected = rope_reference(values, cos, sin, shape);
        const std::vector<double> actual = doubles_of(rope(x, tables.cos, tables.sin, shape.D));
        double worst = 0.0;
        for (size_t k = 0; k < actual.size(); ++k) {
            const size_t head_start = k - k % shape.D, half = shape.D / 2, i = k % shape.D % half;
            const double magnitude = std::fabs(values[head_start + i]) + std::fabs(values[head_start + i + half]);
            double bound = 3 * float_unit * magnitude;
            // One more rounding, to bf16: half an ulp of the result's binade (the larger of the two sides').
            if (dtype == DType::bf16) bound += 0.5 * std::max(bfloat16_ulp(expected[k]), bfloat16_ulp(actual[k]));
            worst = std::max(worst, std::fabs(actual[k] - expected[k]) / bound);
            EXPECT_LE(std::fabs(actual[k] - expected[k]), bound) << dtype_name(dtype) << " element " << k;
        }
        std::printf("[ measured ] rope %s against the formula in double: max error / bound %.3g\n", dtype_name(dtype),
                    worst);
        EXPECT_EQ(rope(x, tables.cos, tables.sin, shape.D).dtype(), dtype);
    }
}

// A rotation: every head's norm is kept (to double rounding), position 0 is the identity, and backward, the
// inverse rotation, undoes forward: grad of sum(w · rope(x)) is rope⁻¹(w), so rope(that) gives back w.
TEST_F(LlamaOpsGradcheck, RopeIsAnOrthogonalRotation) {
    const RopeShape shape = {2, 6, 3, 8, 6};
    const RopeTables tables = rope_tables(shape.P, shape.D, 10000.0, DType::f64, Device::cpu);
    Tensor x = random_leaf(generator, {shape.B, shape.T, int64_t(shape.H) * shape.D});
    const std::vector<double> values = x.to_vector<double>();
    Tensor out;
    {
        NoGradGuard no_grad;
        out = rope(x, tables.cos, tables.sin, shape.D);
    }
    const std::vector<double> rotated = out.to_vector<double>();
    double worst = 0.0;
    for (size_t head = 0; head < values.size(); head += shape.D) {
        double before = 0.0, after = 0.0;
        for (int j = 0; j < shape.D; ++j) before += values[head + j] * values[head + j], after += rotated[head + j] * rotated[head + j];
        worst = std::max(worst, std::fabs(std::sqrt(after) - std::sqrt(before)) / std::sqrt(before));
        const bool first_position = (head / (size_t(shape.H) * shape.D)) % shape.T == 0;
        if (first_position)
            for (int j = 0; j < shape.D; ++j) EXPECT_EQ(rotated[head + j], values[head + j]) << "t = 0 is the identity";
    }
    std::printf("[ measured ] rope: max relative change of a head's norm %.3g\n", worst);
    EXPECT_LE(worst, 16 * double_unit * shape.D);

    Tensor weights = random_tensor(generator, {x.numel()});
    backward(weighted_sum(rope(x, tables.cos, tables.sin, shape.D), weights));
    NoGradGuard no_grad;
    const std::vector<double> undone = rope(x.grad(), tables.cos, tables.sin, shape.D).to_vector<double>();
    const std::vector<double> w = weights.to_vector<double>();
    double worst_inverse = 0.0;
    for (size_t k = 0; k < w.size(); ++k) worst_inverse = std::max(worst_inverse, std::fabs(undone[k] - w[k]));
    std::printf("[ measured ] rope(backward(w)) - w: max |error| %.3g\n", worst_inverse);
    EXPECT_LE(worst_inverse, 1e-14);
}

// rope_tables against transformers' float32 recipe, written out here on its own: exponent float(2i)/float(D),
// base**exponent in f32, its f32 reciprocal, times float(t) in f32; then cos/sin of that angle correctly rounded.
// Torch's f32 cos/sin are within 1 ulp of that, and so must the tables be (they are in fact equal).
TEST_F(LlamaOpsGradcheck, RopeTablesFollowTransformersFloat32Recipe) {
    for (const double theta : {10000.0, 500000.0}) {
        const int positions = 2048, head_size = 64, half = head_size / 2;
        const RopeTables tables = rope_tables(positions, head_size, theta, DType::f32, Device::cpu);
        ASSERT_EQ(tables.cos.shape(), (Shape{positions, half}));
        ASSERT_EQ(tables.cos.dtype(), DType::f32);
        EXPECT_EQ(tables.cos.category(), MemoryCategory::parameters);
        const std::vector<float> cos = tables.cos.to_vector<float>(), sin = tables.sin.to_vector<float>();
        double worst_ulps = 0.0, worst_double = 0.0;
        for (int t = 0; t < positions; ++t)
            for (int i = 0; i < half; ++i) {
                const size_t k = size_t(t) * half + i;
                if (t == 0) {
                    EXPECT_EQ(cos[k], 1.0f);
                    EXPECT_EQ(sin[k], 0.0f);
                }
                const float exponent = float(2 * i) / float(head_size);
                const float inverse_frequency = 1.0f / std::pow(float(theta), exponent);
                const float angle = float(t) * inverse_frequency;
                for (const bool is_cos : {true, false}) {
                    const double exact = is_cos ? std::cos(double(angle)) : std::sin(double(angle));
                    const double table = is_cos ? cos[k] : sin[k];
                    // ilogb(0) is FP_ILOGB0 (INT_MIN): exact zeros (sin at t = 0) take the smallest subnormal.
                    const double ulp = exact == 0.0 ? std::ldexp(1.0, -149)
                                                    : std::max(std::ldexp(1.0, std::ilogb(std::fabs(exact)) - 23),
                                                               std::ldexp(1.0, -149));
                    worst_ulps = std::max(worst_ulps, std::fabs(table - exact) / ulp);
                    // Independently of the recipe: the exact angle t / theta^(2i/D) in double. The recipe's
                    // angle is off by its f32 roundings, (ln(theta)·2i/D + 4)·2^-24 relative at most (the exponent's
                    // rounding scaled by ln theta, powf's 1 ulp, the reciprocal, the product), which moves cos and
                    // sin by at most that times the angle; plus the final rounding to f32.
                    const double true_angle = t / std::pow(theta, 2.0 * i / head_size);
                    const double true_value = is_cos ? std::cos(true_angle) : std::sin(true_angle);
                    const double bound = float_unit + true_angle * (std::log(theta) * 2.0 * i / head_size + 4.0) *
                                                          float_unit * 1.01;
                    worst_double = std::max(worst_double, std::fabs(table - true_value) / bound);
                    EXPECT_LE(std::fabs(table - true_value), bound) << "t " << t << " i " << i;
                }
            }
        std::printf("[ measured ] rope_tables theta %g: max %.3g ulp from the f32 recipe; max error / bound against "
                    "double angles %.3g\n", theta, worst_ulps, worst_double);
        EXPECT_LE(worst_ulps, 0.5 + 1e-9); // correctly rounded: within half an ulp, so within torch's 1
    }
    // bf16 models take f32 tables; f64 ones f64 tables computed in double.
    EXPECT_EQ(rope_tables(3, 4, 10000.0, DType::bf16, Device::cpu).sin.dtype(), DType::f32);
    const RopeTables doubles = rope_tables(3, 4, 10000.0, DType::f64, Device::cpu);
    EXPECT_EQ(doubles.cos.dtype(), DType::f64);
    EXPECT_EQ(doubles.cos.to_vector<double>()[2 * 2 + 1], std::cos(2.0 / 100.0)); // t 2, i 1: 2 / 10000^(1/2)
}

TEST_F(LlamaOpsGradcheck, SwigluGradientsAndValues) {
    Tensor gate = random_leaf(generator, {3, 4, 5}, 2.0);
    Tensor up = random_leaf(generator, {3, 4, 5});
    Tensor weights = random_tensor(generator, {gate.numel()});
    auto both = gradcheck([&] { return weighted_sum(swiglu(gate, up), weights); }, {gate, up});
    EXPECT_GRADCHECK(both, "swiglu gate and up");
    // The same tensor as both operands: the two partials add into one gradient.
    auto shared = gradcheck([&] { return weighted_sum(swiglu(gate, gate), weights); }, {gate});
    EXPECT_GRADCHECK(shared, "swiglu(x, x)");

    NoGradGuard no_grad;
    const std::vector<double> g = gate.to_vector<double>(), u = up.to_vector<double>();
    const std::vector<double> out = swiglu(gate, up).to_vector<double>();
    double worst = 0.0;
    for (size_t k = 0; k < g.size(); ++k) {
        const double expected = g[k] / (1.0 + std::exp(-g[k])) * u[k]; // silu(g) * u, written another way
        worst = std::max(worst, std::fabs(out[k] - expected) / std::max(std::fabs(expected), 1e-300));
    }
    std::printf("[ measured ] swiglu f64 values: max relative error %.3g\n", worst);
    EXPECT_LE(worst, 8 * double_unit); // a handful of roundings and exp's ulp
}

TEST_F(LlamaOpsGradcheck, PlainEmbeddingGradientsAndValues) {
    const int V = 6, C = 5;
    // Repeated tokens, so gradient rows accumulate over several positions.
    Tensor tokens = Tensor::from_vector<int32_t>({1, 4, 1, 0, 5, 1, 4, 2}, {2, 4}, Device::cpu);
    Tensor table = random_leaf(generator, {V, C});
    Tensor weights = random_tensor(generator, {2 * 4 * C});
    auto result = gradcheck([&] { return weighted_sum(embedding(tokens, table), weights); }, {table});
    EXPECT_GRADCHECK(result, "plain embedding");

    NoGradGuard no_grad;
    const std::vector<double> rows = table.to_vector<double>();
    const std::vector<double> out = embedding(tokens, table).to_vector<double>();
    const std::vector<int32_t> ids = tokens.to_vector<int32_t>();
    for (size_t position = 0; position < ids.size(); ++position)
        for (int c = 0; c < C; ++c)
            EXPECT_EQ(out[position * C + c], rows[size_t(ids[position]) * C + c]) << "position " << position;
    // bf16: a copy of the rows, no rounding.
    Tensor narrow_table = cast(table, DType::bf16);
    const std::vector<double> narrow_out = doubles_of(embedding(tokens, narrow_table));
    const std::vector<double> narrow_rows = doubles_of(narrow_table);
    for (size_t position = 0; position < ids.size(); ++position)
        for (int c = 0; c < C; ++c)
            EXPECT_EQ(narrow_out[position * C + c], narrow_rows[size_t(ids[position]) * C + c]);
}

TEST_F(LlamaOpsGradcheck, BadInputIsNamedInTheError) {
    NoGradGuard no_grad;
    const RopeTables tables = rope_tables(4, 8, 10000.0, DType::f32, Device::cpu);
    Tensor x = random_tensor(generator, {2, 3, 16}, DType::f32);
    expect_error([&] { rope(x, tables.cos, tables.sin, 7); }, {"rope", "head_size 7", "even", "(2,3,16)"});
    expect_error([&] { rope(x, tables.cos, tables.sin, 0); }, {"rope", "head_size 0"});
    expect_error([&] { rope(random_tensor(generator, {2, 3, 12}, DType::f32), tables.cos, tables.sin, 8); },
                 {"rope", "(2,3,12)", "not a multiple of head_size 8"});
    expect_error([&] { rope(random_tensor(generator, {2, 5, 16}, DType::f32), tables.cos, tables.sin, 8); },
                 {"rope", "sequence length 5", "(2,5,16)", "(4,4)"});
    const RopeTables doubles = rope_tables(4, 8, 10000.0, DType::f64, Device::cpu);
    expect_error([&] { rope(x, doubles.cos, tables.sin, 8); }, {"rope", "cos table", "(4,4)", "f64", "must be f32"});
    const RopeTables wide = rope_tables(4, 16, 10000.0, DType::f32, Device::cpu);
    expect_error([&] { rope(x, tables.cos, wide.sin, 8); }, {"rope", "sin table", "(4,8)", "(positions,4)"});
    expect_error([&] { rope(random_tensor(generator, {6, 16}, DType::f32), tables.cos, tables.sin, 8); },
                 {"rope", "(6,16)", "(B,T,heads*head_size)"});
    expect_error([&] { rope(Tensor::zeros({2, 3, 16}, DType::i32, Device::cpu), tables.cos, tables.sin, 8); },
                 {"rope", "(2,3,16)", "i32"});
    expect_error([&] { rope_tables(4, 5, 10000.0, DType::f32, Device::cpu); }, {"rope_tables", "head_size 5", "even"});
    expect_error([&] { rope_tables(4, 8, -1.0, DType::f32, Device::cpu); }, {"rope_tables", "theta"});
    expect_error([&] { rope_tables(4, 8, 10000.0, DType::i32, Device::cpu); }, {"rope_tables", "i32"});

    Tensor gate = random_tensor(generator, {3, 4}, DType::f32);
    expect_error([&] { swiglu(gate, random_tensor(generator, {4, 3}, DType::f32)); },
                 {"swiglu", "(3,4)", "(4,3)", "same shape"});
    expect_error([&] { swiglu(gate, random_tensor(generator, {3, 4}, DType::f64)); }, {"swiglu", "f32", "f64"});
    expect_error([&] { swiglu(Tensor::zeros({3, 4}, DType::i32, Device::cpu), Tensor::zeros({3, 4}, DType::i32, Device::cpu)); },
                 {"swiglu", "(3,4)", "i32"});

    Tensor table = random_tensor(generator, {5, 4}, DType::f32);
    expect_error([&] { embedding(Tensor::from_vector<int32_t>({0, 5}, {1, 2}, Device::cpu), table); },
                 {"embedding", "token id 5", "[0,5)"});
    expect_error([&] { embedding(Tensor::from_vector<int32_t>({-1, 0}, {1, 2}, Device::cpu), table); },
                 {"embedding", "token id -1"});
    expect_error([&] { embedding(Tensor::zeros({1, 2}, DType::f32, Device::cpu), table); }, {"embedding", "(1,2)", "i32"});
    expect_error([&] { embedding(Tensor::zeros({1, 2}, DType::i32, Device::cpu), random_tensor(generator, {20}, DType::f32)); },
                 {"embedding", "(20)", "2-D"});
    expect_error([&] { embedding(Tensor::zeros({1, 2}, DType::i32, Device::cpu), table, Tensor()); },
                 {"embedding", "position table", "undefined"});
}

} // namespace
} // namespace engine::testing
