// Frozen parameters (nn::Module::set_requires_grad, issue 28 item 1): no gradient buffer, no optimizer state,
// no weight-gradient GEMM and no part in the norm. Against the same model with nothing frozen: the trainable
// parameters' gradients bitwise (GPT-2 with its tied, padded table and Llama; f32 and bf16; plain and
// checkpointed), the gradients' bytes less exactly the frozen ones', the GEMMs skipped counted; over steps the
// frozen weights bitwise unchanged under weight decay while the rest learns; resume; unfreezing; bad input.
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/profiling.h"
#include "adapter_training.h"
#include "expect_error.h"
#include "nn/model_config.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "parameter_snapshot.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

constexpr int length = 24;

// What the tests freeze: the token table (GPT-2's is tied to the head and padded), every parameter of the first
// decoder layer, and the query side of every other layer's attention (a weight whose bias, in GPT-2, stays
// trainable). The position table (GPT-2), the norms and the MLPs of the other layers stay trainable, so the
// input gradient must still flow through every frozen layer.
bool frozen_by_default(const std::string& name) {
    const bool table = name == "wte.weight" || name == "model.embed_tokens.weight";
    const bool first_layer = name.rfind("h.0.", 0) == 0 || name.rfind("model.layers.0.", 0) == 0;
    const bool query = name.find("c_attn.weight") != std::string::npos || name.find("q_proj.weight") != std::string::npos;
    return table || first_layer || query;
}

std::unique_ptr<nn::CausalLM> build(const std::string& model_name) {
    return nn::ModelConfig::named(model_name).build(5, Device::cpu, DType::f32);
}

// Freezes the parameters `frozen` picks, by name; returns their names.
std::vector<std::string> freeze(nn::Module& model, const std::function<bool(const std::string&)>& frozen) {
    std::vector<std::string> names;
    for (const auto& [name, parameter] : model.named_parameters())
        if (frozen(name)) names.push_back(name);
    for (const std::string& name : names) model.set_parameter_requires_grad(name, false);
    return names;
}

optim::TrainerConfig config_of(Precision precision, bool checkpointed) {
    optim::TrainerConfig config = adapter_trainer_config(precision, checkpointed, 3e-3, 6);
    config.weight_decay = 0.1; // frozen matrices must not decay either
    config.max_grad_norm = 0.5;
    return config;
}

std::vector<nn::Batch> window(int vocabulary, int& cursor) {
    const nn::BatchSource source = padded_label_batches(vocabulary, length, cursor);
    return {*source(), *source()};
}

size_t gradient_bytes() { return memory_stats(Device::cpu).current(MemoryCategory::gradients); }

// One window's gradients with nothing frozen and with the default set frozen: the trainable ones bitwise equal,
// the frozen ones without a buffer, and the gradient bytes less exactly theirs (the padded table's stored rows).
TEST(FrozenParameters, TrainableGradientsAreBitwiseTheUnfrozenRunsAndFrozenOnesHaveNoBuffer) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            for (const bool checkpointed : {false, true}) {
                const std::string what = model_name + " " + precision_name(precision) + (checkpointed ? " checkpointed" : "");
                current_tape().clear();
                const size_t before = gradient_bytes();
                const std::unique_ptr<nn::CausalLM> whole = build(model_name);
                optim::Trainer whole_trainer(*whole, config_of(precision, checkpointed));
                const size_t whole_bytes = gradient_bytes() - before;
                int cursor = 0;
                whole_trainer.accumulate_gradients(window(whole->vocab_size(), cursor));

                const std::unique_ptr<nn::CausalLM> model = build(model_name);
                const std::vector<std::string> frozen = freeze(*model, frozen_by_default);
                optim::Trainer trainer(*model, config_of(precision, checkpointed));
                cursor = 0;
                trainer.accumulate_gradients(window(model->vocab_size(), cursor));

                size_t freed = 0;
                const auto whole_parameters = whole->named_parameters();
                const auto parameters = model->named_parameters();
                ASSERT_EQ(parameters.size(), whole_parameters.size());
                size_t trainable = 0;
                for (size_t index = 0; index < parameters.size(); ++index) {
                    const auto& [name, parameter] = parameters[index];
                    const bool is_frozen = frozen_by_default(name);
                    EXPECT_EQ(parameter.requires_grad(), !is_frozen) << what << " " << name;
                    if (is_frozen) {
                        EXPECT_FALSE(parameter.grad().defined()) << what << " " << name;
                        freed += whole_parameters[index].second.grad().storage_bytes();
                        continue;
                    }
                    ++trainable;
                    EXPECT_EQ(as_doubles(parameter.grad()), as_doubles(whole_parameters[index].second.grad()))
                        << what << " " << name;
                }
                EXPECT_EQ(trainable, model->named_trainable_parameters().size()) << what;
                EXPECT_EQ(trainable + frozen.size(), parameters.size()) << what;
                // Both models are alive: the frozen model's buffers are the whole one's less the frozen ones.
                EXPECT_EQ(gradient_bytes() - before, 2 * whole_bytes - freed) << what;
                EXPECT_GT(freed, 0u) << what;
            }
        }
    }
}

