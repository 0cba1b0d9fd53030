// Token data: llm.c shards, uint16 and uint32 (round trips and every rejection), byte files, vocabulary validation, the
// built-in corpus, padded batches, and the loader's seeded shuffle and exact resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "expect_error.h"
#include "nn/io/token_data.h"

namespace engine::testing {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "token_data_" + name; }

std::vector<char> file_bytes(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void put_int32(std::vector<char>& bytes, size_t offset, int32_t value) {
    for (int shift = 0; shift < 4; ++shift) bytes[offset + static_cast<size_t>(shift)] = static_cast<char>(value >> (8 * shift));
}

TEST(TokenData, StandardMersenneTwisterIsTheSpecifiedOne) {
    // The C++ standard fixes the 10000th output of a default-constructed mt19937_64; the corpus and the
    // shuffle are only platform-stable if this holds.
    std::mt19937_64 generator;
    generator.discard(9999);
    EXPECT_EQ(generator(), 9981545732273789042ull);
}

TEST(TokenData, ShardRoundTrip) {
    const std::string path = temp_path("round_trip.bin");
    std::vector<int32_t> tokens = {0, 1, 255, 256, 50256, 65535};
    std::mt19937_64 generator(5);
    for (int index = 0; index < 1000; ++index) tokens.push_back(static_cast<int32_t>(generator() % 65536));
    nn::write_token_shard(path, tokens);
    EXPECT_EQ(file_bytes(path).size(), 1024 + 2 * tokens.size());
    EXPECT_EQ(nn::read_token_shard(path), tokens);
    EXPECT_EQ(nn::load_tokens(path, 65536), tokens);
    std::remove(path.c_str());
}

TEST(TokenData, ShardWithBadMagicVersionOrSizeIsRejected) {
    const std::string path = temp_path("good.bin"), bad = temp_path("bad.bin");
    nn::write_token_shard(path, {1, 2, 3, 4});
    const std::vector<char> good = file_bytes(path);
    ASSERT_NO_THROW(nn::read_token_shard(path));

    std::vector<char> bytes = good;
    put_int32(bytes, 0, 20240521);
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "magic"});

    bytes = good;
    put_int32(bytes, 4, 2);
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "version"});

    bytes = good;
    bytes.push_back('\0'); // one byte more than the header's count allows
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "1032 bytes", "1033 bytes"});

    bytes = good;
    bytes.resize(bytes.size() - 2); // a token short
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "4 tokens"});

    bytes.resize(100); // not even a header
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "header"});

    expect_error([&] { nn::write_token_shard(bad, {1, 65536}); }, {"index 1", "uint16"});
    std::remove(path.c_str());
    std::remove(bad.c_str());
}

// llm.c's Llama-3 layout: magic 20240801, version 7, uint32 ids. Ids at and past 65536 (and up to INT32_MAX) come back
// as written, byte for byte as llm.c's write_datafile lays them out (little-endian after the 1024-byte header).
TEST(TokenData, WideShardRoundTripHoldsIdsPast65535) {
    const std::string path = temp_path("wide.bin");
    std::vector<int32_t> tokens = {0, 1, 65535, 65536, 65537, 128000, 128255, 2147483647};
    std::mt19937_64 generator(7);
    for (int index = 0; index < 1000; ++index) tokens.push_back(static_cast<int32_t>(generator() % 128256));
    nn::write_token_shard(path, tokens, nn::TokenIdWidth::u32);
    const std::vector<char> bytes = file_bytes(path);
    ASSERT_EQ(bytes.size(), 1024 + 4 * tokens.size());
    std::vector<char> header(12);
    put_int32(header, 0, 20240801);
    put_int32(header, 4, 7);
    put_int32(header, 8, static_cast<int32_t>(tokens.size()));
    EXPECT_TRUE(std::equal(header.begin(), header.end(), bytes.begin()));
    std::vector<char> id(4);
    put_int32(id, 0, 65537);
    EXPECT_TRUE(std::equal(id.begin(), id.end(), bytes.begin() + 1024 + 4 * 4)); // tokens[4]
    EXPECT_EQ(nn::token_shard_width(path), nn::TokenIdWidth::u32);
    EXPECT_EQ(nn::read_token_shard(path), tokens);
    tokens.erase(tokens.begin() + 7); // INT32_MAX is past any vocabulary
    nn::write_token_shard(path, tokens, nn::TokenIdWidth::u32);
    EXPECT_EQ(nn::load_tokens(path, 128256), tokens);
    // Token index 5 (128000) sits at byte 1024 + 4·5.
    expect_error([&] { nn::load_tokens(path, 128000); }, {path, "token id 128000", "token index 5", "byte offset 1044"});
    std::remove(path.c_str());
}

