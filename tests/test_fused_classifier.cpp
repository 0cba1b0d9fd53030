// cross_entropy_in_place, the fused classifier: its gradients against plain cross_entropy and central finite
// differences in float64, with ignored rows, sum and mean, an unexpected upstream gradient, shared logits,
// no-grad mode, bad input, and the padded-columns contract of its CPU kernel.
#include <cmath>

#include "expect_error.h"
#include "gradcheck.h"
#include "kernels/cpu/cpu_kernels.h"

namespace engine::testing {
namespace {

constexpr int rows = 10, width = 6, vocabulary = 13;

class FusedClassifier : public ::testing::Test {
protected:
    void SetUp() override {
        current_tape().clear();
        std::vector<int32_t> labels(rows);
        std::uniform_int_distribution<int32_t> label(0, vocabulary - 1);
        for (int32_t& value : labels) value = label(generator);
        labels[2] = labels[7] = default_ignore_index;
        targets = Tensor::from_vector<int32_t>(labels, {2, rows / 2}, Device::cpu);
    }

    // logits (2,5,V) = x (2,5,C) · wᵀ: an op output with storage of its own, so overwriting it leaves the
    // leaves intact, as in the model (the LM head's matmul).
    Tensor logits_of(const Tensor& x, const Tensor& w) { return matmul(x, w, true); }

    struct Gradients {
        double loss = 0.0;
        std::vector<double> dx, dw;
    };
    // Runs `loss_of(logits)` → backward from fresh copies of the leaves and returns their gradients.
    Gradients gradients_of(const std::function<Tensor(const Tensor&)>& loss_of) {
        zero_grad({x, w});
        Tensor loss;
        {
            const Tensor logits = logits_of(x, w);
            loss = loss_of(logits);
        }
        const double value = loss.item();
        backward(loss);
        return Gradients{value, x.grad().to_vector<double>(), w.grad().to_vector<double>()};
    }

