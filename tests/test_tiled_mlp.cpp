// checkpoint::tiled_rows, the sequence-tiled MLP: the output bitwise the untiled function's and the gradients
// within the tiled summation's bound (bitwise with one tile); float64 central differences; no-grad; bad input
// changing nothing; and the trainer (GPT-2 with dropout and Llama, f32 and bf16, checkpointing, accumulation and
// padded labels) against the untiled MLP.
#include <cmath>

#include "expect_error.h"
#include "gradcheck.h"
#include "nn/llama.h"
#include "optim/trainer.h"
#include "token_stream.h"

namespace engine::testing {
namespace {

constexpr int batch = 2, time_steps = 7, width = 5, hidden_width = 9;
constexpr int rows = batch * time_steps;

// A GPT-2-style MLP over f64 leaves: c_proj(gelu(c_fc(x))), biased; row-wise, as tiled_rows needs.
class TiledRows : public TapeTest {
protected:
    Tensor input = random_leaf(generator, {batch, time_steps, width});
    Tensor fc_weight = random_leaf(generator, {width, hidden_width}, 0.5);
    Tensor fc_bias = random_leaf(generator, {hidden_width}, 0.5);
    Tensor projection = random_leaf(generator, {hidden_width, width}, 0.5);
    Tensor upstream = random_tensor(generator, {batch, time_steps, width}); // weights of the scalar loss

    Tensor mlp(const Tensor& x) const { return matmul(gelu(linear(x, fc_weight, fc_bias)), projection); }
    std::vector<Tensor> leaves() const { return {input, fc_weight, fc_bias, projection}; }

