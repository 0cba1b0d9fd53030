// The reductions family (engine/ops/reductions.h) on the CPU: float64 central finite differences for every op
// over every dimension (negative ones and the middle of a 3-D tensor, keepdim both ways), values against
// independent float64 loops, the max's tie rule, dtypes, and bad input named in the error.
#include <cmath>
#include <numeric>

#include "engine/ops/dimensions.h"
#include "expect_error.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

class ReductionsGradcheck : public TapeTest {};

const Shape cube = {3, 4, 5};
const std::vector<int64_t> every_dimension = {0, 1, 2, -1, -2, -3};

// Element (o, i, n) of a (outer, size, inner) view, the layout every independent loop below reads.
double at(const std::vector<double>& values, const engine::detail::AroundDimension& split, int64_t o, int64_t i, int64_t n) {
    return values[static_cast<size_t>((o * split.size + i) * split.inner + n)];
}

engine::detail::AroundDimension split_of(const Shape& shape, int64_t dim) {
    return engine::detail::around_dimension(shape, engine::detail::normalize_dimension("test", dim, shape));
}

TEST_F(ReductionsGradcheck, SoftmaxAndLogSoftmaxOverEveryDimension) {
    Tensor input = random_leaf(generator, cube, 2.0);
    Tensor weights = random_tensor(generator, {shape_numel(cube)});
    for (const int64_t dim : every_dimension) {
        const std::string what = "dim " + std::to_string(dim);
        auto plain = gradcheck([&] { return weighted_sum(softmax(input, dim), weights); }, {input});
        EXPECT_GRADCHECK(plain, "softmax " + what);
        auto logarithm = gradcheck([&] { return weighted_sum(log_softmax(input, dim), weights); }, {input});
        EXPECT_GRADCHECK(logarithm, "log_softmax " + what);
    }
}

// Against exp(x) / sum(exp(x)) computed here in float64 without the max shift (inputs are small enough):
// both are float64 with ~size roundings, so 1e-14 relative; rows of softmax sum to 1 to the same bound, and
// log_softmax is log(softmax).
TEST_F(ReductionsGradcheck, SoftmaxValuesAgainstFloat64) {
    NoGradGuard no_grad;
    Tensor input = random_tensor(generator, cube, DType::f64, 3.0);
    const std::vector<double> x = input.to_vector<double>();
    for (const int64_t dim : every_dimension) {
        const auto split = split_of(cube, dim);
        const std::vector<double> y = softmax(input, dim).to_vector<double>();
        const std::vector<double> log_y = log_softmax(input, dim).to_vector<double>();
        double worst = 0.0, worst_row_sum = 0.0, worst_log = 0.0;
        for (int64_t o = 0; o < split.outer; ++o) {
            for (int64_t n = 0; n < split.inner; ++n) {
                double total = 0.0, row_sum = 0.0;
                for (int64_t i = 0; i < split.size; ++i) total += std::exp(at(x, split, o, i, n));
                for (int64_t i = 0; i < split.size; ++i) {
                    const double expected = std::exp(at(x, split, o, i, n)) / total;
                    worst = std::max(worst, std::fabs(at(y, split, o, i, n) - expected) / expected);
                    worst_log = std::max(worst_log, std::fabs(at(log_y, split, o, i, n) - std::log(expected)));
                    row_sum += at(y, split, o, i, n);
                }
                worst_row_sum = std::max(worst_row_sum, std::fabs(row_sum - 1.0));
            }
        }
        EXPECT_LE(worst, 1e-14) << "dim " << dim;
        EXPECT_LE(worst_row_sum, 1e-14) << "dim " << dim;
        EXPECT_LE(worst_log, 1e-13) << "dim " << dim; // absolute: |log y| is at most ~20 here
    }
}