    std::mt19937_64 generator = fresh_generator();
    Tensor x = random_leaf(generator, {2, rows / 2, width});
    Tensor w = random_leaf(generator, {vocabulary, width}, 0.7);
    Tensor targets;
};

void expect_near_all(const std::vector<double>& actual, const std::vector<double>& expected, double tolerance,
                     const char* what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    for (size_t i = 0; i < actual.size(); ++i)
        EXPECT_NEAR(actual[i], expected[i], tolerance * (1.0 + std::fabs(expected[i]))) << what << " element " << i;
}

// With the upstream gradient it was told to expect, the fused path is bitwise the plain one: the same
// expression in the same precision, written instead of added to zeros.
TEST_F(FusedClassifier, MatchesPlainCrossEntropyBitwiseForSumAndMean) {
    for (const Reduction reduction : {Reduction::sum, Reduction::mean}) {
        const double factor = 1.0 / 7.0; // as the trainer's 1 / num_items_in_batch
        const Gradients plain =
            gradients_of([&](const Tensor& logits) { return multiply(cross_entropy(logits, targets, reduction), factor); });
        const Gradients fused = gradients_of([&](const Tensor& logits) {
            return multiply(cross_entropy_in_place(logits, targets, reduction, factor), factor);
        });
        EXPECT_EQ(fused.loss, plain.loss);
        EXPECT_EQ(fused.dx, plain.dx) << (reduction == Reduction::sum ? "sum" : "mean");
        EXPECT_EQ(fused.dw, plain.dw) << (reduction == Reduction::sum ? "sum" : "mean");
    }
}

// An upstream gradient other than the expected one (0.37 · 2 here, expected 1) is corrected in backward.
TEST_F(FusedClassifier, RescalesWhenTheUpstreamGradientDiffersFromTheExpectedOne) {
    for (const Reduction reduction : {Reduction::sum, Reduction::mean}) {
        const auto loss_of = [&](bool fused) {
            return [&, fused](const Tensor& logits) {
                const Tensor loss = fused ? cross_entropy_in_place(logits, targets, reduction, 1.0)
                                          : cross_entropy(logits, targets, reduction);
                return multiply(add(loss, loss), 0.37); // the op's output gets two contributions: 0.74
            };
        };
        const Gradients plain = gradients_of(loss_of(false));
        const Gradients fused = gradients_of(loss_of(true));
        EXPECT_DOUBLE_EQ(fused.loss, plain.loss);
        expect_near_all(fused.dx, plain.dx, 1e-14, "dx");
        expect_near_all(fused.dw, plain.dw, 1e-14, "dw");
    }
}

// The finite-difference oracle. gradcheck's numeric evaluations run under NoGradGuard, where the op leaves
// the logits intact; its analytic pass runs the fused, in-place path.
TEST_F(FusedClassifier, GradientsMatchCentralFiniteDifferences) {
    for (const Reduction reduction : {Reduction::sum, Reduction::mean}) {
        for (const double upstream : {0.25, -1.7}) {
            const auto result = gradcheck(
                [&] { return multiply(cross_entropy_in_place(logits_of(x, w), targets, reduction, 0.25), upstream); },
                {x, w});
            EXPECT_LE(result.max_relative_error, 1e-6) << "upstream " << upstream << ", worst: " << result.worst;
        }
    }
}

// Two consumers of the logits: whichever backward runs first, the gradients add up. Consumer recorded
// before the fused op: its backward runs after, and adds into the adopted buffer. Recorded after: its
// gradient exists first, and the fused op adds into it (the fallback). multiply's backward reads no logits,
// so sharing is legal; the late multiply's forward value reads the gradient, so only gradients are compared.
TEST_F(FusedClassifier, SharedLogitsAddBothGradientsInEitherOrder) {
    const auto reference = gradients_of([&](const Tensor& logits) {
        return add(cross_entropy(logits, targets, Reduction::sum), sum(multiply(logits, 0.5)));
    });
    const auto before = gradients_of([&](const Tensor& logits) {
        const Tensor other = sum(multiply(logits, 0.5));
        return add(cross_entropy_in_place(logits, targets, Reduction::sum), other);
    });
    expect_near_all(before.dx, reference.dx, 1e-14, "consumer before: dx");
    expect_near_all(before.dw, reference.dw, 1e-14, "consumer before: dw");
    EXPECT_DOUBLE_EQ(before.loss, reference.loss);
    const auto after = gradients_of([&](const Tensor& logits) {
        const Tensor loss = cross_entropy_in_place(logits, targets, Reduction::sum);
        return add(loss, sum(multiply(logits, 0.5)));
    });
    expect_near_all(after.dx, reference.dx, 1e-14, "consumer after: dx");
    expect_near_all(after.dw, reference.dw, 1e-14, "consumer after: dw");
}

// A leaf's persistent gradient buffer already exists: the fused gradient is added to it (twice, without
// zero_grad, gives twice the plain gradient).
TEST_F(FusedClassifier, LeafLogitsAccumulateIntoTheirPersistentGradient) {
    Tensor reference_logits = random_leaf(generator, {2, rows / 2, vocabulary});
    backward(multiply(cross_entropy(reference_logits, targets, Reduction::mean), 3.0));
    std::vector<double> expected = reference_logits.grad().to_vector<double>();
    for (double& value : expected) value *= 2.0;
    Tensor logits = random_leaf(generator, {2, rows / 2, vocabulary});
    for (int repeat = 0; repeat < 2; ++repeat) {
        logits.copy_from(reference_logits.detach()); // the fused op overwrote them: restore the values
        backward(multiply(cross_entropy_in_place(logits, targets, Reduction::mean, 3.0), 3.0));
    }
    expect_near_all(logits.grad().to_vector<double>(), expected, 1e-14, "leaf gradient");
}

// Without a node to take the gradient, the logits are not touched.
TEST_F(FusedClassifier, NoGradAndLogitsWithoutGradKeepTheLogits) {
    const Tensor logits = random_tensor(generator, {2, rows / 2, vocabulary});
    const std::vector<double> original = logits.to_vector<double>();
    const double plain = cross_entropy(logits, targets, Reduction::mean).item();
    EXPECT_EQ(cross_entropy_in_place(logits, targets, Reduction::mean).item(), plain);
    EXPECT_EQ(logits.to_vector<double>(), original);
    Tensor leaf = random_leaf(generator, {2, rows / 2, vocabulary});
    const std::vector<double> leaf_values = leaf.to_vector<double>();
    {
        NoGradGuard no_grad;
        EXPECT_EQ(cross_entropy_in_place(leaf, targets, Reduction::sum).item(),
                  cross_entropy(leaf, targets, Reduction::sum).item());
    }
    EXPECT_EQ(leaf.to_vector<double>(), leaf_values);
    EXPECT_TRUE(current_tape().empty());
}

TEST_F(FusedClassifier, BadInputIsRejectedAndChangesNothing) {
    Tensor logits = random_leaf(generator, {2, rows / 2, vocabulary});
    const std::vector<double> original = logits.to_vector<double>();
    expect_error([&] { cross_entropy_in_place(logits, targets, Reduction::none); },
                 {"cross_entropy_in_place", "reduction none"});
    expect_error([&] { cross_entropy_in_place(logits, targets, Reduction::sum, 0.0); },
                 {"cross_entropy_in_place", "expected_output_gradient 0"});
    const Tensor single = Tensor::from_vector<float>(std::vector<float>(rows * vocabulary, 0.5f), {2, rows / 2, vocabulary},
                                                     Device::cpu);
    expect_error([&] { cross_entropy_in_place(single, targets, Reduction::sum, 1e-50); },
                 {"cross_entropy_in_place", "no normal float"});
    const Tensor bad = Tensor::from_vector<int32_t>(std::vector<int32_t>(rows, vocabulary), {2, rows / 2}, Device::cpu);
    expect_error([&] { cross_entropy_in_place(logits, bad, Reduction::sum); },
                 {"cross_entropy_in_place", "label 13", "ignore_index"});
    EXPECT_EQ(logits.to_vector<double>(), original);
    EXPECT_TRUE(current_tape().empty());
}

// The kernel's padded rows (the contract a vocabulary padded to a multiple of 128 relies on): the first V
// columns are the unpadded result, the padding and every column of an ignored row are 0.
TEST(FusedClassifierKernel, PaddedColumnsAreExcludedAndZeroed) {
    constexpr int N = 4, V = 7, padded_V = 12;
    std::mt19937_64 generator = fresh_generator();
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<double> unpadded(N * V), padded(N * padded_V, 123.0);
    for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) unpadded[n * V + v] = padded[n * padded_V + v] = normal(generator);
    const std::vector<int32_t> labels = {3, default_ignore_index, 0, 6};
    std::vector<double> unpadded_losses(N), padded_losses(N);
    kernels::cpu::cross_entropy_fused_forward<double>(unpadded_losses.data(), unpadded.data(), labels.data(), 0.5, N, V,
                                                      V, default_ignore_index);
    kernels::cpu::cross_entropy_fused_forward<double>(padded_losses.data(), padded.data(), labels.data(), 0.5, N, V,
                                                      padded_V, default_ignore_index);
    EXPECT_EQ(padded_losses, unpadded_losses);
    for (int n = 0; n < N; ++n) {
        for (int v = 0; v < padded_V; ++v) {
            const double expected = v < V && labels[n] != default_ignore_index ? unpadded[n * V + v] : 0.0;
            EXPECT_EQ(padded[n * padded_V + v], expected) << "row " << n << " column " << v;
        }
    }
}

} // namespace
} // namespace engine::testing
