// Training-state files: bitwise round trips, detection of truncation and of single bit flips, headers that
// lie about lengths, rotation with fallback to the previous state, and saves killed with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "engine/io/state_file.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;
using io::StateTensor;
using io::TrainingState;

// Bitwise CRC-32 (IEEE, reflected, polynomial 0xEDB88320): the textbook definition, an oracle independent
// of the table-driven library the engine uses.
uint32_t reference_crc32(const uint8_t* bytes, size_t size) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t index = 0; index < size; ++index) {
        crc ^= bytes[index];
        for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

void store_u32(std::vector<uint8_t>& bytes, size_t offset, uint32_t value) {
    for (int index = 0; index < 4; ++index) bytes[offset + index] = static_cast<uint8_t>(value >> (8 * index));
}
void store_u64(std::vector<uint8_t>& bytes, size_t offset, uint64_t value) {
    for (int index = 0; index < 8; ++index) bytes[offset + index] = static_cast<uint8_t>(value >> (8 * index));
}
void reseal(std::vector<uint8_t>& bytes) {
    store_u32(bytes, bytes.size() - 4, reference_crc32(bytes.data(), bytes.size() - 4));
}

template <typename T>
StateTensor make_tensor(const std::string& name, const Shape& shape, const std::vector<T>& values) {
    StateTensor tensor{name, dtype_of<T>(), shape, std::vector<uint8_t>(values.size() * sizeof(T))};
    if (!values.empty()) std::memcpy(tensor.data.data(), values.data(), tensor.data.size());
    return tensor;
}

// Values whose bit patterns a lossy path would change: NaN payloads, signed zero, subnormals, infinities.
TrainingState sample_state() {
    TrainingState state;
    state.metadata_json = R"({"step":17,"config":{"model":"tiny","lr":0.001},"rng":{"seed":18446744073709551615}})";
    uint32_t nan_bits = 0x7FC01234u;
    float payload_nan;
    std::memcpy(&payload_nan, &nan_bits, 4);
    state.add_tensor(make_tensor<float>("weight", {2, 3},
                                        {payload_nan, -0.0f, std::numeric_limits<float>::denorm_min(),
                                         std::numeric_limits<float>::infinity(), 1.0f / 3.0f, -7.5e30f}));
    state.add_tensor(make_tensor<double>("moment.m", {4}, {1e-300, -2.0, 0.1, std::nextafter(1.0, 2.0)}));
    state.add_tensor(make_tensor<int32_t>("cursor", {}, {-123456}));
    state.add_tensor(make_tensor<float>("empty", {0, 5}, {}));
    return state;
}

void expect_same(const TrainingState& actual, const TrainingState& expected) {
    EXPECT_EQ(actual.metadata_json, expected.metadata_json);
    ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
    for (size_t index = 0; index < expected.tensors.size(); ++index) {
        EXPECT_EQ(actual.tensors[index].name, expected.tensors[index].name);
        EXPECT_EQ(actual.tensors[index].dtype, expected.tensors[index].dtype);
        EXPECT_EQ(actual.tensors[index].shape, expected.tensors[index].shape);
        EXPECT_EQ(actual.tensors[index].data, expected.tensors[index].data) << expected.tensors[index].name;
    }
}

std::string error_of(const std::function<void()>& action) {
    try {
        action();
    } catch (const OutOfMemoryError&) {
        throw;
    } catch (const EngineError& error) {
        return error.what();
    }
    return "";
}

// The refusal of a file by read_state_file, checked to be word for word the refusal by the reader that opens it in
// place (StateFileReader: the same checks, in the same order, over bounded buffers).
std::string refusal_of(const std::string& path) {
    const std::string whole = error_of([&] { io::read_state_file(path); });
    const std::string in_place = error_of([&] { io::StateFileReader reader(path); });
    EXPECT_EQ(in_place, whole) << "the two readers of " << path << " disagree";
    return whole;
}

class StateFile : public ::testing::Test {
protected:
    void SetUp() override {
        directory = fs::temp_directory_path() /
                    ("engine_state_test_" + std::to_string(::getpid()) + "_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(directory);
        fs::create_directories(directory);
    }
    void TearDown() override { fs::remove_all(directory); }

    void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }

    fs::path directory;
};

TEST_F(StateFile, RoundTripIsBitwiseAndChecksumIsCrc32) {
    const TrainingState state = sample_state();
    const std::string path = (directory / "one.bin").string();
    io::write_state_file(path, state);
    expect_same(io::read_state_file(path), state);

    const std::vector<uint8_t> bytes = io::serialize_state(state);
    EXPECT_EQ(fs::file_size(path), bytes.size());
    uint32_t stored = 0;
    for (int index = 3; index >= 0; --index) stored = stored << 8 | bytes[bytes.size() - 4 + index];
    EXPECT_EQ(stored, reference_crc32(bytes.data(), bytes.size() - 4));
    for (const auto& entry : fs::directory_iterator(directory))
        EXPECT_EQ(entry.path().filename(), "one.bin") << "no temporary file may remain";
}

TEST_F(StateFile, TensorsCopyInAndOutThroughEngineTensors) {
    Tensor source = Tensor::from_vector<float>({1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 7.0f}, {3, 2}, Device::cpu);
    TrainingState state;
    state.add_tensor("w", source);
    const TrainingState loaded = io::parse_state(io::serialize_state(state).data(),
                                                 io::serialize_state(state).size(), "memory");
    Tensor destination = Tensor::zeros({3, 2}, DType::f32, Device::cpu);
    loaded.copy_into("w", destination);
    EXPECT_EQ(std::memcmp(destination.raw_data(), source.raw_data(), source.nbytes()), 0);

    Tensor wrong_shape = Tensor::zeros({2, 3}, DType::f32, Device::cpu);
    EXPECT_NE(error_of([&] { loaded.copy_into("w", wrong_shape); }).find("(3,2) f32"), std::string::npos);
    EXPECT_EQ(wrong_shape.to_vector<float>(), std::vector<float>(6, 0.0f)) << "a refused copy changes nothing";
    EXPECT_NE(error_of([&] { loaded.copy_into("missing", destination); }).find("missing"), std::string::npos);
    EXPECT_NE(error_of([&] { state.add_tensor("w", source); }).find("twice"), std::string::npos);
}

TEST_F(StateFile, TruncatedFilesAreRefusedNamingTheFile) {
    const std::vector<uint8_t> bytes = io::serialize_state(sample_state());
    const fs::path path = directory / "truncated.bin";
    for (size_t length : {size_t{0}, size_t{7}, size_t{40}, size_t{44}, bytes.size() / 2, bytes.size() - 4,
                          bytes.size() - 1}) {
        write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(length)));
        const std::string message = refusal_of(path.string());
        EXPECT_NE(message.find(path.string()), std::string::npos) << "length " << length << ": " << message;
        EXPECT_NE(message.find("truncated"), std::string::npos) << "length " << length << ": " << message;
    }
    std::vector<uint8_t> longer = bytes;
    longer.push_back(0);
    write_bytes(path, longer);
    EXPECT_NE(refusal_of(path.string()).find("trailing"), std::string::npos);
}