TEST(TokenData, WideShardWithBadVersionSizeOrIdIsRejected) {
    const std::string path = temp_path("wide_good.bin"), bad = temp_path("wide_bad.bin");
    nn::write_token_shard(path, {70000, 2, 3, 4}, nn::TokenIdWidth::u32);
    const std::vector<char> good = file_bytes(path);

    std::vector<char> bytes = good;
    put_int32(bytes, 4, 1); // the uint16 layout's version under the uint32 magic
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "version 1 for magic 20240801", "expected 7"});

    bytes = good;
    put_int32(bytes, 0, 20240520); // a uint16 header over uint32 ids: the size gives it away
    put_int32(bytes, 4, 1);
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "4 tokens (uint16)", "1032 bytes", "1040 bytes"});

    bytes = good;
    bytes.resize(bytes.size() - 2); // half an id short
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "4 tokens (uint32)", "1040 bytes", "1038 bytes"});

    bytes = good;
    put_int32(bytes, 1024 + 4, -1); // id 4294967295
    write_bytes(bad, bytes);
    expect_error([&] { nn::read_token_shard(bad); }, {bad, "4294967295", "token index 1", "byte offset 1028"});
    expect_error([&] { nn::load_tokens(bad, 100000); }, {bad, "4294967295"});

    expect_error([&] { nn::write_token_shard(bad, {1, -3}, nn::TokenIdWidth::u32); }, {"index 1", "negative"});
    std::remove(path.c_str());
    std::remove(bad.c_str());
}

TEST(TokenData, TokensOutsideTheVocabularyAreRejectedWithTheirOffset) {
    const std::string shard = temp_path("vocab.bin");
    nn::write_token_shard(shard, {10, 20, 30, 40, 50, 300, 60});
    EXPECT_NO_THROW(nn::load_tokens(shard, 301));
    // Token index 5 sits at byte 1024 + 2·5 of the shard.
    expect_error([&] { nn::load_tokens(shard, 300); }, {shard, "token id 300", "token index 5", "byte offset 1034"});

    const std::string bytes_file = temp_path("vocab.txt");
    write_bytes(bytes_file, {'a', 'b', 'c', 'z', 'a'});
    EXPECT_EQ(nn::load_tokens(bytes_file, 256), (std::vector<int32_t>{'a', 'b', 'c', 'z', 'a'}));
    expect_error([&] { nn::load_tokens(bytes_file, 'z'); }, {bytes_file, "token index 3", "byte offset 3"});
    expect_error([&] { nn::validate_tokens({1, -4}, 8, "my tokens"); }, {"my tokens", "token index 1"});
    std::remove(shard.c_str());
    std::remove(bytes_file.c_str());
}

TEST(TokenData, EveryByteIsOneToken) {
    const std::string path = temp_path("bytes.bin");
    std::vector<char> bytes;
    for (int value = 0; value < 256; ++value) bytes.push_back(static_cast<char>(value));
    write_bytes(path, bytes);
    const std::vector<int32_t> tokens = nn::read_byte_tokens(path);
    ASSERT_EQ(tokens.size(), 256u);
    for (int value = 0; value < 256; ++value) EXPECT_EQ(tokens[static_cast<size_t>(value)], value);
    expect_error([&] { nn::read_byte_tokens(temp_path("does_not_exist")); }, {"does_not_exist"});
    std::remove(path.c_str());
}