// A large logit must not overflow: softmax([1000, 0]) = [1, e^-1000] with the max subtracted.
TEST_F(ReductionsGradcheck, SoftmaxIsStableForLargeInputs) {
    NoGradGuard no_grad;
    Tensor input = Tensor::from_vector<float>({1000.0f, 0.0f, -1000.0f, 999.0f}, {1, 4}, Device::cpu);
    const auto y = softmax(input, 1).to_vector<float>();
    const auto log_y = log_softmax(input, -1).to_vector<float>();
    for (const float value : y) EXPECT_TRUE(std::isfinite(value));
    EXPECT_NEAR(y[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
    // (x - max) - log(sum) rounds at the scale of the result: a few float ulps of it (2^-23 at 1.3, 2^-13 at 2000).
    EXPECT_NEAR(log_y[3], -1.0 - std::log1p(std::exp(-1.0)), 4 * std::ldexp(1.0, -23));
    EXPECT_NEAR(log_y[2], -2000.0 - std::log1p(std::exp(-1.0)), 4 * std::ldexp(1.0, -13));
}

TEST_F(ReductionsGradcheck, SumMeanMaxOverEveryDimensionBothKeepdims) {
    // Distinct values at least 0.01 apart (a random permutation of a grid, plus noise below 0.005): far above
    // the 1e-5 step, so max's argmax never moves under the finite difference along any dimension.
    Tensor input = random_leaf(generator, cube);
    {
        double* values = input.data<double>();
        std::vector<int64_t> order(static_cast<size_t>(input.numel()));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), generator);
        std::uniform_real_distribution<double> noise(0.0, 0.005);
        for (size_t i = 0; i < order.size(); ++i) values[i] = 0.01 * double(order[i]) - 0.3 + noise(generator);
    }
    for (const int64_t dim : every_dimension) {
        for (const bool keepdim : {false, true}) {
            const std::string what = "dim " + std::to_string(dim) + (keepdim ? " keepdim" : "");
            Shape expected_shape = cube;
            const int64_t axis = dim < 0 ? dim + 3 : dim;
            if (keepdim) expected_shape[static_cast<size_t>(axis)] = 1;
            else expected_shape.erase(expected_shape.begin() + axis);
            Tensor weights = random_tensor(generator, {shape_numel(expected_shape)});
            {
                NoGradGuard no_grad;
                EXPECT_EQ(sum(input, dim, keepdim).shape(), expected_shape) << what;
                EXPECT_EQ(mean(input, dim, keepdim).shape(), expected_shape) << what;
                EXPECT_EQ(max(input, dim, keepdim).shape(), expected_shape) << what;
            }
            auto summed = gradcheck([&] { return weighted_sum(sum(input, dim, keepdim), weights); }, {input});
            EXPECT_GRADCHECK(summed, "sum " + what);
            auto averaged = gradcheck([&] { return weighted_sum(mean(input, dim, keepdim), weights); }, {input});
            EXPECT_GRADCHECK(averaged, "mean " + what);
            auto maximum = gradcheck([&] { return weighted_sum(max(input, dim, keepdim), weights); }, {input});
            EXPECT_GRADCHECK(maximum, "max " + what);
        }
    }
}

// Against loops here: sum and mean in float64 (1e-15 relative: a handful of roundings on O(1) values), max exact.
TEST_F(ReductionsGradcheck, SumMeanMaxValuesAgainstFloat64) {
    NoGradGuard no_grad;
    Tensor input = random_tensor(generator, cube);
    const std::vector<double> x = input.to_vector<double>();
    for (const int64_t dim : every_dimension) {
        const auto split = split_of(cube, dim);
        const auto sums = sum(input, dim).to_vector<double>();
        const auto means = mean(input, dim, true).to_vector<double>();
        const auto maxima = max(input, dim).to_vector<double>();
        for (int64_t o = 0; o < split.outer; ++o) {
            for (int64_t n = 0; n < split.inner; ++n) {
                double total = 0.0, best = -INFINITY;
                for (int64_t i = 0; i < split.size; ++i) {
                    total += at(x, split, o, i, n);
                    best = std::max(best, at(x, split, o, i, n));
                }
                const size_t index = static_cast<size_t>(o * split.inner + n);
                EXPECT_NEAR(sums[index], total, 1e-15 * split.size * 4) << "dim " << dim;
                EXPECT_NEAR(means[index], total / split.size, 1e-15 * 4) << "dim " << dim;
                EXPECT_EQ(maxima[index], best) << "dim " << dim;
            }
        }
    }
}