// The skipped weight-gradient GEMMs, counted by the op profiler: one "linear" backward call fewer per frozen
// linear weight and micro-batch, and the input gradients still computed (GPT-2, whose trainable position table
// needs them down to the first layer).
TEST(FrozenParameters, FrozenLinearWeightsSkipTheirWeightGradientGemm) {
    const auto backward_linear_calls = [](bool with_frozen) {
        current_tape().clear();
        const std::unique_ptr<nn::CausalLM> model = build("tiny");
        if (with_frozen) freeze(*model, frozen_by_default);
        optim::Trainer trainer(*model, config_of(Precision::fp32, false));
        int cursor = 0;
        const std::vector<nn::Batch> batches = window(model->vocab_size(), cursor);
        profiling::reset();
        profiling::set_enabled(true);
        trainer.accumulate_gradients(batches);
        profiling::set_enabled(false);
        return profiling::snapshot().calls_of("linear", profiling::Phase::backward);
    };
    const int64_t whole = backward_linear_calls(false), frozen = backward_linear_calls(true);
    const nn::ModelConfig config = nn::ModelConfig::named("tiny");
    const int layers = config.gpt().n_layer;
    // Frozen linear weights: the first layer's four (c_attn, attn.c_proj, c_fc, mlp.c_proj) and each other
    // layer's c_attn; two micro-batches each.
    const int64_t skipped = 2 * (4 + (layers - 1));
    EXPECT_EQ(whole - frozen, skipped) << whole << " backward linear calls against " << frozen;
    EXPECT_GT(frozen, 0);
}

// A linear op over a frozen weight saves nothing of its input: only the weight is needed, for the input gradient.
// An input made by an earlier op (so it is freed when its last handle goes) is gone as soon as the caller drops
// it, for linear (nn::Linear's layout, with a bias) and matmul (torch's layout); with a trainable weight it stays
// saved until the backward. The gradients are the same either way.
TEST(FrozenParameters, AFrozenWeightsOpKeepsNoInputAlive) {
    constexpr int rows = 6, in = 5, out = 3;
    for (const bool transposed : {false, true}) {
        for (const bool frozen : {false, true}) {
            const std::string what = std::string(transposed ? "matmul" : "linear") + (frozen ? ", frozen" : ", trainable");
            current_tape().clear();
            Tensor source = Tensor::from_vector(std::vector<float>(rows * in, 0.5f), {rows, in}, Device::cpu);
            source.set_requires_grad(true);
            Tensor weight = Tensor::from_vector(std::vector<float>(in * out, 0.25f),
                                                transposed ? Shape{out, in} : Shape{in, out}, Device::cpu);
            weight.set_requires_grad(!frozen);
            const Tensor bias = Tensor::zeros({out}, DType::f32, Device::cpu);
            const size_t before = memory_stats(Device::cpu).current(MemoryCategory::activations);
            Tensor output;
            {
                const Tensor input = gelu(source); // (rows,in): freed with its last handle
                output = transposed ? matmul(input, weight, true) : linear(input, weight, bias);
            }
            const size_t held = memory_stats(Device::cpu).current(MemoryCategory::activations) - before;
            const size_t input_bytes = static_cast<size_t>(rows * in) * sizeof(float);
            const size_t output_bytes = static_cast<size_t>(rows * out) * sizeof(float);
            EXPECT_EQ(held, output_bytes + (frozen ? 0 : input_bytes)) << what;
            backward(sum(output));
            const std::vector<float> gradient = source.grad().to_vector<float>();
            // d(sum)/d(source) = gelu'(0.5) · (a weight row's sum, 3 · 0.25); d(sum)/d(weight) = Σ_rows gelu(0.5) (tanh GELU:
            // gelu(0.5) = 0.3457140, gelu'(0.5) = 0.8673699, in float64).
            for (const float value : gradient) EXPECT_NEAR(value, 0.75 * 0.8673699, 1e-6) << what;
            if (!frozen) EXPECT_NEAR(weight.grad().to_vector<float>()[0], rows * 0.3457140, 1e-5) << what;
        }
    }
    current_tape().clear();
}

