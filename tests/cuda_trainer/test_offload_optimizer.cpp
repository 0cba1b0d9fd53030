// Model state off the device (optimizer offload, TrainerConfig::shape.offload_optimizer): the f32 masters, their
// gradients and AdamW's moments in host memory, the update on the host, the device keeping the working weights
// and the window's gradients. Against the same run with everything on the device: the same weights, bitwise,
// after steps with accumulation, clipping, bf16 and checkpointing, for GPT-2 and Llama (tied and untied); the
// device holds no master, gradient copy or moment, and the host holds them; with streamed parameters the
// checkpointed layers' working copies are on the host too, and one layer's on the device while it is used;
// resume is bitwise; frozen parameters offload as they train on the device; a model on the host is refused.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/trainer.h"
#include "optim/training_state.h"
#include "tests/cuda/gpt_gradients.h"
#include "tests/llama_step.h"

namespace engine::test {
namespace {

constexpr int micro_batches = 3, batch = 2, steps = 4;

struct OffloadCase {
    const char* name;
    bool llama;
    bool tied; // Llama only: the head reads embed_tokens (GPT-2's is always tied)
    Precision precision;
    bool checkpointing;
    GradientOffload gradients = GradientOffload::window;
    bool parameters = false; // streamed parameters too (offload_parameters)
    int loss_chunk = 0;      // the streaming LM head's chunk, in both runs (0: the whole logits)
    int mlp_tile = 0;        // the MLP's tile, in both runs (0: the whole MLP)
    bool frozen = false;     // the token table, the first layer and the other layers' query weights frozen
};
void PrintTo(const OffloadCase& offload_case, std::ostream* out) { *out << offload_case.name; }

// OffloadCase::frozen's parameters (tests/test_frozen_parameters.cpp freezes the same on the host).
bool frozen_parameter(const std::string& name) {
    const bool table = name == "wte.weight" || name == "model.embed_tokens.weight";
    const bool first_layer = name.rfind("h.0.", 0) == 0 || name.rfind("model.layers.0.", 0) == 0;
    const bool query = name.find("c_attn.weight") != std::string::npos || name.find("q_proj.weight") != std::string::npos;
    return table || first_layer || query;
}

std::unique_ptr<nn::CausalLM> build(const OffloadCase& run) {
    std::unique_ptr<nn::CausalLM> model;
    if (run.llama) model = std::make_unique<nn::Llama>(small_llama_config(run.tied), 11, Device::cuda);
    else model = std::make_unique<nn::GPT>(small_gpt_config(), 11, Device::cuda);
    if (run.frozen)
        for (const auto& [name, parameter] : model->named_parameters())
            if (frozen_parameter(name)) model->set_parameter_requires_grad(name, false);
    return model;
}

optim::TrainerConfig config_of(const OffloadCase& run, bool offload) {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = batch;
    config.shape.gradient_accumulation_steps = micro_batches;
    config.shape.precision = run.precision;
    config.shape.checkpointing.enabled = run.checkpointing;
    config.shape.checkpointing.offload = run.checkpointing;
    config.shape.offload_optimizer = offload;
    if (offload) config.shape.offload_gradients = run.gradients;
    config.shape.offload_parameters = offload && run.parameters;
    config.shape.loss_chunk_tokens = run.loss_chunk;
    config.shape.mlp_tile_tokens = run.mlp_tile;
    config.learning_rate = 3e-3;
    config.weight_decay = 0.1;
    config.max_grad_norm = 0.5; // active: these gradients' norm is far above it
    config.lr_scheduler_type = "cosine";
    config.warmup_steps = 1;
    config.max_steps = steps;
    return config;
}

// A fixed stream of batches (labels = inputs; the trainer shifts them), the same for every run.
nn::BatchSource batches_of(const nn::CausalLM& model, int& cursor) {
    const int length = model.max_seq_len();
    return [&cursor, length, vocabulary = model.vocab_size()]() -> std::optional<nn::Batch> {
        const std::vector<MicroBatch> made =
            make_token_micro_batches(vocabulary, length, 1, batch, 1000u + static_cast<uint32_t>(cursor++));
        nn::Batch out;
        out.inputs = Tensor::from_vector<int32_t>(made[0].tokens, {batch, length}, Device::cpu);
        out.labels = out.inputs;
        return out;
    };
}

// Every master's bytes, in order.
std::vector<std::vector<unsigned char>> master_bytes(const nn::Module& model) {
    std::vector<std::vector<unsigned char>> out;
    for (const auto& [name, parameter] : model.named_parameters()) {
        const Tensor host = parameter.to(Device::cpu);
        const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
        out.emplace_back(bytes, bytes + host.nbytes());
    }
    return out;
}

struct Trained {
    std::vector<double> losses, norms;
    std::vector<std::vector<unsigned char>> masters;
    MemoryStats device, host;                // after the first step
    std::optional<io::TrainingState> halfway; // captured after steps / 2 steps
};

Trained train(const OffloadCase& run, bool offload) {
    std::unique_ptr<nn::CausalLM> model = build(run);
    optim::Trainer trainer(*model, config_of(run, offload));
    int cursor = 0;
    const nn::BatchSource source = batches_of(*model, cursor);
    Trained result;
    for (int step = 0; step < steps; ++step) {
        const std::optional<optim::StepResult> stepped = trainer.train_step(source);
        EXPECT_TRUE(stepped.has_value());
        result.losses.push_back(stepped->loss);
        result.norms.push_back(stepped->grad_norm);
        if (step == 0) result.device = stepped->memory, result.host = stepped->host_memory;
        if (step + 1 == steps / 2) result.halfway = optim::capture_training_state(trainer, nullptr);
    }
    result.masters = master_bytes(*model);
    return result;
}

class OffloadOptimizer : public ::testing::TestWithParam<OffloadCase> {
protected:
    void SetUp() override {
        if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
        engine::cuda::set_tf32_enabled(false);
    }
};

// One test per model, three claims over the same runs:
// - the weights are bitwise the all-on-device run's: the host AdamW runs the CPU kernel, the device AdamW its
//   CUDA twin, the same operations in the same order; the gradients and their norm are the device's in both
//   runs; bf16 rounds with one function everywhere;
// - the bytes are where they should be: on the device no optimizer state and, of the parameters, only the
//   working copies; on the host the masters, their gradients and both moments;
// - a state captured halfway (from the host tensors) restores into a new model and trainer and continues
//   bitwise as the straight run.
TEST_P(OffloadOptimizer, BitwiseTheAllOnDeviceRunWithTheStateOnTheHost) {
    const OffloadCase& run = GetParam();
    const Trained on_device = train(run, false);
    const Trained offloaded = train(run, true);
    for (int step = 0; step < steps; ++step) {
        EXPECT_EQ(offloaded.losses[step], on_device.losses[step]) << "step " << step + 1;
        EXPECT_EQ(offloaded.norms[step], on_device.norms[step]) << "step " << step + 1;
    }
    ASSERT_EQ(offloaded.masters.size(), on_device.masters.size());
    for (size_t index = 0; index < on_device.masters.size(); ++index)
        EXPECT_TRUE(offloaded.masters[index] == on_device.masters[index]) << "parameter " << index;

    const std::unique_ptr<nn::CausalLM> model = build(run);
    size_t masters = 0, working = 0;
    for (const auto& [name, parameter] : model->named_parameters()) {
        masters += parameter.storage_bytes();
        working += parameter.storage_bytes() / dtype_size(parameter.dtype()) * dtype_size(precision_dtype(run.precision));
    }
    const auto device = [](const Trained& trained, MemoryCategory category) { return trained.device.current(category); };
    const auto host = [](const Trained& trained, MemoryCategory category) { return trained.host.current(category); };
    EXPECT_EQ(device(offloaded, MemoryCategory::optimizer_state), 0u);
    EXPECT_GT(device(on_device, MemoryCategory::optimizer_state), 0u);
    EXPECT_EQ(host(offloaded, MemoryCategory::optimizer_state), device(on_device, MemoryCategory::optimizer_state));
    // The device's parameters: the working copies and the buffers both runs build alike (Llama's RoPE tables).
    const size_t constant = device(on_device, MemoryCategory::parameters) - masters -
                            (run.precision == Precision::bf16 ? working : 0);
    // Streamed parameters: every decoder layer's working copy is parked on the host between its uses (every
    // decoder layer is checkpointed in these runs), and on the device during its use.
    size_t parked = 0, largest_parked = 0;
    if (run.parameters)
        for (int layer = 0; layer < model->block_count(); ++layer) {
            size_t bytes = 0;
            for (const Tensor& parameter : model->block(layer).parameters())
                bytes += parameter.storage_bytes() / dtype_size(parameter.dtype()) * dtype_size(precision_dtype(run.precision));
            parked += bytes;
            largest_parked = std::max(largest_parked, bytes);
        }
    EXPECT_EQ(device(offloaded, MemoryCategory::parameters), working + constant - parked);
    // Two layers at once: the one that runs and the next, prefetched (these runs checkpoint every layer).
    const size_t fetched = std::min<size_t>(2, static_cast<size_t>(model->block_count())) * largest_parked;
    EXPECT_EQ(offloaded.device.peak(MemoryCategory::parameters), working + constant - parked + fetched);
    EXPECT_EQ(host(offloaded, MemoryCategory::parameters), masters);
    EXPECT_EQ(host(offloaded, MemoryCategory::pinned_host), parked) << "the parked copies are pinned";
    // Gradients: the masters' f32 buffers on the host; on the device the window's, or with streamed gradients
    // only those outside the checkpointed layers between steps, and one layer's more during its backward.
    EXPECT_EQ(host(offloaded, MemoryCategory::gradients), device(on_device, MemoryCategory::gradients));
    if (run.gradients == GradientOffload::window) {
        EXPECT_EQ(device(offloaded, MemoryCategory::gradients), device(on_device, MemoryCategory::gradients));
    } else {
        size_t streamed = 0, largest_layer = 0; // every decoder layer is checkpointed in these runs
        for (int layer = 0; layer < model->block_count(); ++layer) {
            size_t bytes = 0;
            for (const Tensor& parameter : model->block(layer).parameters()) bytes += parameter.storage_bytes();
            streamed += bytes;
            largest_layer = std::max(largest_layer, bytes);
        }
        EXPECT_EQ(device(offloaded, MemoryCategory::gradients), device(on_device, MemoryCategory::gradients) - streamed);
        EXPECT_EQ(offloaded.device.peak(MemoryCategory::gradients),
                  device(on_device, MemoryCategory::gradients) - streamed + largest_layer);
    }
    EXPECT_LT(offloaded.device.peak_bytes, on_device.device.peak_bytes);

    std::unique_ptr<nn::CausalLM> resumed_model = build(run);
    optim::Trainer resumed(*resumed_model, config_of(run, true));
    ASSERT_TRUE(offloaded.halfway.has_value());
    optim::restore_training_state(*offloaded.halfway, resumed, nullptr);
    int cursor = steps / 2 * micro_batches;
    const nn::BatchSource source = batches_of(*resumed_model, cursor);
    for (int step = steps / 2; step < steps; ++step) {
        const std::optional<optim::StepResult> stepped = resumed.train_step(source);
        ASSERT_TRUE(stepped.has_value());
        EXPECT_EQ(stepped->loss, offloaded.losses[step]) << "resumed step " << step + 1;
    }
    EXPECT_TRUE(master_bytes(*resumed_model) == offloaded.masters) << "resumed weights";
    std::printf("  %s: losses %.6f -> %.6f bitwise over %zu parameters; device peak %zu -> %zu B; host %zu B of "
                "masters, %zu of moments\n",
                run.name, on_device.losses.front(), on_device.losses.back(), on_device.masters.size(),
                on_device.device.peak_bytes, offloaded.device.peak_bytes, host(offloaded, MemoryCategory::parameters),
                host(offloaded, MemoryCategory::optimizer_state));
}

INSTANTIATE_TEST_SUITE_P(
    Models, OffloadOptimizer,
    ::testing::Values(OffloadCase{"gpt_fp32", false, true, Precision::fp32, false},
                      OffloadCase{"gpt_bf16_checkpointed", false, true, Precision::bf16, true},
                      OffloadCase{"llama_fp32_checkpointed", true, false, Precision::fp32, true},
                      OffloadCase{"llama_bf16", true, false, Precision::bf16, false},
                      OffloadCase{"llama_tied_bf16", true, true, Precision::bf16, false},
                      OffloadCase{"gpt_bf16_streamed", false, true, Precision::bf16, true, GradientOffload::stream},
                      OffloadCase{"llama_fp32_streamed", true, false, Precision::fp32, true, GradientOffload::stream},
                      OffloadCase{"gpt_bf16_streamed_parameters", false, true, Precision::bf16, true,
                                  GradientOffload::stream, true},
                      OffloadCase{"llama_tied_fp32_parameters", true, true, Precision::fp32, true,
                                  GradientOffload::window, true},
                      // The streaming head writes the head's gradient during the forward: still bitwise the
                      // all-on-device run with the window's and the streamed gradients.
                      OffloadCase{"gpt_bf16_loss_chunks_streamed", false, true, Precision::bf16, true,
                                  GradientOffload::stream, false, 9},
                      OffloadCase{"llama_tied_fp32_loss_chunks", true, true, Precision::fp32, false,
                                  GradientOffload::window, false, 11}),
    [](const ::testing::TestParamInfo<OffloadCase>& info) { return std::string(info.param.name); });

// On the device, the streaming head trains as the whole logits do: one chunk of every token bitwise, small
// chunks to the rounding of the head's weight-gradient sums (GPT-2 tied and padded, Llama untied; bf16, f32).
TEST(StreamingHeadOnDevice, TrainsAsTheWholeLogits) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    engine::cuda::set_tf32_enabled(false);
    for (OffloadCase run : {OffloadCase{"gpt_bf16", false, true, Precision::bf16, true},
                            OffloadCase{"llama_fp32", true, false, Precision::fp32, false}}) {
        const Trained whole = train(run, false);
        run.loss_chunk = batch * build(run)->max_seq_len(); // one chunk
        const Trained one_chunk = train(run, false);
        EXPECT_EQ(one_chunk.losses, whole.losses) << run.name;
        EXPECT_TRUE(one_chunk.masters == whole.masters) << run.name << ": one chunk changed the weights";
        run.loss_chunk = 5;
        const Trained chunked = train(run, false);
        for (size_t step = 0; step < whole.losses.size(); ++step)
            // Measured 1.6e-7 apart (bf16, step 2): the head gradient's chunked sums through AdamW.
            EXPECT_NEAR(chunked.losses[step], whole.losses[step], run.precision == Precision::bf16 ? 1e-4 : 1e-5)
                << run.name << " step " << step + 1;
        std::printf("  %s: last loss whole %.7f, one chunk %.7f, chunks of 5 %.7f\n", run.name, whole.losses.back(),
                    one_chunk.losses.back(), chunked.losses.back());
    }
}

// The tiled MLP on the device against the whole one: one tile of every token trains bitwise the same (the GEMMs
// see the same rows), tiles of 5 within the tiled weight-gradient sums' rounding through AdamW.
TEST(TiledMlpOnDevice, TrainsAsTheWholeMlp) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    engine::cuda::set_tf32_enabled(false);
    for (OffloadCase run : {OffloadCase{"gpt_bf16", false, true, Precision::bf16, true},
                            OffloadCase{"llama_fp32", true, false, Precision::fp32, false}}) {
        const Trained whole = train(run, false);
        run.mlp_tile = batch * build(run)->max_seq_len(); // one tile
        const Trained one_tile = train(run, false);
        EXPECT_EQ(one_tile.losses, whole.losses) << run.name;
        EXPECT_TRUE(one_tile.masters == whole.masters) << run.name << ": one tile changed the weights";
        run.mlp_tile = 5;
        const Trained tiled = train(run, false);
        for (size_t step = 0; step < whole.losses.size(); ++step)
            // Measured 8.4e-5 apart (bf16, step 3): the tiles' f32 weight-gradient sums differ in their last bits,
            // and a working copy's bf16 rounding (2^-8 relative) can flip with them; f32 measured equal.
            EXPECT_NEAR(tiled.losses[step], whole.losses[step], run.precision == Precision::bf16 ? 1e-3 : 1e-5)
                << run.name << " step " << step + 1;
        std::printf("  %s: last loss whole %.7f, one tile %.7f, tiles of 5 %.7f\n", run.name, whole.losses.back(),
                    one_tile.losses.back(), tiled.losses.back());
    }
}

