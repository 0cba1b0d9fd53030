// The pointwise ops (relu, silu, tanh, sigmoid, exp, log; add, sub, mul, div with broadcasting) against float64
// finite differences, their values against independent float64 formulas and index arithmetic, and their errors.
#include <cmath>

#include "expect_error.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

class PointwiseGradcheck : public TapeTest {};

// Moves values out of [-margin, margin], where relu's kink would meet the finite difference's step.
void keep_away_from_zero(Tensor& tensor, double margin) {
    double* values = tensor.data<double>();
    for (int64_t i = 0; i < tensor.numel(); ++i)
        if (std::fabs(values[i]) < margin) values[i] = values[i] < 0 ? -margin : margin;
}

struct UnaryCase {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*reference)(double);
};

TEST_F(PointwiseGradcheck, UnaryFunctionsMatchFiniteDifferencesAndTheirFormulas) {
    const UnaryCase cases[] = {
        {"relu", relu, [](double x) { return x > 0 ? x : 0.0; }},
        {"silu", silu, [](double x) { return x / (1.0 + std::exp(-x)); }},
        {"tanh", engine::tanh, [](double x) { return std::tanh(x); }},
        {"sigmoid", sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
        {"exp", engine::exp, [](double x) { return std::exp(x); }},
        {"log", engine::log, [](double x) { return std::log(x); }},
    };
    for (const UnaryCase& unary : cases) {
        SCOPED_TRACE(unary.name);
        // exp at scale 2 reaches e^8: the loss's rounding, divided by the step, would swamp small gradients.
        const bool exponential = std::string(unary.name) == "exp";
        Tensor input = random_leaf(generator, {3, 7, 5}, exponential ? 0.5 : 2.0);
        if (std::string(unary.name) == "log") { // positive inputs, some of them small
            double* values = input.data<double>();
            for (int64_t i = 0; i < input.numel(); ++i) values[i] = std::fabs(values[i]) + 0.05;
        }
        keep_away_from_zero(input, 1e-3);
        Tensor weights = random_tensor(generator, {input.numel()});
        EXPECT_GRADCHECK(gradcheck([&] { return weighted_sum(unary.op(input), weights); }, {input}));
        NoGradGuard no_grad;
        const std::vector<double> in = input.to_vector<double>(), out = unary.op(input).to_vector<double>();
        for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(out[i], unary.reference(in[i]), 1e-15 * (1 + std::fabs(out[i])));
    }
}

TEST_F(PointwiseGradcheck, ReluGradientIsZeroAtZeroAsPyTorch) {
    Tensor input = Tensor::from_vector<double>({-1.0, 0.0, 2.0}, {3}, Device::cpu);
    input.set_requires_grad(true);
    backward(sum(relu(input)));
    EXPECT_EQ(input.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, 1.0}));
}

TEST_F(PointwiseGradcheck, SigmoidAndSiluStayFiniteAtLargeMagnitudes) {
    NoGradGuard no_grad;
    Tensor input = Tensor::from_vector<float>({-1000.0f, -90.0f, 90.0f, 1000.0f}, {4}, Device::cpu);
    const std::vector<float> s = sigmoid(input).to_vector<float>(), u = silu(input).to_vector<float>();
    EXPECT_EQ(s, (std::vector<float>{0.0f, 0.0f, 1.0f, 1.0f}));
    EXPECT_TRUE(u[0] == 0.0f && std::signbit(u[0])) << u[0]; // -1000 · 0: a negative zero, not NaN
    EXPECT_TRUE(std::isfinite(u[1]) && u[1] <= 0.0f && u[1] > -1e-30f) << u[1]; // -90 · e^-90
    EXPECT_EQ(u[2], 90.0f);
    EXPECT_EQ(u[3], 1000.0f);
}

// The value of a ∘ b at every output element by explicit NumPy index arithmetic, independent of the layouts.
std::vector<double> broadcast_reference(const Tensor& a, const Tensor& b, const Shape& out_shape,
                                        double (*function)(double, double)) {
    const std::vector<double> a_values = a.to_vector<double>(), b_values = b.to_vector<double>();
    const size_t rank = out_shape.size();
    std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)));
    std::vector<int64_t> index(rank, 0);
    auto offset_in = [&](const Shape& shape) {
        int64_t offset = 0;
        for (size_t axis = 0; axis < shape.size(); ++axis) {
            const int64_t position = shape[axis] == 1 ? 0 : index[axis + rank - shape.size()];
            offset = offset * shape[axis] + position;
        }
        return offset;
    };
    for (size_t flat = 0; flat < out.size(); ++flat) {
        int64_t remainder = static_cast<int64_t>(flat);
        for (size_t axis = rank; axis-- > 0;) {
            index[axis] = remainder % out_shape[axis];
            remainder /= out_shape[axis];
        }
        out[flat] = function(a_values[static_cast<size_t>(offset_in(a.shape()))],
                             b_values[static_cast<size_t>(offset_in(b.shape()))]);
    }
    return out;
}

struct BinaryCase {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*reference)(double, double);
};
const BinaryCase binary_cases[] = {
    {"add", add, [](double x, double y) { return x + y; }},
    {"sub", sub, [](double x, double y) { return x - y; }},
    {"mul", mul, [](double x, double y) { return x * y; }},
    {"div", div, [](double x, double y) { return x / y; }},
};

