// Example: a model of your own whose blocks are recomputed in backward (activation checkpointing) with their
// saved inputs offloaded to pinned host memory, trained by the library's trainer. It shows the one method a
// model overrides for the trainer's gradient_checkpointing/offload flags to reach it, checks that
// checkpointing changes no gradient bit, and prints the memory peaks by category. docs/GUIDE.md walks
// through it. Exits 1 unless the gradients match, the offload happened, the activations peak fell and the
// held-out loss halved.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "libengine.h"

using namespace engine;

namespace {

constexpr int features = 8;
constexpr int channels = 32;
constexpr int classes = 3;
constexpr int block_count = 4;
constexpr uint64_t model_seed = 3;
constexpr uint64_t data_seed = 4;

// A pre-LayerNorm residual MLP block, x + W2·gelu(W1·ln(x)): the unit we checkpoint. Its hidden layer is 4×
// wider than its input, so what it saves for backward (the LayerNorm output, the two hidden tensors) is
// several times the one input a checkpoint keeps: that ratio is what checkpointing trades compute for.
class ResidualBlock : public nn::Layer {
public:
    ResidualBlock() : norm(channels), expand(channels, 4 * channels), contract(4 * channels, channels) {
        register_module("norm", norm);
        register_module("expand", expand);
        register_module("contract", contract);
    }
    Tensor forward(const Tensor& input) const override { // (R,C) -> (R,C)
        return add(input, contract.forward(gelu(expand.forward(norm.forward(input)))));
    }
    nn::LayerNorm norm;
    nn::Linear expand, contract;
};

// features -> channels, a stack of blocks, -> class logits.
class ResidualClassifier : public nn::Module {
public:
    ResidualClassifier() : embed(features, channels), head(channels, classes) {
        register_module("embed", embed);
        for (int index = 0; index < block_count; ++index) {
            blocks.push_back(std::make_unique<ResidualBlock>());
            register_module("blocks." + std::to_string(index), *blocks.back());
        }
        register_module("head", head);
        set_checkpointing(checkpoint::CheckpointPolicy{}); // start plain: one uncheckpointed segment per block
    }

    // The seam the trainer uses (TrainerConfig::gradient_checkpointing, every_n_layers, segment_size,
    // offload, prefetch all arrive here as one policy). Only the model knows which of its layers may be
    // recomputed and how they chain, so the trainer asks it, as GPT does. Module's default refuses an
    // enabled policy, so a model that does not override this never silently trains without checkpointing.
    void set_checkpointing(const checkpoint::CheckpointPolicy& policy) override {
        segments_ = checkpoint::plan_segments(block_count, policy);
        policy_ = policy;
    }

    Tensor forward(const Tensor& inputs) const { // (R,F) -> (R,K)
        Tensor x = embed.forward(inputs); // (R,C)
        for (const checkpoint::Segment& segment : segments_) {
            if (!segment.checkpointed) {
                x = run_blocks(x, segment.first_layer, segment.layer_count);
                continue;
            }
            // checkpoint keeps only the segment's input (in pinned host memory with offload) and records one
            // node; backward re-runs this function on that input. The function may capture the model (its
            // parameters are leaves whose gradient buffers the recompute adds into) but must compute from its
            // arguments, not from tensors of this forward, or the recompute would keep them alive after all.
            const auto segment_function = [this, segment](const std::vector<Tensor>& segment_inputs) {
                return std::vector<Tensor>{run_blocks(segment_inputs[0], segment.first_layer, segment.layer_count)};
            };
            x = checkpoint::checkpoint(segment_function, {x}, policy_.offload, policy_.prefetch)[0];
        }
        return head.forward(x);
    }