TEST(TokenData, BuiltinCorpusIsDeterministicPrintableAndExactlySized) {
    const std::vector<int32_t> first = nn::builtin_corpus(5000, 3);
    EXPECT_EQ(first.size(), 5000u);
    EXPECT_EQ(first, nn::builtin_corpus(5000, 3));
    EXPECT_NE(first, nn::builtin_corpus(5000, 4));
    // A longer corpus extends the same stream.
    const std::vector<int32_t> longer = nn::builtin_corpus(8000, 3);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), longer.begin()));
    for (int32_t token : first) EXPECT_TRUE((token >= 32 && token < 127) || token == '\n') << token;
    EXPECT_GE(first[0], 'A');
    EXPECT_LE(first[0], 'Z');
}

TEST(TokenData, PaddedBatchHasMinus100LabelsAtPadding) {
    const nn::Batch batch = nn::make_padded_batch({{5, 6, 7}, {1, 2, 3, 4, 5}, {9}}, 5, /*pad_token=*/0);
    ASSERT_EQ(batch.inputs.shape(), (Shape{3, 5}));
    ASSERT_EQ(batch.labels.shape(), (Shape{3, 5}));
    EXPECT_FALSE(batch.shift_labels.defined());
    EXPECT_EQ(batch.inputs.to_vector<int32_t>(), (std::vector<int32_t>{5, 6, 7, 0, 0, 1, 2, 3, 4, 5, 9, 0, 0, 0, 0}));
    EXPECT_EQ(batch.labels.to_vector<int32_t>(),
              (std::vector<int32_t>{5, 6, 7, -100, -100, 1, 2, 3, 4, 5, 9, -100, -100, -100, -100}));
    expect_error([] { nn::make_padded_batch({{1, 2, 3}}, 2); }, {"sequence 0", "3 tokens"});
    expect_error([] { nn::make_padded_batch({{1}, {}}, 2); }, {"sequence 1"});
}

std::vector<int32_t> counting_tokens(int count) {
    std::vector<int32_t> tokens(static_cast<size_t>(count));
    for (int index = 0; index < count; ++index) tokens[static_cast<size_t>(index)] = index;
    return tokens;
}

nn::DataLoaderOptions loader_options(uint64_t seed) {
    nn::DataLoaderOptions options;
    options.batch_size = 3;
    options.sequence_length = 4;
    options.seed = seed;
    return options;
}

std::vector<std::vector<int32_t>> draw(nn::DataLoader& loader, int batches) {
    std::vector<std::vector<int32_t>> out;
    for (int index = 0; index < batches; ++index) {
        std::optional<nn::Batch> batch = loader.next();
        if (!batch) break;
        out.push_back(batch->inputs.to_vector<int32_t>());
        EXPECT_EQ(batch->labels.to_vector<int32_t>(), out.back()); // full windows: labels = inputs, unshifted
    }
    return out;
}

TEST(TokenData, LoaderShufflesWindowsDeterministicallyPerSeed) {
    // 50 tokens -> 12 windows of 4 (2 tokens left over) -> 4 batches of 3 per epoch.
    nn::DataLoader loader(counting_tokens(50), loader_options(11));
    nn::DataLoader same(counting_tokens(50), loader_options(11));
    nn::DataLoader other(counting_tokens(50), loader_options(12));
    EXPECT_EQ(loader.window_count(), 12);
    EXPECT_EQ(loader.batches_per_epoch(), 4);
    const auto batches = draw(loader, 12); // three epochs
    EXPECT_EQ(batches, draw(same, 12));
    EXPECT_NE(batches, draw(other, 12));

    // Every epoch visits every window once, each a contiguous run of the stream, and epochs differ.
    std::vector<std::vector<int32_t>> epoch_starts(3);
    for (size_t index = 0; index < batches.size(); ++index) {
        for (size_t row = 0; row < 3; ++row) {
            const int32_t start = batches[index][row * 4];
            EXPECT_EQ(start % 4, 0);
            for (int32_t t = 1; t < 4; ++t) EXPECT_EQ(batches[index][row * 4 + static_cast<size_t>(t)], start + t);
            epoch_starts[index / 4].push_back(start / 4);
        }
    }
    for (const auto& starts : epoch_starts) {
        EXPECT_EQ(std::set<int32_t>(starts.begin(), starts.end()).size(), 12u);
    }
    EXPECT_NE(epoch_starts[0], epoch_starts[1]);
}