// Frozen parameters with the model state on the host: bitwise the all-on-device frozen run with the window's
// gradients, streamed gradients and streamed parameters; the frozen masters keep their bits; the host holds
// gradients and moments for the trainable parameters only, and the device no gradient for a frozen one.
TEST(FrozenOffloaded, BitwiseTheAllOnDeviceFrozenRun) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    engine::cuda::set_tf32_enabled(false);
    for (OffloadCase run : {OffloadCase{"gpt_bf16_streamed_parameters", false, true, Precision::bf16, true,
                                        GradientOffload::stream, true},
                            OffloadCase{"llama_fp32_checkpointed", true, false, Precision::fp32, true},
                            OffloadCase{"llama_tied_bf16_streamed", true, true, Precision::bf16, true,
                                        GradientOffload::stream}}) {
        run.frozen = true;
        const Trained on_device = train(run, false);
        const Trained offloaded = train(run, true);
        EXPECT_EQ(offloaded.losses, on_device.losses) << run.name;
        EXPECT_EQ(offloaded.norms, on_device.norms) << run.name;
        EXPECT_TRUE(offloaded.masters == on_device.masters) << run.name;
        const std::unique_ptr<nn::CausalLM> model = build(run);
        // Under bf16 the frozen masters are stored in bf16 from the trainer's set_compute_dtype on, before they
        // go to the host (docs/TRAINING.md, "Frozen parameters"): their bits are the rounded initial values.
        if (run.precision == Precision::bf16) model->set_compute_dtype(DType::bf16);
        const std::vector<std::vector<unsigned char>> initial = master_bytes(*model);
        size_t trainable_gradients = 0, trainable_moments = 0, frozen = 0;
        const auto named = model->named_parameters();
        for (size_t index = 0; index < named.size(); ++index) {
            const auto& [name, parameter] = named[index];
            if (frozen_parameter(name)) {
                ++frozen;
                EXPECT_EQ(parameter.dtype(), run.precision == Precision::bf16 ? DType::bf16 : DType::f32) << name;
                EXPECT_TRUE(offloaded.masters[index] == initial[index]) << run.name << ": frozen " << name << " moved";
            } else {
                EXPECT_FALSE(offloaded.masters[index] == initial[index]) << run.name << ": " << name << " did not learn";
                trainable_gradients += parameter.storage_bytes();
                trainable_moments += 2 * parameter.nbytes();
            }
        }
        EXPECT_GT(frozen, 0u) << run.name;
        EXPECT_EQ(on_device.device.current(MemoryCategory::gradients), trainable_gradients) << run.name;
        EXPECT_EQ(offloaded.host.current(MemoryCategory::gradients), trainable_gradients) << run.name;
        EXPECT_EQ(offloaded.host.current(MemoryCategory::optimizer_state), trainable_moments) << run.name;
        EXPECT_EQ(offloaded.device.current(MemoryCategory::optimizer_state), 0u) << run.name;
        std::printf("  %s frozen: %zu of %zu parameters frozen, losses %.6f -> %.6f bitwise; host %zu B of gradients\n",
                    run.name, frozen, named.size(), on_device.losses.front(), on_device.losses.back(),
                    offloaded.host.current(MemoryCategory::gradients));
    }
}

