// The phases outside the step hold no copy of what they move in host memory: saving and resuming a training state
// stream it tensor by tensor (optim/training_state.h), and loading weights streams each tensor a chunk at a time
// (nn::load_safetensors_into). The oracle is this binary's count of operator new (tests/heap/heap_counter.h), whose
// high-water mark is read around each phase; each test first shows that it sees a whole copy, made the old way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "nn/io/safetensors.h"
#include "optim/training_state.h"
#include "tests/heap/heap_counter.h"
#include "tests/parameter_snapshot.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

// What a streamed phase may hold beside what it moves: a record's head, names, the index, the file handles.
constexpr size_t state_allowance = size_t(1) << 20;
// A load's two chunk buffers (at most 2 MiB each), twice over while a tied head is compared with its table.
constexpr size_t load_allowance = size_t(9) << 19;

// GPT-2 shapes whose AdamW state is 12.7 MB and whose f32 weights alone are 21 MB: large beside the allowances.
nn::GPTConfig model_config(int vocabulary, int width) {
    nn::GPTConfig config;
    config.vocab_size = vocabulary;
    config.max_seq_len = 16;
    config.n_layer = 4;
    config.n_head = 4;
    config.n_embd = width;
    config.dropout = 0.0f;
    return config;
}

optim::TrainerConfig trainer_config() {
    optim::TrainerConfig config;
    config.shape.per_device_train_batch_size = 2;
    config.learning_rate = 1e-3;
    config.max_steps = 4;
    return config;
}

nn::DataLoader make_loader() {
    nn::DataLoaderOptions options;
    options.batch_size = 2;
    options.sequence_length = 16;
    options.seed = 5;
    options.vocab_size = 2048;
    return nn::DataLoader(nn::builtin_corpus(16 * 8, 3), options);
}

// The high-water marks of what `phase` held above what was held before it: on the heap, and on the engine
// allocator's host account (where tensors live).
struct Rise {
    size_t heap = 0;
    size_t tensors = 0;
};
template <typename Phase>
Rise rise_of(const Phase& phase) {
    const size_t heap_before = heap_now(), tensors_before = memory_stats(Device::cpu).current_bytes;
    reset_heap_peak();
    reset_peak(Device::cpu);
    phase();
    return {heap_peak() - heap_before, memory_stats(Device::cpu).peak_bytes - tensors_before};
}

class HeapPhases : public ::testing::Test {
protected:
    void SetUp() override {
        directory = fs::temp_directory_path() / ("engine_heap_phases_" + std::to_string(::getpid()));
        fs::remove_all(directory);
        fs::create_directories(directory);
    }
    void TearDown() override { fs::remove_all(directory); }
    fs::path directory;
};