TEST_F(StateFile, EverySingleBitFlipIsRefused) {
    const std::vector<uint8_t> bytes = io::serialize_state(sample_state());
    const fs::path path = directory / "flipped.bin";
    std::vector<size_t> positions;
    for (size_t position = 0; position < bytes.size(); position += 7) positions.push_back(position);
    positions.push_back(bytes.size() - 1);
    for (size_t position : positions) {
        for (int bit : {0, 5}) {
            std::vector<uint8_t> damaged = bytes;
            damaged[position] ^= static_cast<uint8_t>(1u << bit);
            write_bytes(path, damaged);
            const std::string message = refusal_of(path.string());
            SCOPED_TRACE("byte " + std::to_string(position) + " bit " + std::to_string(bit) + ": " + message);
            ASSERT_NE(message.find(path.string()), std::string::npos);
            // Header fields that are checked before the checksum get their own, more specific message.
            if (position < 8)
                EXPECT_NE(message.find("magic"), std::string::npos);
            else if (position < 12)
                EXPECT_NE(message.find("version"), std::string::npos);
            else if (position >= 16 && position < 24)
                EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                            message.find("trailing") != std::string::npos);
            else
                EXPECT_NE(message.find("checksum mismatch"), std::string::npos);
        }
    }
}

// A file whose checksum matches but whose lengths lie (a buggy or hostile writer) is still refused
// before anything is read out of bounds.
TEST_F(StateFile, LyingLengthsWithAValidChecksumAreRefused) {
    TrainingState state;
    state.metadata_json = R"({"a":1})";
    state.add_tensor(make_tensor<float>("t", {2}, {1.0f, 2.0f}));
    const std::vector<uint8_t> good = io::serialize_state(state);
    const size_t record = 40 + state.metadata_json.size(); // first tensor record
    struct Lie {
        const char* what;
        std::function<void(std::vector<uint8_t>&)> edit;
        const char* expected;
    };
    const std::vector<Lie> lies = {
        {"metadata length", [](auto& b) { store_u64(b, 24, 1u << 30); }, "metadata length"},
        {"tensor count", [](auto& b) { store_u64(b, 32, ~0ull); }, "tensor count"},
        {"fewer tensors", [](auto& b) { store_u64(b, 32, 0); }, "unexplained bytes"},
        {"name length", [&](auto& b) { store_u32(b, record, 0xFFFFFFu); }, "name length"},
        {"dtype", [&](auto& b) { store_u32(b, record + 4, 9); }, "dtype code"},
        {"rank", [&](auto& b) { store_u32(b, record + 8, 1000); }, "rank"},
        {"extent", [&](auto& b) { store_u64(b, record + 17, 3); }, "declares 8 data bytes"},
        {"negative extent", [&](auto& b) { store_u64(b, record + 17, ~0ull); }, "invalid shape"},
        {"data length", [&](auto& b) { store_u64(b, record + 25, 1ull << 40); }, "declares"},
        {"metadata not json", [](auto& b) { b[40] = '['; }, "metadata"},
    };
    for (const Lie& lie : lies) {
        std::vector<uint8_t> bytes = good;
        lie.edit(bytes);
        reseal(bytes);
        const std::string message = error_of([&] { io::parse_state(bytes.data(), bytes.size(), "crafted.bin"); });
        EXPECT_NE(message.find("crafted.bin"), std::string::npos) << lie.what << ": " << message;
        const fs::path crafted = directory / "crafted.bin";
        write_bytes(crafted, bytes);
        EXPECT_EQ(refusal_of(crafted.string()), error_of([&] { io::parse_state(bytes.data(), bytes.size(), crafted.string()); }))
            << lie.what;
        EXPECT_NE(message.find(lie.expected), std::string::npos) << lie.what << ": " << message;
    }
}