// Nothing to move on the host: the trainer says so before anything changes (bf16 would make copies first).
TEST(OffloadOptimizerInput, AModelOnTheHostIsRefused) {
    nn::GPT model(small_gpt_config(), 11, Device::cpu);
    optim::TrainerConfig config;
    config.shape.offload_optimizer = true;
    config.shape.precision = Precision::bf16;
    try {
        optim::Trainer trainer(model, config);
        FAIL() << "offload_optimizer on a model on the host must throw";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("offload_optimizer"), std::string::npos) << error.what();
    }
    EXPECT_EQ(model.device(), Device::cpu);
    EXPECT_FALSE(model.master_device().has_value());
    EXPECT_EQ(model.compute_dtype(), DType::f32) << "the refused trainer changed the model";
}

// A model whose masters are apart trains only with offload (its gradients would never reach the masters), and
// one built on the host and placed on the device (as train_gpt builds it) trains bitwise as one moved there.
TEST(OffloadOptimizerInput, PlacementIsChecked) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    nn::GPT placed(small_gpt_config(), 11, Device::cpu);
    placed.set_master_device(Device::cpu, Device::cuda);
    EXPECT_EQ(placed.device(), Device::cuda);
    optim::TrainerConfig plain;
    try {
        optim::Trainer trainer(placed, plain);
        FAIL() << "a trainer without offload on a model whose masters are apart must throw";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("offload_optimizer"), std::string::npos) << error.what();
    }
    EXPECT_THROW(placed.to(Device::cpu), EngineError);
    EXPECT_THROW(placed.set_master_device(Device::cuda), EngineError);

    const OffloadCase run{"gpt_fp32", false, true, Precision::fp32, false};
    // One run after the other: the trainers seed the one process-wide generator that dropout draws from.
    std::vector<double> host_losses, device_losses;
    {
        optim::Trainer host_built(placed, config_of(run, true));
        int cursor = 0;
        const nn::BatchSource source = batches_of(placed, cursor);
        for (int step = 0; step < 2; ++step) host_losses.push_back(host_built.train_step(source)->loss);
    }
    std::unique_ptr<nn::CausalLM> moved = build(run);
    {
        optim::Trainer device_built(*moved, config_of(run, true));
        int cursor = 0;
        const nn::BatchSource source = batches_of(*moved, cursor);
        for (int step = 0; step < 2; ++step) device_losses.push_back(device_built.train_step(source)->loss);
    }
    EXPECT_EQ(host_losses, device_losses);
    EXPECT_TRUE(master_bytes(placed) == master_bytes(*moved));
}