    nn::Linear embed;
    std::vector<std::unique_ptr<ResidualBlock>> blocks;
    nn::Linear head;

private:
    Tensor run_blocks(const Tensor& input, int first, int count) const {
        Tensor x = input;
        for (int index = first; index < first + count; ++index) x = blocks[static_cast<size_t>(index)]->forward(x);
        return x;
    }
    checkpoint::CheckpointPolicy policy_;
    std::vector<checkpoint::Segment> segments_;
};

// Rows of features and a class per row; -100 (the ignore index) marks padding rows, which are no items.
struct ClassificationBatch {
    Tensor inputs;  // (R,F)
    Tensor targets; // (R) i32
};

// The label is the largest of three fixed linear scores of the features: learnable, not trivially.
ClassificationBatch make_batch(int rows, int padding_rows, uint64_t index) {
    static const std::vector<float> scores = nn::uniform_tensor({features, classes}, 1.0, data_seed, 0, DType::f32)
                                                 .to_vector<float>(); // (F,K)
    Tensor inputs = nn::uniform_tensor({rows, features}, 1.0, data_seed, 1 + index, DType::f32); // (R,F)
    const std::vector<float> x = inputs.to_vector<float>();
    std::vector<int32_t> targets(static_cast<size_t>(rows), default_ignore_index);
    for (int row = 0; row < rows - padding_rows; ++row) {
        float best = -1e30f;
        for (int label = 0; label < classes; ++label) {
            float score = 0.0f;
            for (int feature = 0; feature < features; ++feature)
                score += x[static_cast<size_t>(row * features + feature)] * scores[static_cast<size_t>(feature * classes + label)];
            if (score > best) best = score, targets[static_cast<size_t>(row)] = label;
        }
    }
    return {inputs, Tensor::from_vector<int32_t>(targets, {rows}, Device::cpu)};
}

optim::TrainingTask<ClassificationBatch> task_for(const ResidualClassifier& model) {
    optim::TrainingTask<ClassificationBatch> task;
    // Items are the rows with a real target, counted on the host before the forward (the trainer divides by
    // the window's total before the first backward).
    task.count_items = [](const ClassificationBatch& batch) {
        int64_t items = 0;
        for (int32_t target : batch.targets.to_vector<int32_t>()) items += target != default_ignore_index;
        return items;
    };
    task.loss = [&model, count = task.count_items](const ClassificationBatch& batch, const optim::LossScale&) {
        return optim::LossSum{cross_entropy(model.forward(batch.inputs), batch.targets, Reduction::sum), count(batch)};
    };
    task.count_tokens = [](const ClassificationBatch& batch) { return batch.inputs.size(0); };
    return task;
}

// Micro-batch `index` of the stream: 48, 20 and 36 rows, some of them padding.
ClassificationBatch training_batch(uint64_t index) {
    static const int rows[] = {48, 20, 36};
    static const int padding[] = {6, 0, 9};
    return make_batch(rows[index % 3], padding[index % 3], index);
}

optim::TrainerConfig config_for(bool checkpointing) {
    optim::TrainerConfig config;
    config.shape.gradient_accumulation_steps = 3;
    config.learning_rate = 3e-3;
    config.max_steps = 40;
    config.shape.checkpointing.enabled = checkpointing;
    config.shape.checkpointing.every_n_layers = 1; // every block is a checkpointed segment...
    config.shape.checkpointing.segment_size = 1;   // ...of one block
    config.shape.checkpointing.offload = checkpointing;
    return config;
}

std::vector<std::vector<float>> gradients_of(const nn::Module& model) {
    std::vector<std::vector<float>> gradients;
    for (const Tensor& parameter : model.parameters()) gradients.push_back(parameter.grad().to_vector<float>());
    return gradients;
}

bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t which = 0; which < a.size(); ++which)
        if (a[which].size() != b[which].size() ||
            std::memcmp(a[which].data(), b[which].data(), a[which].size() * sizeof(float)) != 0)
            return false;
    return true;
}

// One window's forward and backward without an update, and the activation and pinned-host peaks it reached.
struct Window {
    std::vector<std::vector<float>> gradients;
    size_t activation_peak = 0;
    size_t pinned_peak = 0;
};
Window first_window(bool checkpointing) {
    nn::manual_seed(model_seed); // both models start from the same values
    ResidualClassifier model;
    optim::ModuleTrainer trainer(model, config_for(checkpointing));
    const optim::TrainingTask<ClassificationBatch> task = task_for(model);
    std::vector<optim::MicroBatch> micro_batches;
    for (uint64_t index = 0; index < 3; ++index) micro_batches.push_back(task.micro_batch(training_batch(index)));
    reset_peak(Device::cpu);
    trainer.accumulate(micro_batches);
    const MemoryStats memory = memory_stats(Device::cpu); // pinned_host is host memory, counted under cpu
    return {gradients_of(model), memory.peak(MemoryCategory::activations), memory.peak(MemoryCategory::pinned_host)};
}

