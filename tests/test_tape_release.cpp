// The tape frees what no gradient can reach: forwards in grad mode whose results are dropped do not hold their
// saved tensors until the next backward, while everything a live tensor can reach stays and backpropagates as
// before (Tape::release_unreachable, docs/ARCHITECTURE.md "The tape").
#include "gradcheck.h"

namespace engine::testing {
namespace {

class TapeRelease : public ::testing::Test {
protected:
    void SetUp() override { current_tape().clear(); }
    void TearDown() override { current_tape().clear(); }
    std::mt19937_64 generator = fresh_generator();
    size_t activations() const { return memory_stats(Device::cpu).current(MemoryCategory::activations); }
};

// Five nodes, each saving a (64,32) f64 input or output: about 80 KiB per forward.
Tensor mlp(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return sum(silu(add(gelu(linear(x, weight)), bias)));
}

TEST_F(TapeRelease, RepeatedDroppedForwardsHoldABoundedTape) {
    Tensor weight = random_leaf(generator, {32, 32}, 0.2), bias = random_leaf(generator, {32});
    const Tensor x = random_tensor(generator, {64, 32});
    const size_t before = activations();
    size_t largest_tape = 0, largest_activations = 0;
    for (int iteration = 0; iteration < 200; ++iteration) {
        (void)mlp(x, weight, bias); // an "evaluation" forgotten in grad mode
        largest_tape = std::max(largest_tape, current_tape().size());
        largest_activations = std::max(largest_activations, activations() - before);
    }
    // Without the sweep: 1000 nodes and ~16 MiB. With it the tape never passes the first sweep point (64
    // nodes: every node is unreachable there, so the next sweep point stays 64).
    EXPECT_LE(largest_tape, 64u);
    const size_t per_forward = 5 * 64 * 32 * sizeof(double);
    EXPECT_LE(largest_activations, 14 * per_forward);
    current_tape().release_unreachable();
    EXPECT_EQ(current_tape().size(), 0u);
    EXPECT_EQ(activations(), before);
}

// A finished backward of a large graph puts the sweep point back: it does not delay later sweeps.
TEST_F(TapeRelease, ALargeBackwardDoesNotRaiseTheSweepPoint) {
    Tensor x = random_leaf(generator, {4, 4});
    Tensor y = x;
    for (int k = 0; k < 300; ++k) y = gelu(y); // 300 live nodes: sweeps find nothing, the point rises past 300
    backward(sum(y));
    y = Tensor();
    size_t largest_tape = 0;
    for (int iteration = 0; iteration < 100; ++iteration) {
        (void)gelu(x);
        largest_tape = std::max(largest_tape, current_tape().size());
    }
    EXPECT_LE(largest_tape, 64u);
}

TEST_F(TapeRelease, AChainOfDroppedNodesIsFreedInOneSweep) {
    Tensor x = random_leaf(generator, {16, 16});
    const size_t before = activations();
    {
        Tensor y = x;
        for (int k = 0; k < 10; ++k) y = gelu(y); // each node saves its input, the previous node's output
    }
    EXPECT_EQ(current_tape().size(), 10u);
    EXPECT_GT(activations(), before);
    EXPECT_EQ(current_tape().release_unreachable(), 10u);
    EXPECT_EQ(activations(), before);
}

TEST_F(TapeRelease, WhatALiveTensorReachesStaysAndBackpropagatesBitwise) {
    Tensor weight = random_leaf(generator, {32, 32}, 0.2), bias = random_leaf(generator, {32});
    const Tensor x = random_tensor(generator, {64, 32});
    backward(mlp(x, weight, bias));
    const std::vector<double> expected_weight = weight.grad().to_vector<double>();
    const std::vector<double> expected_bias = bias.grad().to_vector<double>();
    zero_grad({weight, bias});

    const Tensor kept = mlp(x, weight, bias); // its intermediates have no live handle, only the loss has
    for (int iteration = 0; iteration < 100; ++iteration) (void)mlp(x, weight, bias);
    current_tape().release_unreachable();
    EXPECT_EQ(current_tape().size(), 5u); // exactly the kept loss's graph
    backward(kept);
    EXPECT_EQ(weight.grad().to_vector<double>(), expected_weight);
    EXPECT_EQ(bias.grad().to_vector<double>(), expected_bias);
}

TEST_F(TapeRelease, AReshapeKeepsItsSourceNodeAlive) {
    Tensor x = random_leaf(generator, {4, 6});
    const Tensor weights = random_tensor(generator, {24});
    Tensor reshaped = gelu(x).reshape({6, 4}); // the gelu output's own handle is gone; the reshape shares its id
    EXPECT_EQ(current_tape().release_unreachable(), 0u);
    backward(weighted_sum(reshaped, weights));
    const std::vector<double> via_kept = x.grad().to_vector<double>();
    zero_grad({x});
    backward(weighted_sum(gelu(x).reshape({6, 4}), weights));
    EXPECT_EQ(via_kept, x.grad().to_vector<double>());
    const auto result = gradcheck([&] { return weighted_sum(gelu(x).reshape({6, 4}), weights); }, {x});
    EXPECT_LE(result.max_relative_error, 1e-6) << result.worst;
}

} // namespace
} // namespace engine::testing