// Over six steps with weight decay and clipping: every frozen parameter keeps its bits, every trainable one
// moves, the loss falls, the optimizer holds state for the trainable parameters only, and the reported norm is
// the trainable gradients'.
TEST(FrozenParameters, FrozenWeightsStayBitwiseWhileTheRestLearns) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            const std::string what = model_name + " " + precision_name(precision);
            current_tape().clear();
            const std::unique_ptr<nn::CausalLM> model = build(model_name);
            const Snapshot initial = values_of(*model);
            freeze(*model, frozen_by_default);
            const size_t state_before = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state);
            const size_t parameters_before = memory_stats(Device::cpu).current(MemoryCategory::parameters);
            size_t frozen_stored = 0, trainable_stored = 0; // f32 bytes, the padded table's stored rows too
            for (const auto& [name, parameter] : model->named_parameters())
                (parameter.requires_grad() ? trainable_stored : frozen_stored) += parameter.storage_bytes();
            optim::Trainer trainer(*model, config_of(precision, true));
            const size_t state_bytes = memory_stats(Device::cpu).current(MemoryCategory::optimizer_state) - state_before;
            size_t trainable_bytes = 0;
            for (const Tensor& parameter : model->trainable_parameters()) trainable_bytes += parameter.nbytes();
            EXPECT_EQ(state_bytes, 2 * trainable_bytes) << what << ": two f32 moments per trainable element";
            // Under bf16 the trainable parameters gain bf16 copies (half their f32 bytes) and the frozen ones are
            // stored in bf16 in place of their f32 masters (half their bytes freed).
            const size_t parameters_after = memory_stats(Device::cpu).current(MemoryCategory::parameters);
            if (precision == Precision::bf16)
                EXPECT_EQ(parameters_after + frozen_stored / 2, parameters_before + trainable_stored / 2) << what;
            else
                EXPECT_EQ(parameters_after, parameters_before) << what;
            EXPECT_EQ(trainer.optimizer().parameter_names().size(), model->named_trainable_parameters().size()) << what;

            int cursor = 0;
            std::vector<double> losses;
            for (int step = 0; step < 6; ++step) {
                const optim::Accumulation accumulated = trainer.accumulate_gradients(window(model->vocab_size(), cursor));
                Snapshot trainable_gradients;
                for (const Tensor& parameter : model->trainable_parameters())
                    trainable_gradients.push_back(as_doubles(parameter.grad()));
                const optim::StepResult result = trainer.apply_update(accumulated);
                EXPECT_NEAR(result.grad_norm, global_norm(trainable_gradients), 1e-6 * result.grad_norm) << what;
                losses.push_back(result.loss);
            }
            EXPECT_LT(losses.back(), losses.front()) << what;
            const Snapshot trained = values_of(*model);
            const auto parameters = model->named_parameters();
            for (size_t index = 0; index < parameters.size(); ++index) {
                if (frozen_by_default(parameters[index].first)) {
                    // Under bf16 a frozen weight is its bf16 rounding from the trainer's construction on.
                    const bool bf16 = precision == Precision::bf16;
                    EXPECT_EQ(parameters[index].second.dtype(), bf16 ? DType::bf16 : DType::f32) << what;
                    EXPECT_EQ(trained[index], bf16 ? bf16_rounded(initial[index]) : initial[index])
                        << what << " " << parameters[index].first;
                } else
                    EXPECT_NE(trained[index], initial[index]) << what << " " << parameters[index].first;
            }
        }
    }
}