void print_peaks(const MemoryStats& memory) {
    for (int category = 0; category < memory_category_count; ++category)
        std::printf("  %-16s peak %8zu bytes\n", memory_category_name(static_cast<MemoryCategory>(category)),
                    memory.peak_by_category[static_cast<size_t>(category)]);
}

} // namespace

int main() {
    try {
        // 1. Checkpointing is an exact trade of compute for memory: the recompute runs the same kernels on
        // the same inputs in the same order, so the gradients must match the plain model's to the bit. (A
        // model with dropout would too: the segment replays its random stream.)
        const Window plain = first_window(false);
        const Window checkpointed = first_window(true);
        const bool same_gradients = bitwise_equal(plain.gradients, checkpointed.gradients);
        std::printf("checkpointed_model: one window, plain vs checkpointed+offload gradients %s\n",
                    same_gradients ? "bitwise equal" : "DIFFER");
        std::printf("  activations peak %zu bytes plain, %zu checkpointed; pinned_host peak %zu plain, %zu checkpointed\n",
                    plain.activation_peak, checkpointed.activation_peak, plain.pinned_peak, checkpointed.pinned_peak);

        // 2. Training with the policy on. The trainer applies it through model.set_checkpointing.
        nn::manual_seed(model_seed);
        ResidualClassifier model;
        const optim::TrainerConfig config = config_for(true);
        optim::ModuleTrainer trainer(model, config);
        const optim::TrainingTask<ClassificationBatch> task = task_for(model);
        uint64_t next_batch = 0;
        const std::function<std::optional<ClassificationBatch>()> source = [&]() -> std::optional<ClassificationBatch> {
            return training_batch(next_batch++);
        };
        std::vector<optim::MicroBatch> held_out;
        for (uint64_t index = 0; index < 4; ++index) held_out.push_back(task.micro_batch(make_batch(64, 0, 1000000 + index)));
        const double initial = trainer.evaluate(held_out).loss;
        std::printf("checkpointed_model: %zu parameters, policy %s, held-out loss before training %.5f\n",
                    model.parameter_count(), config.shape.checkpointing.to_string().c_str(), initial);

        optim::StepResult last;
        while (trainer.step() < config.max_steps) {
            last = *trainer.train_step(source, task);
            std::printf("step %3lld  loss %.5f  items %lld  grad norm %.3f\n", static_cast<long long>(last.step),
                        last.loss, static_cast<long long>(last.num_items_in_batch), last.grad_norm);
        }
        // StepResult::memory holds the model device's statistics with peaks over that step alone.
        std::printf("checkpointed_model: memory peaks of the last step, by category:\n");
        print_peaks(last.memory);

        const double final_loss = trainer.evaluate(held_out).loss;
        std::printf("checkpointed_model: held-out loss %.5f -> %.5f (%.1f%% of the initial)\n", initial, final_loss,
                    100.0 * final_loss / initial);
        bool ok = true;
        if (!same_gradients) ok = false, std::printf("checkpointed_model: FAILED, checkpointing changed the gradients\n");
        if (last.memory.peak(MemoryCategory::pinned_host) == 0 || checkpointed.pinned_peak == 0)
            ok = false, std::printf("checkpointed_model: FAILED, no pinned host memory was used: nothing was offloaded\n");
        if (!(checkpointed.activation_peak < plain.activation_peak))
            ok = false, std::printf("checkpointed_model: FAILED, checkpointing did not lower the activations peak\n");
        if (!(final_loss < 0.5 * initial))
            ok = false, std::printf("checkpointed_model: FAILED, the loss did not fall below half its initial value\n");
        if (!ok) return 1;
        std::printf("checkpointed_model: ok\n");
        return 0;
    } catch (const std::exception& error) {
        std::printf("checkpointed_model: %s\n", error.what());
        return 1;
    }
}
