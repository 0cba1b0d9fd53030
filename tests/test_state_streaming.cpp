// Saving and resuming stream the training state tensor by tensor: the file is the bytes of the state captured
// whole, and neither direction holds a copy of the state in host memory. The oracle for "no copy" is the C
// library's own account of the heap (mallinfo2, or the sanitizer allocator's under ASan), read while the bytes
// flow; the same oracle is first shown to see a whole capture.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "optim/training_state.h"
#include "tests/parameter_snapshot.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/allocator_interface.h>
#endif

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

// Bytes the process's heap holds now (the main arena's and the mmapped chunks', or the sanitizer's count).
size_t heap_in_use() {
#if defined(__SANITIZE_ADDRESS__)
    return __sanitizer_get_current_allocated_bytes();
#else
    const struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
#endif
}

// A model whose AdamW state (weights and two moments) is about 12.6 MB: large beside what the stream may hold.
nn::GPTConfig model_config() {
    nn::GPTConfig config;
    config.vocab_size = 2048;
    config.max_seq_len = 16;
    config.n_layer = 4;
    config.n_head = 4;
    config.n_embd = 128;
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

// What streaming may hold beside the state at any moment: a record's head and the bookkeeping, far under a MiB.
constexpr size_t stream_allowance = size_t(1) << 20;

// A reader that watches the heap at every read it passes on.
class WatchedReader : public io::StateReader {
public:
    WatchedReader(const io::StateReader& inner, size_t baseline) : inner_(inner), baseline_(baseline) {}
    const std::string& metadata_json() const override { return inner_.metadata_json(); }
    const std::vector<Entry>& entries() const override { return inner_.entries(); }
    void read(const Entry& entry, uint64_t first, void* destination, Device device, uint64_t size) const override {
        rise = std::max(rise, heap_in_use() - std::min(heap_in_use(), baseline_));
        inner_.read(entry, first, destination, device, size);
        rise = std::max(rise, heap_in_use() - std::min(heap_in_use(), baseline_));
        ++reads;
    }
    mutable size_t rise = 0;
    mutable size_t reads = 0;

private:
    const io::StateReader& inner_;
    size_t baseline_;
};

class StateStreaming : public ::testing::Test {
protected:
    void SetUp() override {
        directory = fs::temp_directory_path() / ("engine_state_streaming_" + std::to_string(::getpid()));
        fs::remove_all(directory);
    }
    void TearDown() override { fs::remove_all(directory); }
    fs::path directory;
};

TEST_F(StateStreaming, SaveAndResumeHoldNoCopyOfTheStateInHostMemory) {
    nn::GPT model(model_config(), /*seed=*/1);
    optim::Trainer trainer(model, trainer_config());
    nn::DataLoader loader = make_loader();
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(trainer.train_step(loader.source()).has_value());
    const size_t state_bytes = bytes_of(model.named_parameters()).size() + bytes_of(trainer.optimizer().named_state()).size();
    ASSERT_GT(state_bytes, size_t(12) << 20);

    // The oracle sees a whole capture: the old way, every tensor copied to host vectors before the write.
    size_t baseline = heap_in_use();
    const io::TrainingState captured = optim::capture_training_state(trainer, &loader, R"({"run":"streaming"})");
    const size_t captured_rise = heap_in_use() - std::min(heap_in_use(), baseline);
    ASSERT_GE(captured_rise, state_bytes)
        << "the heap account does not show a whole capture, so it cannot show that the stream holds none";
    const std::vector<uint8_t> expected = io::serialize_state(captured);

    // The stream: the same bytes, with the heap never more than the allowance above where it began.
    baseline = heap_in_use();
    size_t rise = 0, streamed = 0;
    io::write_state(optim::training_state_source(trainer, &loader, R"({"run":"streaming"})"),
                    [&](const void* bytes, size_t size) {
                        rise = std::max(rise, heap_in_use() - std::min(heap_in_use(), baseline));
                        EXPECT_EQ(std::memcmp(bytes, expected.data() + streamed, size), 0) << "at byte " << streamed;
                        streamed += size;
                    });
    EXPECT_EQ(streamed, expected.size());
    EXPECT_LT(rise, stream_allowance) << "the save held " << rise << " B of heap beside a state of " << state_bytes << " B";

    // The file the trainer's save writes is those bytes.
    const std::string path = optim::save_training_state(directory.string(), trainer, &loader, R"({"run":"streaming"})");
    EXPECT_EQ(io::read_file_bytes(path), expected);

    // The resume: a fresh model, trainer and loader filled from the file in place, bitwise the saved run.
    nn::GPT fresh(model_config(), /*seed=*/2);
    optim::Trainer resumed(fresh, trainer_config());
    nn::DataLoader fresh_loader = make_loader();
    baseline = heap_in_use();
    const io::StateFileReader reader(path);
    const size_t opened = heap_in_use() - std::min(heap_in_use(), baseline);
    EXPECT_LT(opened, stream_allowance) << "opening held " << opened << " B";
    const WatchedReader watched(reader, baseline);
    optim::restore_training_state(watched, resumed, &fresh_loader);
    EXPECT_EQ(watched.reads, captured.tensors.size());
    EXPECT_LT(watched.rise, stream_allowance) << "the resume held " << watched.rise << " B";
    EXPECT_TRUE(bytes_of(fresh.named_parameters()) == bytes_of(model.named_parameters()));
    EXPECT_TRUE(bytes_of(resumed.optimizer().named_state()) == bytes_of(trainer.optimizer().named_state()));
    EXPECT_EQ(resumed.step(), trainer.step());
    EXPECT_EQ(fresh_loader.cursor(), loader.cursor());
    std::printf("state %zu B; heap held beside it: capture %zu B, streamed save %zu B, opening %zu B, resume %zu B\n",
                state_bytes, captured_rise, rise, opened, watched.rise);
}

} // namespace
} // namespace engine::testing