// A state saved with frozen parameters holds every weight and the trainable ones' moments, and resumes bitwise.
TEST(FrozenParameters, ResumesBitwise) {
    const std::filesystem::path directory = std::filesystem::temp_directory_path() / "engine_frozen_resume";
    std::filesystem::remove_all(directory);
    const auto run = [&](int first_step, int last_step, bool resume, bool save) {
        current_tape().clear();
        const std::unique_ptr<nn::CausalLM> model = build("llama-tiny");
        freeze(*model, frozen_by_default);
        optim::Trainer trainer(*model, config_of(Precision::bf16, true));
        if (resume) optim::resume_training_state(directory.string(), trainer, nullptr);
        int cursor = 4 * first_step;
        for (int step = first_step; step < last_step; ++step) trainer.apply_update(trainer.accumulate_gradients(window(model->vocab_size(), cursor)));
        if (save) {
            const io::TrainingState state = optim::capture_training_state(trainer, nullptr);
            EXPECT_EQ(state.tensors.size(),
                      model->named_parameters().size() + 2 * model->named_trainable_parameters().size());
            optim::save_training_state(directory.string(), trainer, nullptr);
        }
        return values_of(*model);
    };
    const Snapshot straight = run(0, 4, false, false);
    run(0, 2, false, true);
    EXPECT_EQ(run(2, 4, true, false), straight);
    std::filesystem::remove_all(directory);
}

// Freezing then unfreezing gives zeroed buffers over the same rows as at registration (the tied, padded table's
// views too): the model then trains bitwise as one never frozen.
TEST(FrozenParameters, UnfrozenParametersTrainAsNeverFrozen) {
    const auto train = [](bool round_trip) {
        current_tape().clear();
        const std::unique_ptr<nn::CausalLM> model = build("tiny");
        if (round_trip) {
            const size_t before = gradient_bytes();
            model->set_requires_grad(false);
            EXPECT_EQ(model->trainable_parameter_count(), 0u);
            for (const Tensor& parameter : model->parameters()) EXPECT_FALSE(parameter.grad().defined());
            EXPECT_LT(gradient_bytes(), before);
            model->set_requires_grad(true);
            EXPECT_EQ(gradient_bytes(), before);
            for (const Tensor& parameter : model->parameters())
                for (double value : as_doubles(parameter.grad())) EXPECT_EQ(value, 0.0);
        }
        optim::Trainer trainer(*model, config_of(Precision::bf16, false));
        int cursor = 0;
        for (int step = 0; step < 2; ++step) trainer.apply_update(trainer.accumulate_gradients(window(model->vocab_size(), cursor)));
        return values_of(*model);
    };
    EXPECT_EQ(train(true), train(false));
}

// Data parallelism in one process: a communicator and ZeRO-1 over it reduce only the trainable gradients and
// take the same steps as no communicator.
TEST(FrozenParameters, ZeroStageOneStepsAsOneProcess) {
    const auto train = [](bool zero) {
        current_tape().clear();
        const auto communicator = distributed::make_communicator(distributed::Backend::none);
        const std::unique_ptr<nn::CausalLM> model = build("tiny");
        freeze(*model, frozen_by_default);
        optim::TrainerConfig config = config_of(Precision::fp32, false);
        config.shape.zero_stage = zero ? 1 : 0;
        optim::Trainer trainer(*model, config, zero ? communicator.get() : nullptr);
        int cursor = 0;
        for (int step = 0; step < 2; ++step) trainer.apply_update(trainer.accumulate_gradients(window(model->vocab_size(), cursor)));
        return values_of(*model);
    };
    EXPECT_EQ(train(true), train(false));
}