// Ties: the whole gradient goes to the first index attaining the max, in every layout (inner 1 and > 1).
TEST_F(ReductionsGradcheck, MaxGradientGoesToTheFirstOfTies) {
    // (2,3,2): along dim 1, column (0,*,0) is [5,5,1], (0,*,1) [2,7,7], (1,*,0) [4,4,4], (1,*,1) [-1,0,-1].
    const std::vector<double> values = {5, 2, 5, 7, 1, 7, 4, -1, 4, 0, 4, -1};
    Tensor input = Tensor::from_vector<double>(values, {2, 3, 2}, Device::cpu);
    input.set_requires_grad(true);
    zero_grad({input});
    backward(sum(max(input, 1)));
    const std::vector<double> expected_1 = {1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0};
    EXPECT_EQ(input.grad().to_vector<double>(), expected_1);
    // Along the last dimension (inner 1): rows [3,3,3] (all tied) and [1,3,3].
    Tensor flat = Tensor::from_vector<double>({3, 3, 3, 1, 3, 3}, {2, 3}, Device::cpu);
    flat.set_requires_grad(true);
    zero_grad({flat});
    backward(sum(max(flat, -1)));
    EXPECT_EQ(flat.grad().to_vector<double>(), (std::vector<double>{1, 0, 0, 0, 1, 0}));
}

TEST_F(ReductionsGradcheck, MseLossEveryReductionWithAndWithoutTargetGradient) {
    Tensor input = random_leaf(generator, cube);
    Tensor target = random_leaf(generator, cube);
    Tensor fixed_target = random_tensor(generator, cube);
    Tensor weights = random_tensor(generator, {shape_numel(cube)});
    Tensor one_weight = random_tensor(generator, {1});
    for (const Reduction reduction : {Reduction::none, Reduction::sum, Reduction::mean}) {
        const std::string what = "reduction " + std::to_string(static_cast<int>(reduction));
        const Tensor& w = reduction == Reduction::none ? weights : one_weight;
        auto both = gradcheck([&] { return weighted_sum(mse_loss(input, target, reduction), w); }, {input, target});
        EXPECT_GRADCHECK(both, what);
        auto input_only =
            gradcheck([&] { return weighted_sum(mse_loss(input, fixed_target, reduction), w); }, {input});
        EXPECT_GRADCHECK(input_only, what + " fixed target");
    }
    NoGradGuard no_grad;
    const auto x = input.to_vector<double>(), t = target.to_vector<double>();
    double total = 0.0;
    for (size_t i = 0; i < x.size(); ++i) total += (x[i] - t[i]) * (x[i] - t[i]);
    EXPECT_NEAR(mse_loss(input, target).item(), total / x.size(), 1e-15 * 4);
    EXPECT_NEAR(mse_loss(input, target, Reduction::sum).item(), total, 1e-15 * 4 * x.size());
    EXPECT_EQ(mse_loss(input, target, Reduction::none).shape(), cube);
}

TEST_F(ReductionsGradcheck, RmsNorm) {
    Tensor input = random_leaf(generator, {3, 7, 12}, 2.0);
    Tensor weight = random_leaf(generator, {12});
    Tensor weights = random_tensor(generator, {3 * 7 * 12});
    for (const double eps : {1e-6, 0.5}) {
        auto result = gradcheck([&] { return weighted_sum(rms_norm(input, weight, eps), weights); }, {input, weight});
        EXPECT_GRADCHECK(result, "eps " + std::to_string(eps));
    }
    // Values: x / sqrt(mean(x^2) + eps) * w, here in float64 (a few roundings: 1e-14 relative to max |y|).
    NoGradGuard no_grad;
    const auto x = input.to_vector<double>(), w = weight.to_vector<double>();
    const auto y = rms_norm(input, weight).to_vector<double>();
    double worst = 0.0;
    for (int row = 0; row < 21; ++row) {
        double squares = 0.0;
        for (int c = 0; c < 12; ++c) squares += x[row * 12 + c] * x[row * 12 + c];
        const double scale = 1.0 / std::sqrt(squares / 12 + 1e-6);
        for (int c = 0; c < 12; ++c)
            worst = std::max(worst, std::fabs(y[row * 12 + c] - x[row * 12 + c] * scale * w[c]));
    }
    EXPECT_LE(worst, 1e-14);
}