struct ShapePair {
    Shape a, b, out;
};
const ShapePair shape_pairs[] = {
    {{3, 4}, {3, 4}, {3, 4}},             // equal shapes (add: the residual kernels)
    {{2, 3, 5}, {5}, {2, 3, 5}},          // a bias over rows
    {{5}, {2, 3, 5}, {2, 3, 5}},          // the broadcast operand first
    {{2, 3, 1}, {2, 3, 4}, {2, 3, 4}},    // a row-wise scale (the innermost dimension summed)
    {{3, 1, 4}, {1, 5, 1}, {3, 5, 4}},    // both operands broadcast, alternating
    {{1}, {2, 3}, {2, 3}},                // a one-element tensor
    {{2, 1, 3, 1}, {4, 1, 5}, {2, 4, 3, 5}}, // ranks differ, alternating dimensions
};

TEST_F(PointwiseGradcheck, BroadcastingArithmeticMatchesFiniteDifferencesAndIndexArithmetic) {
    for (const BinaryCase& binary : binary_cases) {
        for (const ShapePair& shapes : shape_pairs) {
            SCOPED_TRACE(std::string(binary.name) + " " + shape_string(shapes.a) + " " + shape_string(shapes.b));
            Tensor a = random_leaf(generator, shapes.a), b = random_leaf(generator, shapes.b);
            if (std::string(binary.name) == "div") { // divisors away from 0
                double* values = b.data<double>();
                for (int64_t i = 0; i < b.numel(); ++i) values[i] = (values[i] < 0 ? -1.0 : 1.0) * (std::fabs(values[i]) + 0.5);
            }
            Tensor weights = random_tensor(generator, {shape_numel(shapes.out)});
            EXPECT_GRADCHECK(gradcheck([&] { return weighted_sum(binary.op(a, b), weights); }, {a, b}));
            NoGradGuard no_grad;
            const Tensor out = binary.op(a, b);
            EXPECT_EQ(out.shape(), shapes.out);
            const std::vector<double> expected = broadcast_reference(a, b, shapes.out, binary.reference);
            EXPECT_EQ(out.to_vector<double>(), expected); // one IEEE operation per element: exact
        }
    }
}

TEST_F(PointwiseGradcheck, AnOperandUsedTwiceGetsBothContributions) {
    Tensor a = random_leaf(generator, {4, 3}), row = random_leaf(generator, {3});
    keep_away_from_zero(row, 0.5); // it divides below: near 0 the finite difference's truncation error grows as 1/x^4
    Tensor weights = random_tensor(generator, {12});
    EXPECT_GRADCHECK(gradcheck([&] { return weighted_sum(mul(a, a), weights); }, {a}));
    EXPECT_GRADCHECK(gradcheck([&] { return weighted_sum(div(add(a, row), mul(row, row)), weights); }, {a, row}));
    EXPECT_GRADCHECK(gradcheck([&] { return weighted_sum(sub(row, add(a, row)), weights); }, {a, row}));
}

TEST_F(PointwiseGradcheck, OnlyOperandsThatRequireGradReceiveOne) {
    Tensor a = random_leaf(generator, {2, 3});
    Tensor constant = random_tensor(generator, {3});
    backward(sum(mul(a, constant)));
    const std::vector<double> c = constant.to_vector<double>(), g = a.grad().to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], c[i % 3]);
    EXPECT_FALSE(constant.grad().defined());
}

TEST_F(PointwiseGradcheck, Float32AndBfloat16RunTheSameFormulas) {
    NoGradGuard no_grad;
    Tensor a = random_tensor(generator, {5, 6}, DType::f32), b = random_tensor(generator, {6}, DType::f32);
    const std::vector<float> a_values = a.to_vector<float>(), b_values = b.to_vector<float>();
    const std::vector<float> product = mul(a, b).to_vector<float>();
    for (size_t i = 0; i < product.size(); ++i) EXPECT_EQ(product[i], a_values[i] * b_values[i % 6]);
    const Tensor a16 = cast(a, DType::bf16), b16 = cast(b, DType::bf16);
    const Tensor sum16 = add(a16, b16);
    EXPECT_EQ(sum16.dtype(), DType::bf16);
    const std::vector<float> a_rounded = cast(a16, DType::f32).to_vector<float>(),
                             b_rounded = cast(b16, DType::f32).to_vector<float>(),
                             result = cast(sum16, DType::f32).to_vector<float>();
    for (size_t i = 0; i < result.size(); ++i)
        EXPECT_EQ(result[i], to_float(to_bfloat16(a_rounded[i] + b_rounded[i % 6]))); // one rounding of the f32 sum
    const std::vector<float> exps = cast(engine::exp(a16), DType::f32).to_vector<float>();
    for (size_t i = 0; i < exps.size(); ++i) EXPECT_EQ(exps[i], to_float(to_bfloat16(std::exp(a_rounded[i]))));
}

TEST_F(PointwiseGradcheck, BadInputsNameTheOpAndTheShapes) {
    Tensor a = random_tensor(generator, {2, 3}), b = random_tensor(generator, {4, 3});
    expect_error([&] { mul(a, b); }, {"mul", "(2,3)", "(4,3)", "broadcast"});
    expect_error([&] { add(a, random_tensor(generator, {3, 2})); }, {"add", "(2,3)", "(3,2)"});
    expect_error([&] { div(a, random_tensor(generator, {3}, DType::f32)); }, {"div", "dtype"});
    Tensor ids = Tensor::zeros({3}, DType::i32, Device::cpu);
    expect_error([&] { relu(ids); }, {"relu", "i32"});
    expect_error([&] { sub(ids, ids); }, {"sub", "i32"});
}

TEST_F(PointwiseGradcheck, EmptyTensorsGiveEmptyResults) {
    Tensor a = random_leaf(generator, {0, 3}), b = random_leaf(generator, {3});
    Tensor out = mul(a, b);
    EXPECT_EQ(out.shape(), (Shape{0, 3}));
    backward(sum(out));
    EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, 0.0}));
}

} // namespace
} // namespace engine::testing
