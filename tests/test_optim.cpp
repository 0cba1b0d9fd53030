// Optimizers, clipping and schedules against hand-written float64 references of the PyTorch / Hugging Face
// formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "engine/elementwise.h"
#include "adamw_list.h"
#include "expect_error.h"
#include "gradcheck.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace engine::testing {
namespace {

using optim::NamedTensors;

// A weight (2-D), a bias and a LayerNorm-like vector (1-D): the decay grouping must tell them apart.
struct Parameters {
    NamedTensors named;
    explicit Parameters(std::mt19937_64& generator) {
        named.emplace_back("layer.weight", random_leaf(generator, {3, 4}));
        named.emplace_back("layer.bias", random_leaf(generator, {4}));
        named.emplace_back("ln.weight", random_leaf(generator, {4}));
    }
    void set_gradients(std::mt19937_64& generator) {
        for (auto& [name, parameter] : named) parameter.grad().copy_from(random_tensor(generator, parameter.shape()));
    }
};

// The hyperparameters are dyadic so that the kernels' float arguments carry them exactly, and the float64
// reference below needs no knowledge of that rounding.
constexpr double learning_rate = 0.0625, beta1 = 0.875, beta2 = 0.9921875, epsilon = 0.0009765625,
                 weight_decay = 0.25, grad_scale = 0.5;

TEST(Optimizer, AdamWMatchesPyTorchFormulasOverThreeSteps) {
    std::mt19937_64 generator = fresh_generator();
    Parameters parameters(generator);
    optim::AdamW adamw(parameters.named, {learning_rate, beta1, beta2, epsilon, weight_decay});
    EXPECT_TRUE(adamw.decays("layer.weight"));
    EXPECT_FALSE(adamw.decays("layer.bias"));
    EXPECT_FALSE(adamw.decays("ln.weight"));

    std::vector<std::vector<double>> reference, m, v;
    for (auto& [name, parameter] : parameters.named) {
        reference.push_back(parameter.to_vector<double>());
        m.emplace_back(parameter.numel(), 0.0);
        v.emplace_back(parameter.numel(), 0.0);
    }
    for (int t = 1; t <= 3; ++t) {
        parameters.set_gradients(generator);
        for (size_t which = 0; which < parameters.named.size(); ++which) {
            const bool decays = parameters.named[which].second.dim() >= 2;
            const std::vector<double> gradient = parameters.named[which].second.grad().to_vector<double>();
            for (size_t i = 0; i < gradient.size(); ++i) {
                const double g = grad_scale * gradient[i];
                double& p = reference[which][i];
                if (decays) p -= learning_rate * weight_decay * p;
                m[which][i] = beta1 * m[which][i] + (1 - beta1) * g;
                v[which][i] = beta2 * v[which][i] + (1 - beta2) * g * g;
                const double m_hat = m[which][i] / (1 - std::pow(beta1, t));
                const double v_hat = v[which][i] / (1 - std::pow(beta2, t));
                p -= learning_rate * m_hat / (std::sqrt(v_hat) + epsilon);
            }
        }
        adamw.step(grad_scale);
    }
    EXPECT_EQ(adamw.step_count(), 3);
    for (size_t which = 0; which < parameters.named.size(); ++which) {
        const std::vector<double> actual = parameters.named[which].second.to_vector<double>();
        for (size_t i = 0; i < actual.size(); ++i)
            EXPECT_NEAR(actual[i], reference[which][i], 1e-13 * std::max(1.0, std::fabs(reference[which][i])))
                << parameters.named[which].first << "[" << i << "]";
    }
    // The state is exposed by name for training-state files, and lives in the optimizer_state category.
    const NamedTensors state = adamw.named_state();
    ASSERT_EQ(state.size(), 6u);
    EXPECT_EQ(state[0].first, "exp_avg.layer.weight");
    EXPECT_EQ(state[1].first, "exp_avg_sq.layer.weight");
    EXPECT_EQ(state[0].second.category(), MemoryCategory::optimizer_state);
    const std::vector<double> first_moment = state[0].second.to_vector<double>();
    for (size_t i = 0; i < first_moment.size(); ++i) EXPECT_NEAR(first_moment[i], m[0][i], 1e-14);
}

TEST(Optimizer, SGDWithMomentumMatchesPyTorchFormulasOverThreeSteps) {
    std::mt19937_64 generator = fresh_generator();
    Parameters parameters(generator);
    const double momentum = 0.75;
    optim::SGD sgd(parameters.named, {learning_rate, momentum, weight_decay});
    std::vector<std::vector<double>> reference, buffer;
    for (auto& [name, parameter] : parameters.named) {
        reference.push_back(parameter.to_vector<double>());
        buffer.emplace_back(parameter.numel(), 0.0);
    }
    for (int t = 1; t <= 3; ++t) {
        parameters.set_gradients(generator);
        for (size_t which = 0; which < parameters.named.size(); ++which) {
            const bool decays = parameters.named[which].second.dim() >= 2;
            const std::vector<double> gradient = parameters.named[which].second.grad().to_vector<double>();
            for (size_t i = 0; i < gradient.size(); ++i) {
                double& p = reference[which][i];
                const double g = grad_scale * gradient[i] + (decays ? weight_decay * p : 0.0);
                buffer[which][i] = t == 1 ? g : momentum * buffer[which][i] + g; // torch: buf = g on step 1
                p -= learning_rate * buffer[which][i];
            }
        }
        sgd.step(grad_scale);
    }
    for (size_t which = 0; which < parameters.named.size(); ++which) {
        const std::vector<double> actual = parameters.named[which].second.to_vector<double>();
        for (size_t i = 0; i < actual.size(); ++i)
            EXPECT_NEAR(actual[i], reference[which][i], 1e-13 * std::max(1.0, std::fabs(reference[which][i])))
                << parameters.named[which].first << "[" << i << "]";
    }
    EXPECT_EQ(sgd.named_state()[0].first, "momentum_buffer.layer.weight");
}

TEST(Optimizer, StateIsAllocatedOnceAndZeroGradIsAMemset) {
    std::mt19937_64 generator = fresh_generator();
    Parameters parameters(generator);
    const size_t before = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state);
    optim::AdamW adamw(parameters.named, {});
    const size_t after = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state);
    EXPECT_EQ(after - before, 2u * (12 + 4 + 4) * sizeof(double));
    parameters.set_gradients(generator);
    const void* buffer = parameters.named[0].second.grad().raw_data();
    adamw.step();
    adamw.zero_grad();
    EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::optimizer_state), after);
    EXPECT_EQ(parameters.named[0].second.grad().raw_data(), buffer);
    for (double value : parameters.named[0].second.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
    adamw.set_step_count(7);
    EXPECT_EQ(adamw.step_count(), 7);
    EXPECT_THROW(adamw.set_step_count(-1), EngineError);
    EXPECT_THROW(adamw.decays("missing"), EngineError);
}