TEST_F(HeapPhases, SaveAndResumeHoldNoCopyOfTheState) {
    nn::GPT model(model_config(2048, 128), /*seed=*/1);
    optim::Trainer trainer(model, trainer_config());
    nn::DataLoader loader = make_loader();
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(trainer.train_step(loader.source()).has_value());
    const size_t state_bytes = bytes_of(model.named_parameters()).size() + bytes_of(trainer.optimizer().named_state()).size();
    ASSERT_GT(state_bytes, size_t(12) << 20);

    // The oracle sees a whole capture: every tensor copied to host vectors, as saves were made before.
    std::optional<io::TrainingState> captured;
    const size_t captured_rise = rise_of([&] { captured = optim::capture_training_state(trainer, &loader, "{}"); }).heap;
    ASSERT_GE(captured_rise, state_bytes);

    std::string path;
    const Rise save = rise_of([&] { path = optim::save_training_state(directory.string(), trainer, &loader, "{}"); });
    const size_t save_rise = save.heap;
    EXPECT_EQ(save.tensors, 0u) << "the save made tensors";
    EXPECT_LT(save_rise, state_allowance) << "the save held " << save_rise << " B beside a state of " << state_bytes << " B";
    captured.reset();
    // The file holds the trainer's own tensors, read from them here: every parameter, then every state tensor in
    // named_state()'s order (parameter by parameter, every kind).
    {
        const io::TrainingState written = io::read_state_file(path);
        std::vector<std::pair<std::string, Tensor>> expected;
        for (const auto& [name, parameter] : model.named_parameters()) expected.emplace_back("model." + name, parameter);
        for (const auto& [name, state] : trainer.optimizer().named_state()) expected.emplace_back("optimizer." + name, state);
        ASSERT_EQ(written.tensors.size(), expected.size());
        for (size_t index = 0; index < expected.size(); ++index) {
            EXPECT_EQ(written.tensors[index].name, expected[index].first);
            EXPECT_TRUE(written.tensors[index].data == bytes_of({expected[index]})) << expected[index].first;
        }
    }

    // The oracle sees a whole read too: the file, then its parse, as resumes were made before.
    const size_t read_rise = rise_of([&] { io::read_state_file(path); }).heap;
    ASSERT_GE(read_rise, state_bytes);

    nn::GPT fresh(model_config(2048, 128), /*seed=*/2);
    optim::Trainer resumed(fresh, trainer_config());
    nn::DataLoader fresh_loader = make_loader();
    const Rise resume = rise_of([&] { optim::resume_training_state(directory.string(), resumed, &fresh_loader); });
    const size_t resume_rise = resume.heap;
    EXPECT_EQ(resume.tensors, 0u) << "the resume made tensors";
    EXPECT_LT(resume_rise, state_allowance) << "the resume held " << resume_rise << " B";
    EXPECT_TRUE(bytes_of(fresh.named_parameters()) == bytes_of(model.named_parameters()));
    EXPECT_TRUE(bytes_of(resumed.optimizer().named_state()) == bytes_of(trainer.optimizer().named_state()));
    EXPECT_EQ(resumed.step(), trainer.step());
    EXPECT_EQ(fresh_loader.cursor(), loader.cursor());
    std::printf("state %zu B; heap held beside it: capture %zu B, read whole %zu B; streamed save %zu B, resume %zu B\n",
                state_bytes, captured_rise, read_rise, save_rise, resume_rise);
}

TEST_F(HeapPhases, LoadHoldsNoCopyOfTheWeights) {
    const nn::GPTConfig config = model_config(8192, 256);
    nn::GPT source(config, /*seed=*/3);
    const size_t weight_bytes = bytes_of(source.named_parameters()).size();
    ASSERT_GT(weight_bytes, size_t(20) << 20);
    for (const std::optional<DType> file_dtype : {std::optional<DType>{}, std::optional<DType>{DType::bf16}}) {
        const std::string path = (directory / "weights.safetensors").string();
        nn::save_safetensors(source, path, file_dtype, "transformer.");
        // The oracle sees a whole read: every tensor of the file staged on the host (tensors on the host's account,
        // a BF16 file's halves on the heap), as loads were made before.
        const Rise read = rise_of([&] { nn::read_safetensors(path); });
        ASSERT_GE(read.heap + read.tensors, weight_bytes);
        nn::GPT target(config, /*seed=*/4);
        const Rise load = rise_of([&] { nn::load_safetensors_into(target, path); });
        EXPECT_EQ(load.tensors, 0u) << "the load staged tensors";
        EXPECT_LT(load.heap, load_allowance) << "the load held " << load.heap << " B beside " << weight_bytes << " B of weights";
        if (!file_dtype) EXPECT_TRUE(bytes_of(target.named_parameters()) == bytes_of(source.named_parameters()));
        std::printf("weights %zu B (%s file); held beside them: read whole %zu B of tensors and %zu B of heap, streamed "
                    "load %zu B of heap\n",
                    weight_bytes, file_dtype ? "BF16" : "F32", read.tensors, read.heap, load.heap);
    }
}

} // namespace
} // namespace engine::testing