// bf16 in, bf16 out for the dimension reductions and the elementwise loss; the reduced loss is f32 (as sum and
// cross_entropy); rms_norm's weight gradient is an f32 parameter gradient.
TEST_F(ReductionsGradcheck, Dtypes) {
    Tensor input = cast(random_tensor(generator, cube, DType::f32), DType::bf16);
    Tensor target = cast(random_tensor(generator, cube, DType::f32), DType::bf16);
    NoGradGuard no_grad;
    EXPECT_EQ(softmax(input, 1).dtype(), DType::bf16);
    EXPECT_EQ(log_softmax(input, 1).dtype(), DType::bf16);
    EXPECT_EQ(sum(input, 1).dtype(), DType::bf16);
    EXPECT_EQ(mean(input, -1, true).dtype(), DType::bf16);
    EXPECT_EQ(max(input, 0).dtype(), DType::bf16);
    EXPECT_EQ(mse_loss(input, target, Reduction::none).dtype(), DType::bf16);
    EXPECT_EQ(mse_loss(input, target).dtype(), DType::f32);
    Tensor weight = cast(random_tensor(generator, {5}, DType::f32), DType::bf16);
    EXPECT_EQ(rms_norm(input, weight).dtype(), DType::bf16);
    // The full sum keeps its old contract: shape (1) in compute_dtype.
    EXPECT_EQ(sum(input).shape(), Shape({1}));
    EXPECT_EQ(sum(input).dtype(), DType::f32);
    // A rank-1 input reduced without keepdim gives (1), as the full sum does.
    EXPECT_EQ(sum(random_tensor(generator, {6}), 0).shape(), Shape({1}));
}

TEST_F(ReductionsGradcheck, BadInputIsNamed) {
    Tensor input = random_tensor(generator, cube, DType::f32);
    expect_error([&] { softmax(input, 3); }, {"softmax", "dimension 3", "(3,4,5)"});
    expect_error([&] { log_softmax(input, -4); }, {"log_softmax", "dimension -4", "(3,4,5)"});
    expect_error([&] { sum(input, 5, true); }, {"sum", "dimension 5", "(3,4,5)"});
    expect_error([&] { mean(input, -9); }, {"mean", "dimension -9", "(3,4,5)"});
    expect_error([&] { max(input, 3); }, {"max", "dimension 3", "(3,4,5)"});
    Tensor ids = Tensor::zeros({2, 3}, DType::i32, Device::cpu);
    expect_error([&] { softmax(ids, 0); }, {"softmax", "(2,3)", "i32", "floating"});
    expect_error([&] { sum(ids, 0); }, {"sum", "(2,3)", "i32"});
    expect_error([&] { max(Tensor::zeros({2, 0, 3}, DType::f32, Device::cpu), 1); }, {"max", "(2,0,3)", "empty"});
    Tensor other = random_tensor(generator, {3, 5, 4}, DType::f32);
    expect_error([&] { mse_loss(input, other); }, {"mse_loss", "(3,4,5)", "(3,5,4)", "same shape"});
    expect_error([&] { mse_loss(input, random_tensor(generator, cube, DType::f64)); }, {"mse_loss", "f32", "f64"});
    expect_error([&] { mse_loss(Tensor::zeros({0}, DType::f32, Device::cpu), Tensor::zeros({0}, DType::f32, Device::cpu)); },
                 {"mse_loss", "(0)", "empty"});
    expect_error([&] { rms_norm(input, random_tensor(generator, {4}, DType::f32)); }, {"rms_norm", "weight", "(4)", "(5)"});
    expect_error([&] { rms_norm(input, random_tensor(generator, {5}, DType::f64)); }, {"rms_norm", "f32", "f64"});
    expect_error([&] { rms_norm(input, random_tensor(generator, {5}, DType::f32), -1.0); }, {"rms_norm", "eps"});
    expect_error([&] { rms_norm(Tensor::zeros({2, 0}, DType::f32, Device::cpu), Tensor::zeros({0}, DType::f32, Device::cpu)); },
                 {"rms_norm", "(2,0)", "no channels"});
}

} // namespace
} // namespace engine::testing