TEST(Optimizer, RejectsBadHyperparametersAndNonLeafParameters) {
    std::mt19937_64 generator = fresh_generator();
    Parameters parameters(generator);
    EXPECT_THROW(optim::AdamW(parameters.named, {1e-3, 1.0, 0.999, 1e-8, 0.0}), EngineError);
    EXPECT_THROW(optim::AdamW(parameters.named, {1e-3, 0.9, 0.999, 0.0, 0.0}), EngineError);
    EXPECT_THROW(optim::SGD(parameters.named, {-1.0, 0.9, 0.0}), EngineError);
    NamedTensors no_gradient = {{"x", random_tensor(generator, {2, 2})}};
    EXPECT_THROW(optim::SGD(no_gradient, {}), EngineError);
}

TEST(Optimizer, AdamWListIsBitwiseThePerRangeUpdateConversionAndZeroFill) {
    std::mt19937_64 generator = fresh_generator();
    for (const DType dtype : {DType::f32, DType::f64}) expect_adamw_list_matches_per_range_updates(Device::cpu, dtype, generator);
}

// An optimizer with the step's epilogue against the same optimizer without it, followed by what the epilogue
// replaces (the copies rounded from the masters, the gradients zeroed): the same bits over three steps, for
// AdamW (fused in its update) and SGD (after it).
TEST(Optimizer, StepEpilogueWritesTheCopiesAndZeroesTheGradientsAsTheSeparatePassesDo) {
    std::mt19937_64 generator = fresh_generator();
    for (const bool adam : {true, false}) {
        NamedTensors fused, separate;
        std::vector<Tensor> fused_parameters, copies, separate_copies;
        for (const Shape& shape : {Shape{5, 7}, Shape{7}, Shape{4099}}) {
            const Tensor values = random_tensor(generator, shape, DType::f32);
            for (NamedTensors* named : {&fused, &separate}) {
                Tensor parameter = values.to(Device::cpu);
                parameter.set_requires_grad(true);
                named->emplace_back("p" + std::to_string(named->size()), parameter);
            }
            fused_parameters.push_back(fused.back().second);
            copies.push_back(Tensor::zeros(shape, DType::bf16, Device::cpu));
            separate_copies.push_back(Tensor::zeros(shape, DType::bf16, Device::cpu));
        }
        copies[1] = Tensor(); // a parameter without a copy: only its gradient is zeroed
        std::unique_ptr<optim::Optimizer> with, without;
        if (adam) {
            with = std::make_unique<optim::AdamW>(fused, optim::AdamWOptions{learning_rate, beta1, beta2, epsilon, weight_decay});
            without = std::make_unique<optim::AdamW>(separate, optim::AdamWOptions{learning_rate, beta1, beta2, epsilon, weight_decay});
        } else {
            with = std::make_unique<optim::SGD>(fused, optim::SGDOptions{learning_rate, 0.5, weight_decay});
            without = std::make_unique<optim::SGD>(separate, optim::SGDOptions{learning_rate, 0.5, weight_decay});
        }
        with->set_step_epilogue(fused_parameters, copies, true);
        EXPECT_TRUE(with->has_step_epilogue());
        for (int step = 0; step < 3; ++step) {
            for (size_t index = 0; index < fused.size(); ++index) {
                const Tensor gradient = random_tensor(generator, fused[index].second.shape(), DType::f32);
                fused[index].second.grad().copy_from(gradient);
                separate[index].second.grad().copy_from(gradient);
            }
            with->step(grad_scale);
            without->step(grad_scale);
            for (size_t index = 0; index < fused.size(); ++index) {
                convert_into(separate_copies[index], separate[index].second);
                const std::string where = std::string(adam ? "AdamW" : "SGD") + " step " + std::to_string(step) +
                                          ", parameter " + std::to_string(index);
                EXPECT_EQ(values_of(fused[index].second), values_of(separate[index].second)) << where;
                for (const double value : values_of(fused[index].second.grad())) ASSERT_EQ(value, 0.0) << where;
                if (copies[index].defined())
                    EXPECT_EQ(values_of(copies[index]), values_of(separate_copies[index])) << where;
            }
            for (size_t state = 0; state < with->named_state().size(); ++state)
                EXPECT_EQ(values_of(with->named_state()[state].second), values_of(without->named_state()[state].second));
        }
    }
}

