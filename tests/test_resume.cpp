// Exact resume: 2K optimizer steps straight equal K steps, a save, and K more in a fresh model, trainer
// and loader restored from the state directory, bitwise on the CPU, with dropout, gradient accumulation,
// checkpointing and a warmup + cosine schedule all on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "engine/random.h"
#include "optim/training_state.h"
#include "tests/parameter_snapshot.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

constexpr int64_t half_steps = 3; // K

nn::GPTConfig model_config() {
    nn::GPTConfig config;
    config.vocab_size = 256; // byte-level corpus
    config.max_seq_len = 16;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 16;
    config.dropout = 0.1f; // so that the RNG position matters
    return config;
}

optim::TrainerConfig trainer_config() {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.shape.gradient_accumulation_steps = 3;
    config.learning_rate = 3e-3;
    config.weight_decay = 0.1;
    config.lr_scheduler_type = "cosine";
    config.warmup_steps = 2;
    config.max_steps = 2 * half_steps;
    config.shape.checkpointing.enabled = true;
    config.shape.checkpointing.every_n_layers = 1;
    config.seed = 7;
    return config;
}

nn::DataLoader make_loader() {
    nn::DataLoaderOptions options;
    options.batch_size = 2;
    options.sequence_length = 12;
    options.seed = 99;
    options.min_valid_length = 5; // variable-length windows: the token-count normalisation matters
    options.vocab_size = 256;
    // Few windows, so that the run crosses an epoch boundary and the reshuffle must resume too.
    return nn::DataLoader(nn::builtin_corpus(12 * 14, 3), options);
}

struct RunEnd {
    std::vector<double> losses; // every step's reported loss, bit for bit
    std::vector<uint8_t> weights;
    std::vector<uint8_t> moments;
    RngState rng;
    nn::LoaderCursor cursor;
};

void train(optim::Trainer& trainer, nn::DataLoader& loader, int64_t steps, RunEnd& end) {
    for (int64_t index = 0; index < steps; ++index) {
        const std::optional<optim::StepResult> result = trainer.train_step(loader.source());
        ASSERT_TRUE(result.has_value());
        end.losses.push_back(result->loss);
    }
    end.weights = bytes_of(trainer.model().named_parameters());
    end.moments = bytes_of(trainer.optimizer().named_state());
    end.rng = rng_state();
    end.cursor = loader.cursor();
}

class Resume : public ::testing::Test {
protected:
    void SetUp() override {
        directory = fs::temp_directory_path() / ("engine_resume_test_" + std::to_string(::getpid()));
        fs::remove_all(directory);
    }
    void TearDown() override { fs::remove_all(directory); }
    fs::path directory;
};

TEST_F(Resume, TwoKStepsEqualKThenSaveResumeAndKMoreBitwise) {
    RunEnd straight;
    {
        nn::GPT model(model_config(), /*seed=*/1);
        optim::Trainer trainer(model, trainer_config());
        nn::DataLoader loader = make_loader();
        train(trainer, loader, 2 * half_steps, straight);
    }
    ASSERT_GT(straight.cursor.epoch, 0) << "the run should cross an epoch boundary";

    RunEnd first_half;
    {
        nn::GPT model(model_config(), /*seed=*/1);
        optim::Trainer trainer(model, trainer_config());
        nn::DataLoader loader = make_loader();
        train(trainer, loader, half_steps, first_half);
        optim::save_training_state(directory.string(), trainer, &loader, R"({"model":"test"})");
    }
    // Whatever the process did in between must not matter: move the RNG on.
    manual_seed(12345);
    advance_rng(1000);

    RunEnd resumed;
    {
        nn::GPT model(model_config(), /*seed=*/2); // different initial weights: the state must overwrite them
        optim::Trainer trainer(model, trainer_config());
        nn::DataLoader loader = make_loader();
        const optim::ResumedRun run = optim::resume_training_state(directory.string(), trainer, &loader);
        EXPECT_EQ(run.step, half_steps);
        EXPECT_TRUE(run.refused_reason.empty());
        EXPECT_EQ(run.config_json, R"({"model":"test"})");
        EXPECT_EQ(trainer.step(), half_steps);
        train(trainer, loader, half_steps, resumed);
    }

    std::vector<double> losses = first_half.losses;
    losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
    ASSERT_EQ(losses.size(), straight.losses.size());
    for (size_t index = 0; index < losses.size(); ++index)
        EXPECT_EQ(std::memcmp(&losses[index], &straight.losses[index], sizeof(double)), 0)
            << "step " << index + 1 << ": " << losses[index] << " vs " << straight.losses[index];
    EXPECT_TRUE(resumed.weights == straight.weights) << "weights differ after resuming";
    EXPECT_TRUE(resumed.moments == straight.moments) << "optimizer moments differ after resuming";
    EXPECT_EQ(resumed.rng.seed, straight.rng.seed);
    EXPECT_EQ(resumed.rng.offset, straight.rng.offset);
    EXPECT_EQ(resumed.cursor, straight.cursor);
}

TEST_F(Resume, MismatchedModelIsRefusedAndChangesNothing) {
    {
        nn::GPT model(model_config(), 1);
        optim::Trainer trainer(model, trainer_config());
        nn::DataLoader loader = make_loader();
        RunEnd end;
        train(trainer, loader, 1, end);
        optim::save_training_state(directory.string(), trainer, &loader);
    }
    nn::GPTConfig wider = model_config();
    wider.n_embd = 32;
    nn::GPT model(wider, 1);
    optim::Trainer trainer(model, trainer_config());
    nn::DataLoader loader = make_loader();
    const std::vector<uint8_t> weights_before = bytes_of(model.named_parameters());
    const nn::LoaderCursor cursor_before = loader.cursor();
    try {
        optim::resume_training_state(directory.string(), trainer, &loader);
        FAIL() << "a state for another model shape was accepted";
    } catch (const EngineError& error) {
        EXPECT_NE(std::string(error.what()).find("model."), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("state-"), std::string::npos) << error.what();
    }
    EXPECT_TRUE(bytes_of(model.named_parameters()) == weights_before);
    EXPECT_EQ(loader.cursor(), cursor_before);
    EXPECT_EQ(trainer.step(), 0);
}

} // namespace
} // namespace engine::testing