    struct Run {
        std::vector<double> output;
        std::vector<std::vector<double>> gradients; // per leaf
    };
    // tile 0: the untiled MLP.
    Run run(int64_t tile) {
        current_tape().clear();
        zero_grad(leaves());
        const auto function = [this](const Tensor& x) { return mlp(x); };
        const Tensor output = tile == 0 ? mlp(input) : checkpoint::tiled_rows(function, input, tile);
        Run result;
        result.output = output.to_vector<double>();
        backward(weighted_sum(output, upstream));
        for (const Tensor& leaf : leaves()) result.gradients.push_back(leaf.grad().to_vector<double>());
        return result;
    }
};

// Every tile size gives the untiled output bit for bit (each row's arithmetic is the same: this BLAS adds each
// product into C in k order whatever the row count) and the same d(input) rows; the parameters' gradients are
// the tiles' sums added up, within 2·tiles·u·Σ|terms| (a recursive sum of `tiles` partial sums, each itself within
// its bound) of the untiled ones, and bitwise with one tile; and a tiled run repeats bitwise.
TEST_F(TiledRows, OutputIsBitwiseUntiledAndGradientsWithinTheTiledSumsBound) {
    const Run untiled = run(0);
    for (const int64_t tile : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{rows}, int64_t{rows + 4}}) {
        const std::string what = "tile " + std::to_string(tile);
        checkpoint::reset_tiled_row_tile_count();
        const Run tiled = run(tile);
        const int64_t tiles = (rows + std::min<int64_t>(tile, rows) - 1) / std::min<int64_t>(tile, rows);
        EXPECT_EQ(checkpoint::tiled_row_tile_count(), static_cast<size_t>(2 * tiles)) << what << ": forward + backward";
        EXPECT_EQ(tiled.output, untiled.output) << what;
        EXPECT_EQ(tiled.gradients[0], untiled.gradients[0]) << what << ": d(input) rows are row-wise";
        const double unit = std::ldexp(1.0, -53);
        for (size_t leaf = 1; leaf < tiled.gradients.size(); ++leaf) {
            for (size_t i = 0; i < tiled.gradients[leaf].size(); ++i) {
                // The terms are of order one (unit inputs and upstream weights, half-unit parameters).
                const double bound = 2.0 * static_cast<double>(rows) * unit * (std::fabs(untiled.gradients[leaf][i]) + 1.0);
                EXPECT_NEAR(tiled.gradients[leaf][i], untiled.gradients[leaf][i], bound) << what << " leaf " << leaf;
                if (tiles == 1) EXPECT_EQ(tiled.gradients[leaf][i], untiled.gradients[leaf][i]) << what;
            }
        }
        const Run again = run(tile);
        EXPECT_EQ(again.output, tiled.output) << what;
        EXPECT_EQ(again.gradients, tiled.gradients) << what;
    }
}

TEST_F(TiledRows, GradientsMatchCentralDifferences) {
    for (const int64_t tile : {int64_t{1}, int64_t{4}, int64_t{rows}}) {
        const auto loss = [&] {
            return weighted_sum(checkpoint::tiled_rows([this](const Tensor& x) { return mlp(x); }, input, tile), upstream);
        };
        EXPECT_GRADCHECK(gradcheck(loss, leaves()), "tiled_rows tile " + std::to_string(tile));
    }
}

// An input that is no leaf gets its gradient through the context (the tiles' rows of it), and gradients add up
// with another consumer's.
TEST_F(TiledRows, AnInputThatIsNoLeafGetsItsGradientThroughTheWalk) {
    const auto function = [this](const Tensor& x) { return mlp(x); };
    const auto loss_of = [&](int64_t tile) {
        current_tape().clear();
        zero_grad(leaves());
        const Tensor doubled = multiply(input, 2.0); // (B,T,C), a non-leaf
        const Tensor output = tile == 0 ? mlp(doubled) : checkpoint::tiled_rows(function, doubled, tile);
        backward(add(weighted_sum(output, upstream), weighted_sum(doubled, upstream)));
        return input.grad().to_vector<double>();
    };
    EXPECT_EQ(loss_of(3), loss_of(0));
}

TEST_F(TiledRows, NoGradComputesTheOutputAndRecordsNothing) {
    const Run untiled = run(0);
    current_tape().clear();
    NoGradGuard no_grad;
    const Tensor output = checkpoint::tiled_rows([this](const Tensor& x) { return mlp(x); }, input, 4);
    EXPECT_EQ(output.to_vector<double>(), untiled.output);
    EXPECT_FALSE(output.requires_grad());
    EXPECT_TRUE(current_tape().empty());
}

TEST_F(TiledRows, BadInputIsRefusedBeforeAnythingChanges) {
    zero_grad(leaves());
    const auto function = [this](const Tensor& x) { return mlp(x); };
    expect_error([&] { checkpoint::tiled_rows(function, input, 0); }, {"tiled_rows: a tile of 0 rows"});
    expect_error([&] { checkpoint::tiled_rows(function, input, -2); }, {"a tile of -2 rows"});
    expect_error([&] { checkpoint::tiled_rows({}, input, 2); }, {"the function is empty"});
    expect_error([&] { checkpoint::tiled_rows(function, Tensor(), 2); }, {"undefined tensor"});
    expect_error([&] { checkpoint::tiled_rows(function, Tensor::zeros({0, width}, DType::f64, Device::cpu), 2); },
                 {"has no rows to tile"});
    // A function that is not row-wise in shape: one row fewer, or its rows reshaped.
    expect_error([&] { checkpoint::tiled_rows([](const Tensor& x) { return slice(x, 0, 1, x.size(0)); }, input, 4); },
                 {"for a tile of 4 rows", "returns (rows, C_out)"});
    expect_error([&] { checkpoint::tiled_rows([](const Tensor& x) { return x.reshape({1, x.numel()}); }, input, 4); },
                 {"for a tile of 4 rows"});
    EXPECT_TRUE(current_tape().empty());
    for (const Tensor& leaf : leaves())
        for (double value : leaf.grad().to_vector<double>()) EXPECT_EQ(value, 0.0);
}

// The trainer with tiled MLPs against the untiled: GPT-2 (dropout 0.1, outside the tiles) and Llama, f32 and bf16,
// plain and checkpointed, two micro-batches with padded labels. One tile of every token: the same bits after three
// steps (the MLP's GEMMs see the same rows); small tiles: the same losses to the weight gradients' rounding through
// AdamW (f32) or one rounding of a working copy (bf16).
struct TrainedRun {
    std::vector<double> losses;
    std::vector<float> weights;
    double evaluated = 0.0;
};

TrainedRun train(const std::string& model_name, Precision precision, bool checkpointed, int tile) {
    current_tape().clear();
    nn::ModelConfig config = nn::ModelConfig::named(model_name);
    if (!config.is_llama()) {
        nn::GPTConfig gpt = config.gpt();
        gpt.dropout = 0.1f;
        config = nn::ModelConfig(gpt);
    }
    const std::unique_ptr<nn::CausalLM> model = config.build(5, Device::cpu, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.per_device_train_batch_size = 2;
    trainer_config.shape.gradient_accumulation_steps = 2;
    trainer_config.shape.precision = precision;
    trainer_config.shape.checkpointing = checkpoint::CheckpointPolicy{checkpointed, 1, 1, false};
    trainer_config.shape.mlp_tile_tokens = tile;
    trainer_config.learning_rate = 3e-3;
    trainer_config.max_steps = 3;
    optim::Trainer trainer(*model, trainer_config);
    EXPECT_EQ(model->mlp_tile_tokens(), tile);
    int cursor = 0;
    const int length = 24;
    const nn::BatchSource source = padded_label_batches(config.vocab_size(), length, cursor);
    TrainedRun trained;
    for (int step = 0; step < 3; ++step) trained.losses.push_back(trainer.train_step(source)->loss);
    trained.evaluated = trainer.evaluate({*source(), *source()}).loss; // no grad: tiled too
    for (const Tensor& parameter : model->parameters()) {
        const std::vector<float> values = cast(parameter, DType::f32).to_vector<float>();
        trained.weights.insert(trained.weights.end(), values.begin(), values.end());
    }
    return trained;
}

TEST(TiledMlpTrainer, MatchesTheWholeMlpBitwiseWithOneTileAndCloselyWithSmallOnes) {
    for (const std::string model : {"tiny", "llama-tiny"}) {
        for (const Precision precision : {Precision::fp32, Precision::bf16}) {
            for (const bool checkpointed : {false, true}) {
                const std::string what = model + " " + precision_name(precision) + (checkpointed ? " checkpointed" : "");
                const TrainedRun whole = train(model, precision, checkpointed, 0);
                const TrainedRun one_tile = train(model, precision, checkpointed, 48);
                EXPECT_EQ(one_tile.losses, whole.losses) << what;
                EXPECT_EQ(one_tile.weights, whole.weights) << what;
                EXPECT_EQ(one_tile.evaluated, whole.evaluated) << what;
                const TrainedRun tiled = train(model, precision, checkpointed, 10);
                EXPECT_NEAR(tiled.evaluated, whole.evaluated, precision == Precision::bf16 ? 2e-3 : 1e-5) << what;
                for (size_t step = 0; step < whole.losses.size(); ++step)
                    EXPECT_NEAR(tiled.losses[step], whole.losses[step], precision == Precision::bf16 ? 2e-3 : 1e-5)
                        << what << " step " << step;
            }
        }
    }
}

TEST(TiledMlpTrainer, ANegativeTileIsRefused) {
    const nn::ModelConfig config = nn::ModelConfig::named("tiny");
    const std::unique_ptr<nn::CausalLM> model = config.build(5, Device::cpu, DType::f32);
    optim::TrainerConfig trainer_config;
    trainer_config.shape.mlp_tile_tokens = -1;
    expect_error([&] { optim::Trainer refused(*model, trainer_config); }, {"mlp_tile_tokens"});
    expect_error([&] { model->set_mlp_tile_tokens(-4); }, {"set_mlp_tile_tokens: a tile of -4 tokens"});
    EXPECT_EQ(model->mlp_tile_tokens(), 0);
}

} // namespace
} // namespace engine::testing