// Placing a model for streamed gradients and parameters (train_gpt's order: built on the host, the streamed
// layers marked, then the masters placed) never holds the streamed layers' copies or gradient buffers on the
// device beyond one module's at a time: after placement the device holds only what stays there (the
// embeddings' and the head's copies and buffers), and the placement's peak is at most one decoder layer's
// copies and buffers above that.
TEST(OffloadOptimizerInput, StreamedPlacementKeepsTheStreamedLayersOffTheDevice) {
    if (!engine::cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    nn::Llama model(small_llama_config(false), 11, Device::cpu);
    StepShape shape;
    shape.precision = Precision::bf16;
    shape.checkpointing.enabled = true;
    shape.offload_optimizer = true;
    shape.offload_gradients = GradientOffload::stream;
    shape.offload_parameters = true;
    model.set_compute_dtype(DType::bf16);
    model.set_checkpointing(shape.checkpointing);
    optim::mark_streamed_layers(model, shape, false);
    cuda::synchronize(Device::cuda);
    const size_t before = memory_stats(Device::cuda).current_bytes;
    reset_peak(Device::cuda);
    model.set_master_device(Device::cpu, Device::cuda);
    const MemoryStats placed = memory_stats(Device::cuda);
    size_t layers = 0, largest_layer = 0, all = 0;
    for (const Tensor& parameter : model.parameters()) all += static_cast<size_t>(parameter.numel());
    for (int layer = 0; layer < model.block_count(); ++layer) {
        size_t elements = 0;
        for (const Tensor& parameter : model.block(layer).parameters()) elements += static_cast<size_t>(parameter.numel());
        layers += elements;
        largest_layer = std::max(largest_layer, elements);
    }
    const size_t per_element = sizeof(uint16_t) + sizeof(float); // a bf16 copy and its f32 gradient buffer
    EXPECT_EQ(placed.current(MemoryCategory::parameters), (all - layers) * sizeof(uint16_t));
    EXPECT_EQ(placed.current(MemoryCategory::gradients), (all - layers) * sizeof(float));
    EXPECT_LE(placed.peak_bytes - before, (all - layers + largest_layer) * per_element);
    for (int layer = 0; layer < model.block_count(); ++layer)
        EXPECT_TRUE(model.block(layer).working_copies_parked()) << "layer " << layer;
    std::printf("  placement: device %zu B after, peak %zu B above the start; all copies and buffers on the device "
                "would be %zu B\n",
                placed.current_bytes - before, placed.peak_bytes - before, all * per_element);
}

} // namespace
} // namespace engine::test