TEST(TokenData, RestoredCursorContinuesExactly) {
    for (int consumed : {0, 2, 4, 5, 9}) { // mid-epoch and at epoch boundaries
        nn::DataLoader original(counting_tokens(50), loader_options(21));
        draw(original, consumed);
        const std::string saved = original.cursor().to_json();
        const auto expected = draw(original, 7);

        nn::DataLoader resumed(counting_tokens(50), loader_options(999)); // the cursor carries the seed
        resumed.restore(nn::LoaderCursor::from_json(saved));
        EXPECT_EQ(resumed.cursor(), nn::LoaderCursor::from_json(saved));
        EXPECT_EQ(draw(resumed, 7), expected) << "after " << consumed << " batches";
    }
    nn::DataLoader loader(counting_tokens(50), loader_options(21));
    draw(loader, 2);
    const nn::LoaderCursor before = loader.cursor();
    expect_error([&] { loader.restore({21, 0, 13}); }, {"restore", "12 windows"});
    EXPECT_EQ(loader.cursor(), before);
    expect_error([] { nn::LoaderCursor::from_json("{\"seed\":1}"); }, {"loader cursor"});
}

TEST(TokenData, LoaderEpochLimitPartialBatchesAndBatchSource) {
    nn::DataLoaderOptions options = loader_options(3);
    options.max_epochs = 2;
    options.drop_last = false;
    options.shuffle = false;
    nn::DataLoader loader(counting_tokens(40), options); // 10 windows: batches of 3, 3, 3, 1
    nn::BatchSource source = loader.source();
    std::vector<int64_t> rows;
    while (std::optional<nn::Batch> batch = source()) rows.push_back(batch->inputs.size(0));
    EXPECT_EQ(rows, (std::vector<int64_t>{3, 3, 3, 1, 3, 3, 3, 1}));
    EXPECT_FALSE(source().has_value());

    options.drop_last = true;
    nn::DataLoader dropping(counting_tokens(40), options);
    EXPECT_EQ(draw(dropping, 100).size(), 6u);
    expect_error([&] { static_cast<void>(nn::DataLoader(counting_tokens(8), options)); }, {"too few"});
}

TEST(TokenData, LoaderVariableLengthsPadWithMinus100) {
    nn::DataLoaderOptions options = loader_options(8);
    options.sequence_length = 8;
    options.min_valid_length = 3;
    nn::DataLoader loader(counting_tokens(800), options);
    std::set<int> lengths;
    for (int step = 0; step < 20; ++step) {
        const nn::Batch batch = *loader.next();
        const std::vector<int32_t> inputs = batch.inputs.to_vector<int32_t>();
        const std::vector<int32_t> labels = batch.labels.to_vector<int32_t>();
        for (size_t row = 0; row < 3; ++row) {
            int length = 0;
            while (length < 8 && labels[row * 8 + static_cast<size_t>(length)] != -100) ++length;
            lengths.insert(length);
            EXPECT_GE(length, 3);
            for (size_t t = 0; t < 8; ++t) {
                const size_t index = row * 8 + t;
                if (static_cast<int>(t) < length) {
                    EXPECT_EQ(labels[index], inputs[index]);
                    EXPECT_EQ(inputs[index], inputs[row * 8] + static_cast<int32_t>(t));
                } else {
                    EXPECT_EQ(labels[index], -100);
                    EXPECT_EQ(inputs[index], 0);
                }
            }
        }
    }
    EXPECT_GE(lengths.size(), 4u) << "lengths should vary";
}

} // namespace
} // namespace engine::testing