TEST_F(StateFile, FailedWriteLeavesTheOldFileAndNoTemporary) {
    const std::string path = (directory / "kept.bin").string();
    const TrainingState state = sample_state();
    io::write_state_file(path, state);
    TrainingState bad = state;
    bad.metadata_json = "{not json";
    EXPECT_NE(error_of([&] { io::write_state_file(path, bad); }).find("JSON"), std::string::npos);
    bad.metadata_json = "{}";
    bad.tensors[0].data.pop_back(); // shape needs one more byte than it holds
    EXPECT_NE(error_of([&] { io::write_state_file(path, bad); }).find("weight"), std::string::npos);
    expect_same(io::read_state_file(path), state);
    EXPECT_EQ(std::distance(fs::directory_iterator(directory), fs::directory_iterator()), 1);
    EXPECT_NE(error_of([&] { io::read_state_file((directory / "absent.bin").string()); }).find("absent.bin"),
              std::string::npos);
}

// The reader in place gives every tensor's bytes, whole or any part, as the whole-file reader does.
TEST_F(StateFile, TheReaderInPlaceReadsWholeTensorsAndParts) {
    const TrainingState state = sample_state();
    const std::string path = (directory / "in_place.bin").string();
    io::write_state_file(path, state);
    const io::StateFileReader reader(path);
    EXPECT_EQ(reader.metadata_json(), state.metadata_json);
    ASSERT_EQ(reader.entries().size(), state.tensors.size());
    for (const StateTensor& tensor : state.tensors) {
        const io::StateReader::Entry* entry = reader.find(tensor.name);
        ASSERT_NE(entry, nullptr) << tensor.name;
        EXPECT_EQ(entry->dtype, tensor.dtype);
        EXPECT_EQ(entry->shape, tensor.shape);
        ASSERT_EQ(entry->bytes, tensor.data.size());
        std::vector<uint8_t> whole(tensor.data.size());
        reader.read(*entry, 0, whole.data(), Device::cpu, whole.size());
        EXPECT_EQ(whole, tensor.data) << tensor.name;
        for (uint64_t first = 0; first + 3 <= entry->bytes; first += 5) {
            std::vector<uint8_t> part(3);
            reader.read(*entry, first, part.data(), Device::cpu, 3);
            EXPECT_EQ(part, std::vector<uint8_t>(tensor.data.begin() + first, tensor.data.begin() + first + 3));
        }
    }
    const io::StateReader::Entry& weight = *reader.find("weight");
    std::vector<uint8_t> past(8);
    EXPECT_NE(error_of([&] { reader.read(weight, 20, past.data(), Device::cpu, 8); }).find("outside its 24"),
              std::string::npos);
    EXPECT_EQ(reader.find("absent"), nullptr);
    // A newer file renamed over the path changes nothing the open reader reads.
    TrainingState newer = state;
    newer.tensors[0].data.assign(newer.tensors[0].data.size(), 0);
    io::write_state_file(path, newer);
    std::vector<uint8_t> again(weight.bytes);
    reader.read(weight, 0, again.data(), Device::cpu, again.size());
    EXPECT_EQ(again, state.tensors[0].data);
}

