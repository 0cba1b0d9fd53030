// Central finite differences in float64 against the tape's analytic gradients. Shared by op and model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace engine::testing {

// A fresh generator per test, seeded from the OS and printed, so failures can be replayed.
inline std::mt19937_64 fresh_generator() {
    const uint64_t seed = std::random_device{}();
    ::testing::Test::RecordProperty("random_seed", std::to_string(seed));
    std::printf("[ random seed %llu ]\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
}

// A test that starts and ends on an empty tape, with a fresh generator whose seed it prints: the fixture of the
// op, trainer and checkpoint suites (class OpGradcheck : public TapeTest {};).
class TapeTest : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }
    void TearDown() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
};

inline Tensor random_tensor(std::mt19937_64& generator, const Shape& shape, DType dtype = DType::f64,
                            double scale = 1.0, Device device = Device::cpu) {
    std::normal_distribution<double> normal(0.0, scale);
    std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
    for (double& value : values) value = normal(generator);
    if (dtype == DType::f64) return Tensor::from_vector<double>(values, shape, device);
    std::vector<float> narrowed(values.begin(), values.end());
    return Tensor::from_vector<float>(narrowed, shape, device);
}

inline Tensor random_leaf(std::mt19937_64& generator, const Shape& shape, double scale = 1.0) {
    Tensor tensor = random_tensor(generator, shape, DType::f64, scale);
    tensor.set_requires_grad(true);
    return tensor;
}

// loss = Σ out_i · w_i with fixed random w, so that every output element's gradient path is exercised.
inline Tensor weighted_sum(const Tensor& out, const Tensor& weights) {
    return matmul(out.reshape({1, out.numel()}), weights.reshape({weights.numel(), 1}));
}

struct GradcheckResult {
    double max_relative_error = 0.0;
    std::string worst;
};

// Compares d loss / d input for every element of every input in `inputs` (f64 leaves that require grad).
// Relative error per element: |analytic − numeric| / max(|numeric|, floor). The floor keeps elements whose
// true gradient is ~0 (e.g. masked keys) from dividing rounding noise by zero.
inline GradcheckResult gradcheck(const std::function<Tensor()>& loss_function, const std::vector<Tensor>& inputs,
                                 double step = 1e-5, double floor = 1e-3) {
    zero_grad(inputs);
    Tensor loss = loss_function();
    backward(loss);
    GradcheckResult result;
    NoGradGuard no_grad;
    for (size_t which = 0; which < inputs.size(); ++which) {
        const Tensor& input = inputs[which];
        const std::vector<double> analytic = input.grad().to_vector<double>();
        double* values = input.data<double>();
        for (int64_t index = 0; index < input.numel(); ++index) {
            const double original = values[index];
            values[index] = original + step;
            const double plus = loss_function().item();
            values[index] = original - step;
            const double minus = loss_function().item();
            values[index] = original;
            const double numeric = (plus - minus) / (2.0 * step);
            const double error = std::fabs(analytic[index] - numeric) / std::max(std::fabs(numeric), floor);
            if (error > result.max_relative_error) {
                result.max_relative_error = error;
                result.worst = "input " + std::to_string(which) + " element " + std::to_string(index) +
                               ": analytic " + std::to_string(analytic[index]) + " numeric " + std::to_string(numeric);
            }
        }
    }
    return result;
}

// The op gradchecks' bound on the max relative error. Central differences with step 1e-5 in f64 carry a
// truncation error of about h²·f'''/6 ~ 1e-10 relative and a rounding error of about u/h ~ 1e-11; 1e-6 leaves
// four orders of margin above both while any wrong term of a backward (a missing factor, a transposed index)
// shows as an error of order 1.
inline constexpr double gradcheck_tolerance = 1e-6;

// One gradcheck's verdict: prints the measured error (with `what`, when given) and expects it within
// `tolerance`, naming the worst element. Use EXPECT_GRADCHECK, which reports the caller's line.
inline void expect_gradcheck(const GradcheckResult& result, const std::string& what,
                             double tolerance = gradcheck_tolerance) {
    std::printf("[ measured ] %s: max relative error %.3g\n", what.empty() ? "gradcheck" : what.c_str(),
                result.max_relative_error);
    EXPECT_LE(result.max_relative_error, tolerance) << what << " worst: " << result.worst;
}

} // namespace engine::testing

// EXPECT_GRADCHECK(result) or EXPECT_GRADCHECK(result, what): the result within gradcheck_tolerance.
#define EXPECT_GRADCHECK(result, ...)                                                                      \
    do {                                                                                                   \
        SCOPED_TRACE("EXPECT_GRADCHECK");                                                                  \
        ::engine::testing::expect_gradcheck((result), std::string(__VA_ARGS__));                           \
    } while (0)