TEST(Optimizer, StepEpilogueRefusesWhatItCannotWrite) {
    std::mt19937_64 generator = fresh_generator();
    Tensor weight = random_tensor(generator, {3, 4}, DType::f32), bias = random_tensor(generator, {4}, DType::f32);
    weight.set_requires_grad(true);
    bias.set_requires_grad(true);
    const NamedTensors named = {{"weight", weight}, {"bias", bias}};
    optim::AdamW adamw(named, {});
    const Tensor copy = Tensor::zeros({3, 4}, DType::bf16, Device::cpu);
    expect_error([&] { adamw.set_step_epilogue({weight}, {copy}, true); }, {"one parameter", "2 parameters"});
    expect_error([&] { adamw.set_step_epilogue({bias, weight}, {Tensor(), Tensor()}, true); }, {"parameter 'weight'"});
    expect_error([&] { adamw.set_step_epilogue({weight, bias}, {Tensor::zeros({3, 4}, DType::f32, Device::cpu), Tensor()}, true); },
                 {"working copy", "'weight'", "bf16"});
    expect_error([&] { adamw.set_step_epilogue({weight, bias}, {Tensor::zeros({5}, DType::bf16, Device::cpu), Tensor()}, true); },
                 {"working copy", "'weight'", "of its size"});
    EXPECT_FALSE(adamw.has_step_epilogue()) << "a refused epilogue is not set";
    // A rank's part (ZeRO) is not a whole tensor.
    optim::AdamW shard(named, {}, optim::decay_matrices_only, optim::ShardRange{0, 5});
    expect_error([&] { shard.set_step_epilogue({weight, bias}, {copy, Tensor()}, true); }, {"rank's part"});
    // One tensor under two names: a launch would zero the gradient while another of its blocks reads it.
    optim::AdamW twice(NamedTensors{{"first", weight}, {"second", weight}}, {});
    expect_error([&] { twice.set_step_epilogue({weight, weight}, {Tensor(), Tensor()}, true); },
                 {"'first'", "'second'", "one tensor"});
    adamw.set_step_epilogue({weight, bias}, {copy, Tensor()}, true);
    expect_error([&] { adamw.read_gradients_from(Tensor::zeros({16}, DType::f32, Device::cpu)); }, {"epilogue"});
}