// A streamed write: the same bytes as the state held whole; a sink that fails part way does not stop the emits
// (a collective in one must run on every rank), and its error comes after the last; a source that gives the wrong
// number of bytes is refused by name.
TEST_F(StateFile, StreamedWritesRunEveryEmitAndCheckTheirLengths) {
    const TrainingState state = sample_state();
    std::vector<uint8_t> streamed;
    io::write_state(io::source_of(state), [&](const void* bytes, size_t size) {
        streamed.insert(streamed.end(), static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + size);
    });
    EXPECT_EQ(streamed, io::serialize_state(state));

    io::StateSource source = io::source_of(state);
    std::vector<std::string> emitted;
    for (io::StateTensorSource& tensor : source.tensors)
        tensor.emit = [&emitted, name = tensor.name, inner = tensor.emit](const io::ByteSink& sink) {
            emitted.push_back(name);
            inner(sink);
        };
    size_t written = 0;
    const std::string message = error_of([&] {
        io::write_state(source, [&](const void*, size_t size) {
            if (written + size > 60) ENGINE_FAIL("the disk is full");
            written += size;
        });
    });
    EXPECT_NE(message.find("the disk is full"), std::string::npos) << message;
    EXPECT_EQ(emitted, (std::vector<std::string>{"weight", "moment.m", "cursor", "empty"}));

    source = io::source_of(state);
    source.tensors[1].emit = [](const io::ByteSink& sink) { sink("abc", 3); };
    EXPECT_NE(error_of([&] { io::write_state(source, [](const void*, size_t) {}); }).find("moment.m (4) f64 needs 32 bytes, its source gave 3"),
              std::string::npos);
    const std::string path = (directory / "short.bin").string();
    EXPECT_NE(error_of([&] { io::write_state_file(path, source); }).find("moment.m"), std::string::npos);
    EXPECT_FALSE(fs::exists(path)) << "a refused source leaves no file";
    EXPECT_EQ(std::distance(fs::directory_iterator(directory), fs::directory_iterator()), 0);
}

TrainingState state_for_step(uint64_t step, size_t floats) {
    TrainingState state;
    state.metadata_json = "{\"step\":" + std::to_string(step) + "}";
    std::vector<float> values(floats);
    for (size_t index = 0; index < floats; ++index) values[index] = static_cast<float>((index * 31 + step) % 1009);
    state.add_tensor(make_tensor<float>("weights", {static_cast<int64_t>(floats)}, values));
    return state;
}

// A state is complete when its metadata, its file name and every tensor value agree on the step.
void expect_complete(const io::LoadedState& loaded, size_t floats) {
    EXPECT_EQ(loaded.state.metadata_json, "{\"step\":" + std::to_string(loaded.step) + "}");
    const StateTensor* weights = loaded.state.find("weights");
    ASSERT_NE(weights, nullptr);
    ASSERT_EQ(weights->data.size(), floats * 4);
    EXPECT_EQ(weights->data, state_for_step(loaded.step, floats).tensors[0].data);
}

