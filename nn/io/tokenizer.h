// A model directory's own tokenizer (its tokenizer.json, as Hugging Face's `tokenizers` writes it), in C++: byte-level
// BPE, the kind GPT-2, Llama-3 and most current models use. Text to ids and ids to text with the same ids as
// `tokenizers` (tests/test_tokenizer.cpp holds it to them). docs/ARCHITECTURE.md ("Text in and out") says why it is
// written here over PCRE2 rather than bound to the Rust library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace engine::nn {

class Tokenizer {
public:
    // Reads `path` (a tokenizer.json). What it understands, and refuses otherwise with one EngineError naming the
    // file and the key: model BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges; no dropout, no
    // unk fallback by bytes, no subword prefix or suffix); no normalizer; a pre-tokenizer ByteLevel (GPT-2's regex
    // when use_regex, add_prefix_space) or a Sequence of Split (a regex, behaviour Isolated, not inverted) and
    // ByteLevel without its regex; added tokens matched whole in the text before anything else.
    static Tokenizer from_file(const std::string& path);
    // From a model directory: DIR/tokenizer.json.
    static Tokenizer from_directory(const std::string& directory);
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    // The ids of `text` (UTF-8; refused when it is not), without any special token added.
    std::vector<int32_t> encode(const std::string& text) const;
    // The text of `ids`: the byte-level tokens' bytes, added tokens as their content (or left out with
    // skip_special_tokens). An id outside the vocabulary throws, naming it.
    std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
    // The largest id plus one (the vocabulary and the added tokens).
    int vocab_size() const;
    // An added token's id, or -1.
    int token_id(const std::string& content) const;
    // The most bytes one id stands for: a text longer than n times this makes more than n ids.
    size_t longest_token_bytes() const;

private:
    struct State;
    explicit Tokenizer(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

} // namespace engine::nn