// set_compute_dtype(bf16) stores a frozen parameter in bf16, without its f32 master: the forward reads the
// same bf16 values as an unfrozen model's working copies (logits bitwise equal), the f32 bytes are freed,
// unfreezing is refused (no master to train), and set_compute_dtype(f32) widens them back exactly.
TEST(FrozenParameters, StoredInBf16UnderBf16AndWidenedBack) {
    for (const std::string model_name : {"tiny", "llama-tiny"}) {
        current_tape().clear();
        const std::unique_ptr<nn::CausalLM> whole = build(model_name);
        const std::unique_ptr<nn::CausalLM> model = build(model_name);
        const Snapshot initial = values_of(*model);
        const std::vector<std::string> frozen = freeze(*model, frozen_by_default);
        const size_t before = memory_stats(Device::cpu).current(MemoryCategory::parameters);
        whole->set_compute_dtype(DType::bf16);
        const size_t whole_copies = memory_stats(Device::cpu).current(MemoryCategory::parameters) - before;
        model->set_compute_dtype(DType::bf16);
        const size_t after = memory_stats(Device::cpu).current(MemoryCategory::parameters);
        size_t frozen_stored = 0;
        const auto named = model->named_parameters();
        for (size_t index = 0; index < named.size(); ++index) {
            const auto& [name, parameter] = named[index];
            if (parameter.requires_grad()) continue;
            EXPECT_EQ(parameter.dtype(), DType::bf16) << model_name << " " << name;
            EXPECT_EQ(as_doubles(parameter), bf16_rounded(initial[index])) << model_name << " " << name;
            frozen_stored += parameter.storage_bytes();
        }
        // The whole model gained bf16 copies of everything (half its f32 bytes); this one of its trainable
        // parameters only, and its frozen ones now take half of their f32 bytes (so it holds 2 × theirs less).
        EXPECT_EQ(after + 2 * frozen_stored, before + 2 * whole_copies) << model_name;
        int cursor = 0;
        const Tensor tokens = (*padded_label_batches(model->vocab_size(), length, cursor)()).inputs;
        const auto logits = [&](nn::CausalLM& lm) {
            NoGradGuard no_grad;
            return as_doubles(cast(lm.forward(tokens), DType::f32));
        };
        EXPECT_EQ(logits(*model), logits(*whole)) << model_name;

        expect_error([&] { model->set_parameter_requires_grad(frozen.front(), true); },
                     {"'" + frozen.front() + "' was frozen when set_compute_dtype(bf16) stored it in bf16",
                      "set_compute_dtype(f32) first"});
        expect_error([&] { model->set_requires_grad(true); }, {"set_compute_dtype(f32) first"});
        EXPECT_EQ(model->trainable_parameters().size(), named.size() - frozen.size()) << model_name;

        model->set_compute_dtype(DType::f32);
        for (size_t index = 0; index < named.size(); ++index) {
            if (named[index].second.requires_grad()) continue;
            EXPECT_EQ(named[index].second.dtype(), DType::f32) << model_name << " " << named[index].first;
            EXPECT_EQ(as_doubles(named[index].second), bf16_rounded(initial[index])) << model_name;
        }
        EXPECT_EQ(memory_stats(Device::cpu).current(MemoryCategory::parameters), before + whole_copies) << model_name;
        model->set_requires_grad(true);
        EXPECT_EQ(model->trainable_parameters().size(), named.size()) << model_name;
    }
}

TEST(FrozenParameters, BadInputIsRefusedAndChangesNothing) {
    current_tape().clear();
    const std::unique_ptr<nn::CausalLM> model = build("tiny");
    const size_t trainable = model->trainable_parameter_count();
    expect_error([&] { model->set_parameter_requires_grad("h.0.attn.q_proj.weight", false); },
                 {"set_parameter_requires_grad", "no parameter is named 'h.0.attn.q_proj.weight'"});
    EXPECT_EQ(model->trainable_parameter_count(), trainable);

    model->set_requires_grad(false);
    expect_error([&] { optim::Trainer refused(*model, config_of(Precision::fp32, false)); },
                 {"every one of the module's", "parameters is frozen"});
    model->set_requires_grad(true);

    optim::Trainer trainer(*model, config_of(Precision::fp32, false));
    model->set_parameter_requires_grad("h.1.mlp.c_fc.weight", false);
    int cursor = 0;
    const Snapshot before = values_of(*model);
    expect_error([&] { trainer.accumulate_gradients(window(model->vocab_size(), cursor)); },
                 {"'h.1.mlp.c_fc.weight' was frozen after the trainer was built"});
    EXPECT_EQ(values_of(*model), before);
    EXPECT_TRUE(current_tape().empty());
}

} // namespace
} // namespace engine::testing
