// nn::Tokenizer against pip's `tokenizers` itself: two byte-level BPE tokenizers trained for the test (GPT-2's
// ByteLevel regex, and Llama-3's Split regex then ByteLevel) and the ids tokenizers gives for texts with contractions
// in both cases, non-Latin scripts, digits, code, runs of whitespace, \r\n, emoji it never saw, added tokens inside
// words, the empty text (tests/golden/make_tokenizer_golden.py writes tests/data/tokenizers/); every id equal, and
// the ids decode back to the text. Then what it refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expect_error.h"
#include "nn/io/tokenizer.h"

namespace engine::testing {
namespace {

const std::string directory = std::string(ENGINE_TEST_DATA_DIR) + "/tokenizers";

nlohmann::json cases() {
    std::ifstream file(directory + "/cases.json");
    return nlohmann::json::parse(file);
}

TEST(Tokenizer, IdsAreTokenizersOwnAndDecodeBackToTheText) {
    const nlohmann::json all = cases();
    for (const std::string name : {"gpt2_style", "llama3_style"}) {
        const nn::Tokenizer tokenizer = nn::Tokenizer::from_directory(directory + "/" + name);
        ASSERT_TRUE(all.contains(name));
        size_t checked = 0, total_ids = 0;
        for (const auto& entry : all[name]) {
            const std::string text = entry[0].get<std::string>();
            const std::vector<int32_t> expected = entry[1].get<std::vector<int32_t>>();
            const std::vector<int32_t> ids = tokenizer.encode(text);
            EXPECT_EQ(ids, expected) << name << ": \"" << text << "\"";
            EXPECT_EQ(tokenizer.decode(ids), text) << name;
            ++checked;
            total_ids += ids.size();
        }
        EXPECT_EQ(checked, 24u) << name;
        EXPECT_EQ(tokenizer.token_id("<|end|>"), 0) << name;
        // Added special tokens can be left out of the text.
        EXPECT_EQ(tokenizer.decode(tokenizer.encode("a<|end|>b"), true), "ab") << name;
        std::printf("  %s: %zu texts, %zu ids, each equal to tokenizers'\n", name.c_str(), checked, total_ids);
    }
}

TEST(Tokenizer, RefusesWhatItCannotReadOrEncode) {
    const nn::Tokenizer tokenizer = nn::Tokenizer::from_directory(directory + "/gpt2_style");
    expect_error([&] { tokenizer.encode(std::string("caf\xe9")); }, {"not UTF-8 at byte 3"});
    expect_error([&] { tokenizer.encode(std::string("\xed\xa0\x80")); }, {"not UTF-8 at byte 0"}); // a surrogate
    expect_error([&] { tokenizer.decode({tokenizer.vocab_size()}); }, {"id " + std::to_string(tokenizer.vocab_size()),
                                                                      "not in the vocabulary"});
    expect_error([&] { nn::Tokenizer::from_directory(directory); }, {"tokenizer.json", "no such file"});

    const std::filesystem::path work = std::filesystem::path(::testing::TempDir()) / "tokenizer_bad";
    std::filesystem::create_directories(work);
    std::ifstream in(directory + "/llama3_style/tokenizer.json");
    const nlohmann::json good = nlohmann::json::parse(in);
    const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, std::vector<std::string> parts) {
        nlohmann::json broken = good;
        edit(broken);
        std::ofstream(work / "tokenizer.json") << broken.dump();
        expect_error([&] { nn::Tokenizer::from_directory(work.string()); }, parts);
    };
    refused([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, {"model type \"WordPiece\"", "only BPE"});
    refused([](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; }, {"a normalizer is not supported"});
    refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
            {"Isolated and not inverted"});
    refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
            {"regex does not compile"});
    refused([](nlohmann::json& j) { j["model"].erase("merges"); }, {"no \"merges\""});
    std::ofstream(work / "tokenizer.json") << "{ not json";
    expect_error([&] { nn::Tokenizer::from_directory(work.string()); }, {"tokenizer.json", "not valid JSON"});
    std::filesystem::remove_all(work);
}

} // namespace
} // namespace engine::testing