TEST_F(StateFile, RotationKeepsTwoAndFallsBackWhenTheNewestIsCorrupt) {
    for (uint64_t step : {10, 20, 30}) io::save_state_rotating(directory.string(), step, state_for_step(step, 64));
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{io::state_file_name(20), io::state_file_name(30)}));

    io::LoadedState newest = io::load_latest_state(directory.string());
    EXPECT_EQ(newest.step, 30u);
    EXPECT_TRUE(newest.refused_reason.empty());
    EXPECT_EQ(io::open_latest_state(directory.string()).step, 30u);

    const fs::path newest_path = directory / io::state_file_name(30);
    std::vector<uint8_t> bytes = io::serialize_state(state_for_step(30, 64));
    bytes[bytes.size() / 2] ^= 0x10;
    write_bytes(newest_path, bytes);
    io::LoadedState fallback = io::load_latest_state(directory.string());
    EXPECT_EQ(fallback.step, 20u);
    expect_complete(fallback, 64);
    EXPECT_NE(fallback.refused_reason.find(newest_path.string()), std::string::npos) << fallback.refused_reason;
    EXPECT_NE(fallback.refused_reason.find("checksum mismatch"), std::string::npos) << fallback.refused_reason;
    const io::OpenedState opened = io::open_latest_state(directory.string());
    EXPECT_EQ(opened.step, 20u);
    EXPECT_EQ(opened.refused_reason, fallback.refused_reason);

    bytes.resize(bytes.size() - 100);
    write_bytes(newest_path, bytes);
    fallback = io::load_latest_state(directory.string());
    EXPECT_EQ(fallback.step, 20u);
    EXPECT_NE(fallback.refused_reason.find("truncated"), std::string::npos) << fallback.refused_reason;

    write_bytes(directory / io::state_file_name(20), bytes);
    const std::string message = error_of([&] { io::load_latest_state(directory.string()); });
    EXPECT_EQ(error_of([&] { io::open_latest_state(directory.string()); }), message);
    EXPECT_NE(message.find(io::state_file_name(20)), std::string::npos) << message;
    EXPECT_NE(message.find(io::state_file_name(30)), std::string::npos) << message;
}

TEST_F(StateFile, RotationDropsAbandonedNewerStatesAndStaleTemporaries) {
    for (uint64_t step : {10, 20, 30}) io::save_state_rotating(directory.string(), step, state_for_step(step, 8));
    write_bytes(directory / (io::state_file_name(40) + ".tmp-99999"), {1, 2, 3});
    write_bytes(directory / "notes.txt", {1});
    // Resumed from step 20 and saved again at 25: state 30 belongs to the abandoned run.
    io::save_state_rotating(directory.string(), 25, state_for_step(25, 8));
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"notes.txt", io::state_file_name(20), io::state_file_name(25)}));
    EXPECT_EQ(io::load_latest_state(directory.string()).step, 25u);
    EXPECT_NE(error_of([&] { io::load_latest_state((directory / "nothing").string()); }).find("does not exist"),
              std::string::npos);
}

// A writer killed at a random moment, again and again, always leaves a loadable, complete state.
TEST_F(StateFile, SigkillWhileSavingAlwaysLeavesALoadableState) {
    constexpr size_t floats = 768 * 1024; // 3 MiB per state
    io::save_state_rotating(directory.string(), 0, state_for_step(0, floats));
    std::mt19937 generator(1234);
    std::uniform_int_distribution<int> delay_ms(1, 120);
    uint64_t next_step = 1;
    int advanced = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < 15; ++round) {
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            try {
                for (uint64_t step = next_step;; ++step)
                    io::save_state_rotating(directory.string(), step, state_for_step(step, floats));
            } catch (...) {
            }
            ::_exit(3); // only reached when a save failed
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(generator)));
        ASSERT_EQ(::kill(child, SIGKILL), 0);
        int status = 0;
        ASSERT_EQ(::waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer failed on its own";

        const io::LoadedState loaded = io::load_latest_state(directory.string());
        SCOPED_TRACE("round " + std::to_string(round) + ", loaded " + loaded.path);
        EXPECT_TRUE(loaded.refused_reason.empty()) << "a complete newest state must exist: " << loaded.refused_reason;
        expect_complete(loaded, floats);
        ASSERT_GE(loaded.step + 1, next_step) << "a durable state went missing";
        advanced += loaded.step + 1 > next_step;
        next_step = loaded.step + 1;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GT(advanced, 0) << "no save ever completed, so the loop tested nothing";
    RecordProperty("seconds", std::to_string(seconds));
    RecordProperty("states_written", std::to_string(next_step - 1));
}

} // namespace
} // namespace engine::testing
