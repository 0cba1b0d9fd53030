// Example: your own model, your own loss, the library's trainer. A small MLP (nn::Sequential) learns a
// synthetic regression with gradient accumulation over micro-batches of uneven sizes, normalised per item.
// docs/GUIDE.md walks through it. Exits 1 unless the held-out loss falls below half its initial value.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <vector>

#include "libengine.h" // one include: tensors and ops, nn, checkpoint and optim

using namespace engine;

namespace {

constexpr int features = 4;
constexpr int hidden = 32;
constexpr uint64_t model_seed = 1;
constexpr uint64_t data_seed = 2;

// What one micro-batch is is up to you: the trainer never looks inside it, only at the callbacks of the
// TrainingTask below.
struct RegressionBatch {
    Tensor inputs;  // (R,F)
    Tensor targets; // (R,1)
};

// The function to learn: nonlinear in x0, a product of x1 and x2, linear in x3.
float target_of(const float* x) { return std::sin(2.0f * x[0]) + x[1] * x[2] - 0.5f * x[3]; }

// Batch number `index` is drawn from its own Philox stream, so the data are the same on every platform and
// independent of the order in which batches are made.
RegressionBatch make_batch(int rows, uint64_t index) {
    Tensor inputs = nn::uniform_tensor({rows, features}, 1.0, data_seed, index, DType::f32); // (R,F)
    const std::vector<float> x = inputs.to_vector<float>();
    std::vector<float> y(static_cast<size_t>(rows));
    for (int row = 0; row < rows; ++row) y[static_cast<size_t>(row)] = target_of(&x[static_cast<size_t>(row * features)]);
    return {inputs, Tensor::from_vector<float>(y, {rows, 1}, Device::cpu)};
}

} // namespace

int main() {
    try {
        // Sequential builds one layer at a time (see nn/sequential.h for why there is no variadic
        // constructor), each drawing its initial values from the default generator in order: seeding it first
        // makes the model the same on every run.
        nn::manual_seed(model_seed);
        nn::Sequential model;
        model.emplace<nn::Linear>(features, hidden);
        model.emplace<nn::GELU>();
        model.emplace<nn::Linear>(hidden, hidden);
        model.emplace<nn::Lambda>(relu); // any op, or a composition of ops, becomes a layer this way
        model.emplace<nn::Linear>(hidden, 1);

        // The task tells the trainer two things about a batch. count_items runs BEFORE any forward: in token
        // (item) mode every micro-batch's loss is divided by the item count of the whole window, which must
        // therefore be known before the window's first backward. The loss returns a SUM over items and how
        // many items it covers; the trainer, not the loss, normalises. A loss that returned a per-micro-batch
        // mean would weigh the items of a small micro-batch more than those of a big one (the "gradient
        // accumulation bug").
        optim::TrainingTask<RegressionBatch> task;
        task.count_items = [](const RegressionBatch& batch) { return batch.inputs.size(0); };
        task.loss = [&model](const RegressionBatch& batch, const optim::LossScale&) {
            // Reduction::sum, not mean: a sum of squared errors over the micro-batch's R rows.
            return optim::LossSum{mse_loss(model.forward(batch.inputs), batch.targets, Reduction::sum),
                                  batch.inputs.size(0)};
        };
        task.count_tokens = [](const RegressionBatch& batch) { return batch.inputs.size(0); };

        // Three micro-batches per optimizer step, of 16, 5 and 11 rows: with LossNormalization::tokens the
        // step's gradient is exactly that of the mean squared error over all 32 rows, as if they had been one
        // batch, whatever the split. Memory holds only one micro-batch's activations at a time.
        optim::TrainerConfig config;
        config.shape.gradient_accumulation_steps = 3;
        config.loss_normalization = optim::LossNormalization::tokens;
        config.learning_rate = 1e-2;
        config.lr_scheduler_type = "cosine";
        config.warmup_steps = 5;
        config.max_steps = 80;
        config.max_grad_norm = 1.0; // one clip per step, on the accumulated gradient
        optim::ModuleTrainer trainer(model, config);

        // A source hands out micro-batches one at a time, and nullopt when the data end; train_step pulls up
        // to gradient_accumulation_steps of them. Here the data never end: the loop ends at max_steps.
        const std::vector<int> rows_per_micro_batch = {16, 5, 11};
        uint64_t next_batch = 0;
        const std::function<std::optional<RegressionBatch>()> source = [&]() -> std::optional<RegressionBatch> {
            const int rows = rows_per_micro_batch[next_batch % rows_per_micro_batch.size()];
            return make_batch(rows, next_batch++);
        };

        // Held-out data from streams training never reaches, measured the same way before and after:
        // evaluate runs without a tape, in eval mode, and returns the item mean over all its micro-batches.
        std::vector<optim::MicroBatch> held_out;
        for (uint64_t index = 0; index < 4; ++index) held_out.push_back(task.micro_batch(make_batch(64, 1000000 + index)));
        const double initial = trainer.evaluate(held_out).loss;
        std::printf("custom_mlp: %zu parameters, held-out loss before training %.5f\n", model.parameter_count(), initial);

        while (trainer.step() < config.max_steps) {
            const optim::StepResult result = *trainer.train_step(source, task);
            std::printf("step %3lld  loss %.5f  items %lld in %d micro-batches  lr %.2e  grad norm %.3f\n",
                        static_cast<long long>(result.step), result.loss,
                        static_cast<long long>(result.num_items_in_batch), result.micro_batches,
                        result.learning_rate, result.grad_norm);
        }

        const double final_loss = trainer.evaluate(held_out).loss;
        std::printf("custom_mlp: held-out loss %.5f -> %.5f (%.1f%% of the initial)\n", initial, final_loss,
                    100.0 * final_loss / initial);
        if (!(final_loss < 0.5 * initial)) {
            std::printf("custom_mlp: FAILED, the loss did not fall below half its initial value\n");
            return 1;
        }
        std::printf("custom_mlp: ok\n");
        return 0;
    } catch (const std::exception& error) {
        std::printf("custom_mlp: %s\n", error.what());
        return 1;
    }
}
