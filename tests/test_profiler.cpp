// The op profiler: exact kernel-call counts per op and phase for a known graph, times that are non-negative and
// fit inside the measured wall time, nothing recorded when off, nested regions counted once, and the trainer's
// grad_norm and optimizer phases.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/profiling.h"
#include "gradcheck.h"
#include "nn/gpt.h"
#include "optim/trainer.h"

namespace engine::testing {
namespace {

using profiling::Phase;

class Profiler : public ::testing::Test {
protected:
    // The profiler is process-wide: every test starts and ends with it off and empty, whatever ENGINE_PROFILE says.
    void SetUp() override {
        current_tape().clear();
        profiling::set_enabled(false);
        profiling::reset();
    }
    void TearDown() override {
        profiling::set_enabled(false);
        profiling::reset();
        current_tape().clear();
    }
    std::mt19937_64 generator = fresh_generator();
};

// A two-layer MLP, input (4,6) -> 8 -> 3, every tensor a leaf requiring grad: forward and backward.
struct Mlp {
    Tensor input, weight1, bias1, weight2, bias2;
    explicit Mlp(std::mt19937_64& generator)
        : input(random_leaf(generator, {4, 6})), weight1(random_leaf(generator, {6, 8})),
          bias1(random_leaf(generator, {8})), weight2(random_leaf(generator, {8, 3})),
          bias2(random_leaf(generator, {3})) {}
    void forward_backward() const { backward(sum(linear(gelu(linear(input, weight1, bias1)), weight2, bias2))); }
};

TEST_F(Profiler, CountsEveryKernelCallOfAKnownGraphPerOpAndPhase) {
    const Mlp mlp(generator);
    profiling::set_enabled(true);
    mlp.forward_backward();
    profiling::set_enabled(false);
    const profiling::Snapshot table = profiling::snapshot();

    constexpr int layers = 2;
    EXPECT_EQ(table.calls_of("linear", Phase::forward), layers); // one GEMM with its bias per layer
    // Per layer, since its input requires grad: the input gradient and the weight gradient, two GEMMs.
    EXPECT_EQ(table.calls_of("linear", Phase::backward), 2 * layers);
    // The bias gradient is a column sum, filed apart so that it does not count as GEMM time.
    EXPECT_EQ(table.calls_of("linear_bias", Phase::backward), layers);
    EXPECT_EQ(table.calls_of("linear_bias", Phase::forward), 0);
    EXPECT_EQ(table.calls_of("gelu", Phase::forward), 1);
    EXPECT_EQ(table.calls_of("gelu", Phase::backward), 1);
    EXPECT_EQ(table.calls_of("sum", Phase::forward), 1);
    EXPECT_EQ(table.calls_of("sum", Phase::backward), 1);
    EXPECT_EQ(table.calls_of("gemm", Phase::forward) + table.calls_of("gemm", Phase::backward), 0)
        << "linear's GEMMs are filed under linear";
    EXPECT_EQ(table.calls_of("adamw", Phase::optimizer), 0);

    for (const profiling::OpRecord& record : table.records) {
        if (record.op == "linear") EXPECT_EQ(record.category, "gemm");
        if (record.op == "linear_bias") EXPECT_EQ(record.category, "elementwise");
        if (record.op == "gelu") EXPECT_EQ(record.category, "elementwise");
    }
    EXPECT_GT(table.seconds_in_category("gemm"), 0.0);
}

TEST_F(Profiler, TimesAreNonNegativeAndSumToAtMostTheWallTime) {
    const Mlp mlp(generator);
    mlp.forward_backward(); // warm: the first call's allocations are not what this test is about
    profiling::reset();
    const auto start = std::chrono::steady_clock::now();
    profiling::set_enabled(true);
    for (int repeat = 0; repeat < 3; ++repeat) mlp.forward_backward();
    profiling::set_enabled(false);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const profiling::Snapshot table = profiling::snapshot();
    ASSERT_FALSE(table.records.empty());
    double sum = 0.0;
    int64_t calls = 0;
    for (const profiling::OpRecord& record : table.records) {
        EXPECT_GE(record.seconds, 0.0) << record.op;
        EXPECT_GT(record.calls, 0) << record.op;
        sum += record.seconds;
        calls += record.calls;
    }
    EXPECT_DOUBLE_EQ(sum, table.total_seconds);
    EXPECT_EQ(calls, table.total_calls);
    EXPECT_LE(table.total_seconds, wall) << "regions overlap or count time twice";
    EXPECT_EQ(table.calls_of("linear", Phase::forward), 3 * 2);
    for (size_t index = 1; index < table.records.size(); ++index)
        EXPECT_GE(table.records[index - 1].seconds, table.records[index].seconds) << "sorted by time, largest first";

    const std::string report = profiling::format_report(table, wall);
    EXPECT_NE(report.find("linear"), std::string::npos) << report;
    EXPECT_NE(report.find("GEMM share"), std::string::npos) << report;
    EXPECT_NE(report.find("unprofiled"), std::string::npos) << report;
}

TEST_F(Profiler, DisabledRecordsNothingAndResetEmpties) {
    const Mlp mlp(generator);
    mlp.forward_backward();
    EXPECT_TRUE(profiling::snapshot().records.empty());
    EXPECT_EQ(profiling::snapshot().total_seconds, 0.0);

    profiling::set_enabled(true);
    mlp.forward_backward();
    profiling::set_enabled(false);
    EXPECT_FALSE(profiling::snapshot().records.empty());
    profiling::reset();
    EXPECT_TRUE(profiling::snapshot().records.empty());
}

TEST_F(Profiler, NestedRegionsCountOnceUnderTheOuterName) {
    profiling::set_enabled(true);
    {
        const profiling::Region outer("outer_op");
        const profiling::Region inner("inner_op"); // cast's nested dispatch, a memset inside a kernel region
    }
    const profiling::Snapshot table = profiling::snapshot();
    EXPECT_EQ(table.calls_of("outer_op", Phase::forward), 1);
    EXPECT_EQ(table.calls_of("inner_op", Phase::forward), 0);
    EXPECT_EQ(table.records.size(), 1u);
    EXPECT_EQ(table.records.front().category, "other");
}

TEST_F(Profiler, PhaseScopeFilesRegionsAndRestores) {
    profiling::set_enabled(true);
    EXPECT_EQ(profiling::current_phase(), Phase::forward);
    {
        const profiling::PhaseScope phase(Phase::optimizer);
        const profiling::Region region("adamw");
    }
    EXPECT_EQ(profiling::current_phase(), Phase::forward);
    const profiling::Snapshot table = profiling::snapshot();
    EXPECT_EQ(table.calls_of("adamw", Phase::optimizer), 1);
    EXPECT_EQ(table.records.front().category, "optimizer");
}

TEST_F(Profiler, TrainerStepFilesTheNormAndTheUpdate) {
    constexpr int vocabulary = 32, time = 12;
    nn::GPT model(nn::GPTConfig{vocabulary, 16, 2, 2, 16, 0.0f}, 1234, Device::cpu, DType::f32);
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.max_steps = 3;
    optim::Trainer trainer(model, config);
    std::uniform_int_distribution<int> token(0, vocabulary - 1);
    std::vector<int32_t> ids(2 * time);
    for (int32_t& id : ids) id = token(generator);
    const nn::Batch batch{Tensor::from_vector<int32_t>(ids, {2, time}, Device::cpu),
                          Tensor::from_vector<int32_t>(ids, {2, time}, Device::cpu), Tensor()};
    bool given = false;
    const nn::BatchSource source = [&]() -> std::optional<nn::Batch> {
        if (given) return std::nullopt;
        given = true;
        return batch;
    };

    profiling::set_enabled(true);
    const std::optional<optim::StepResult> result = trainer.train_step(source);
    profiling::set_enabled(false);
    ASSERT_TRUE(result.has_value());
    const profiling::Snapshot table = profiling::snapshot();
    // AdamW is one multi-tensor update of every parameter, which zeroes the gradients in its own pass (the step's
    // epilogue); the norm is one list reduction.
    EXPECT_EQ(table.calls_of("adamw", Phase::optimizer), 1);
    EXPECT_EQ(table.calls_of("sum_of_squares", Phase::grad_norm), 1);
    EXPECT_EQ(table.calls_of("zero", Phase::optimizer), 0) << "the update zeroed the gradients";
    EXPECT_GT(table.calls_of("attention", Phase::forward), 0);
    EXPECT_GT(table.calls_of("attention", Phase::backward), 0);
    EXPECT_GT(table.seconds_in_category("gemm"), 0.0);
    EXPECT_GT(table.seconds_in_category("optimizer"), 0.0);
    EXPECT_LE(table.total_seconds, result->seconds);
}

} // namespace
} // namespace engine::testing