TEST(Clip, GlobalNormOverAllGradientsAndPyTorchCoefficient) {
    Tensor a = Tensor::zeros({2}, DType::f64, Device::cpu);
    Tensor b = Tensor::zeros({1, 1}, DType::f64, Device::cpu);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    a.grad().copy_from(Tensor::from_vector<double>({3.0, 4.0}, {2}, Device::cpu));
    b.grad().copy_from(Tensor::from_vector<double>({12.0}, {1, 1}, Device::cpu));
    EXPECT_DOUBLE_EQ(optim::global_grad_norm({a, b}), 13.0);

    EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b}, 26.0), 13.0); // under the limit: untouched
    EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3.0, 4.0}));

    EXPECT_DOUBLE_EQ(optim::clip_grad_norm({a, b}, 1.0), 13.0); // returns the norm before clipping
    const double coefficient = 1.0 / (13.0 + 1e-6);
    EXPECT_DOUBLE_EQ(a.grad().to_vector<double>()[1], 4.0 * coefficient);
    EXPECT_DOUBLE_EQ(b.grad().to_vector<double>()[0], 12.0 * coefficient);
    EXPECT_NEAR(optim::global_grad_norm({a, b}), 1.0, 1e-6);
    EXPECT_EQ(optim::clip_coefficient(5.0, 0.0), 1.0); // max_norm 0 = off
}

double reference_cosine(int64_t step, double peak, int64_t warmup, int64_t total, double floor_ratio) {
    if (step < warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
    double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    progress = std::min(progress, 1.0);
    return peak * (floor_ratio + (1 - floor_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

TEST(Schedule, ConstantAndWarmupCosineFollowHuggingFaceFormulas) {
    optim::LearningRateSchedule constant({optim::ScheduleType::constant, 0.5, 0, 10, 0.0});
    for (int64_t step : {0, 3, 100}) EXPECT_EQ(constant.at(step), 0.5);

    optim::LearningRateSchedule cosine({optim::ScheduleType::cosine, 0.5, 4, 20, 0.1});
    EXPECT_EQ(cosine.at(0), 0.0);
    EXPECT_DOUBLE_EQ(cosine.at(2), 0.25);
    EXPECT_DOUBLE_EQ(cosine.at(4), 0.5);
    EXPECT_DOUBLE_EQ(cosine.at(12), 0.5 * (0.1 + 0.9 * 0.5)); // halfway: cos(π/2) = 0
    EXPECT_DOUBLE_EQ(cosine.at(20), 0.05);
    EXPECT_DOUBLE_EQ(cosine.at(50), 0.05); // stays at the floor
    for (int64_t step = 0; step <= 25; ++step)
        EXPECT_NEAR(cosine.at(step), reference_cosine(step, 0.5, 4, 20, 0.1), 1e-15) << step;

    EXPECT_THROW(optim::parse_schedule_type("linear_ish"), EngineError);
    EXPECT_THROW(optim::LearningRateSchedule({optim::ScheduleType::cosine, 0.5, -1, 20, 0.0}), EngineError);
    EXPECT_THROW(constant.at(-1), EngineError);
}

} // namespace
} // namespace engine::testing
