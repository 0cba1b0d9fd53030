// Byte-level BPE from a tokenizer.json (nn/io/tokenizer.h): added tokens, the pre-tokenizer's regex (PCRE2, in UTF
// mode with Unicode properties, as tokenizers' Oniguruma reads the same patterns), GPT-2's byte-to-character map, and
// merges by rank.
#include "nn/io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"

namespace engine::nn {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex, which tokenizers' ByteLevel applies when use_regex is true.
constexpr const char* gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8_of(uint32_t point) {
    std::string out;
    if (point < 0x80) {
        out.push_back(static_cast<char>(point));
    } else if (point < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (point >> 6)));
        out.push_back(static_cast<char>(0x80 | (point & 0x3F)));
    } else if (point < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (point >> 12)));
        out.push_back(static_cast<char>(0x80 | ((point >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (point & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (point >> 18)));
        out.push_back(static_cast<char>(0x80 | ((point >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((point >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (point & 0x3F)));
    }
    return out;
}

// The length of the UTF-8 sequence starting at `text[at]`, or 0 when it is not a valid one (overlong forms, surrogates
// and points past U+10FFFF included).
size_t utf8_length(const std::string& text, size_t at, uint32_t* point) {
    const auto byte = [&](size_t index) { return static_cast<unsigned char>(text[index]); };
    const unsigned char lead = byte(at);
    size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || at + length > text.size()) return 0;
    uint32_t value = length == 1 ? lead : lead & (0x7F >> length);
    for (size_t index = 1; index < length; ++index) {
        if ((byte(at + index) & 0xC0) != 0x80) return 0;
        value = value << 6 | (byte(at + index) & 0x3F);
    }
    static constexpr std::array<uint32_t, 5> smallest = {0, 0, 0x80, 0x800, 0x10000};
    if (value < smallest[length] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
    *point = value;
    return length;
}

// A compiled regex, released with it.
struct Regex {
    pcre2_code* code = nullptr;
    ~Regex() { pcre2_code_free(code); }
};

} // namespace

struct Tokenizer::State {
    std::string path;
    std::unordered_map<std::string, int32_t> vocabulary;
    std::vector<std::string> tokens;              // id -> the token's string (byte-level characters, or an added token)
    std::unordered_map<std::string, int> merge_ranks; // "a b" -> rank
    bool ignore_merges = false;
    std::vector<std::pair<std::string, int32_t>> added; // content, id; longest first
    std::vector<bool> special;                          // id -> an added special token
    std::unique_ptr<Regex> split;                       // the pre-tokenizer's regex, when it has one
    bool add_prefix_space = false;
    std::array<std::string, 256> byte_characters;        // byte -> its character's UTF-8
    std::unordered_map<uint32_t, uint8_t> character_bytes; // character -> byte

    [[noreturn]] void refuse(const std::string& what) const { ENGINE_FAIL("tokenizer '" << path << "': " << what); }

    void pieces(const std::string& text, std::vector<std::string>& out) const;
    void bpe(const std::string& piece, std::vector<int32_t>& ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_directory(const std::string& directory) {
    return from_file((std::filesystem::path(directory) / "tokenizer.json").string());
}

Tokenizer Tokenizer::from_file(const std::string& path) {
    auto state = std::make_unique<State>();
    state->path = path;
    std::error_code error;
    ENGINE_CHECK(std::filesystem::is_regular_file(path, error), "tokenizer '" << path << "': no such file");
    json document;
    try {
        std::ifstream file(path);
        document = json::parse(file);
    } catch (const json::exception& parse_error) {
        state->refuse(std::string("not valid JSON: ") + parse_error.what());
    }
    const auto field = [&](const json& object, const char* key) -> const json& {
        if (!object.is_object() || !object.contains(key)) state->refuse(std::string("no \"") + key + "\"");
        return object.at(key);
    };
    try {
        if (!document.value("normalizer", json()).is_null()) state->refuse("a normalizer is not supported (only none)");
        const json& model = field(document, "model");
        if (model.value("type", std::string()) != "BPE")
            state->refuse("model type \"" + model.value("type", std::string()) + "\" is not supported (only BPE)");
        if (!model.value("dropout", json()).is_null()) state->refuse("BPE dropout is not supported");
        if (!model.value("continuing_subword_prefix", json()).is_null() || !model.value("end_of_word_suffix", json()).is_null())
            state->refuse("a subword prefix or suffix is not supported (byte-level BPE has none)");
        if (model.value("byte_fallback", false)) state->refuse("byte_fallback is not supported");
        state->ignore_merges = model.value("ignore_merges", false);
        int32_t largest = -1;
        for (const auto& [token, id] : field(model, "vocab").items()) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
                state->refuse("vocab entry \"" + token + "\" has no valid id");
            state->vocabulary.emplace(token, id.get<int32_t>());
            largest = std::max(largest, id.get<int32_t>());
        }
        int rank = 0;
        for (const json& merge : field(model, "merges")) {
            std::string pair;
            if (merge.is_string()) pair = merge.get<std::string>();
            else if (merge.is_array() && merge.size() == 2) pair = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
            else state->refuse("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
            state->merge_ranks.emplace(pair, rank++);
        }
        for (const json& token : document.value("added_tokens", json::array())) {
            const std::string content = field(token, "content").get<std::string>();
            const int32_t id = field(token, "id").get<int32_t>();
            if (content.empty() || id < 0) state->refuse("an added token without content or id");
            state->added.emplace_back(content, id);
            largest = std::max(largest, id);
        }
        std::stable_sort(state->added.begin(), state->added.end(),
                         [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
        state->tokens.assign(static_cast<size_t>(largest + 1), std::string());
        state->special.assign(static_cast<size_t>(largest + 1), false);
        for (const auto& [token, id] : state->vocabulary) state->tokens[static_cast<size_t>(id)] = token;
        for (const json& token : document.value("added_tokens", json::array())) {
            const size_t id = static_cast<size_t>(token["id"].get<int32_t>());
            state->tokens[id] = token["content"].get<std::string>();
            state->special[id] = token.value("special", false);
        }

        // The pre-tokenizer: ByteLevel alone, or Split then ByteLevel without its own regex.
        const json& pre = field(document, "pre_tokenizer");
        std::string pattern;
        const json* byte_level = nullptr;
        if (pre.value("type", std::string()) == "ByteLevel") {
            byte_level = &pre;
            if (pre.value("use_regex", true)) pattern = gpt2_pattern;
        } else if (pre.value("type", std::string()) == "Sequence") {
            const json& steps = field(pre, "pretokenizers");
            if (steps.size() != 2 || steps[0].value("type", std::string()) != "Split" ||
                steps[1].value("type", std::string()) != "ByteLevel" || steps[1].value("use_regex", true))
                state->refuse("a Sequence pre-tokenizer must be Split then ByteLevel with use_regex false");
            const json& split = steps[0];
            if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
                state->refuse("a Split pre-tokenizer must be Isolated and not inverted");
            const json& regex = field(field(split, "pattern"), "Regex");
            pattern = regex.get<std::string>();
            byte_level = &steps[1];
        } else {
            state->refuse("pre_tokenizer \"" + pre.value("type", std::string()) +
                          "\" is not supported (ByteLevel, or Sequence of Split and ByteLevel)");
        }
        state->add_prefix_space = byte_level->value("add_prefix_space", false);
        if (!pattern.empty()) {
            int code = 0;
            PCRE2_SIZE offset = 0;
            state->split = std::make_unique<Regex>();
            state->split->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                               PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
            if (state->split->code == nullptr) {
                std::array<PCRE2_UCHAR, 256> message{};
                pcre2_get_error_message(code, message.data(), message.size());
                state->refuse("the pre-tokenizer's regex does not compile at offset " + std::to_string(offset) + ": " +
                              reinterpret_cast<const char*>(message.data()));
            }
        }
    } catch (const json::exception& type_error) {
        state->refuse(std::string("a field of the wrong type: ") + type_error.what());
    }

    // GPT-2's byte-to-character map: the printable bytes stand for themselves, the others for U+0100 onwards.
    uint32_t next = 256;
    for (uint32_t byte = 0; byte < 256; ++byte) {
        const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174);
        const uint32_t point = printable ? byte : next++;
        state->byte_characters[byte] = utf8_of(point);
        state->character_bytes.emplace(point, static_cast<uint8_t>(byte));
    }
    return Tokenizer(std::move(state));
}

// The pre-tokenizer's pieces of `text` (no added token in it): the regex's matches and the stretches between them.
void Tokenizer::State::pieces(const std::string& text, std::vector<std::string>& out) const {
    const std::string subject = add_prefix_space && !text.empty() && text[0] != ' ' ? " " + text : text;
    if (!split) {
        if (!subject.empty()) out.push_back(subject);
        return;
    }
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(split->code, nullptr);
    ENGINE_CHECK(match != nullptr, "tokenizer: out of memory for a regex match");
    size_t at = 0, previous_end = 0;
    while (at <= subject.size()) {
        const int found = pcre2_match(split->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), at,
                                      PCRE2_NO_UTF_CHECK, match, nullptr);
        if (found == PCRE2_ERROR_NOMATCH) break;
        if (found < 0) {
            pcre2_match_data_free(match);
            refuse("the pre-tokenizer's regex failed (PCRE2 error " + std::to_string(found) + ")");
        }
        const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(match);
        const size_t begin = vector[0], end = vector[1];
        if (begin > previous_end) out.push_back(subject.substr(previous_end, begin - previous_end));
        if (end > begin) out.push_back(subject.substr(begin, end - begin));
        previous_end = end;
        if (end > begin) {
            at = end;
        } else { // an empty match: step over one character
            uint32_t point = 0;
            const size_t length = begin < subject.size() ? utf8_length(subject, begin, &point) : 1;
            at = begin + std::max<size_t>(length, 1);
        }
    }
    pcre2_match_data_free(match);
    if (previous_end < subject.size()) out.push_back(subject.substr(previous_end));
}

// One piece's ids: its bytes as byte-level characters, merged pair by pair, lowest rank (then leftmost) first.
void Tokenizer::State::bpe(const std::string& piece, std::vector<int32_t>& ids) const {
    std::vector<std::string> symbols;
    symbols.reserve(piece.size());
    std::string whole;
    for (const char byte : piece) {
        symbols.push_back(byte_characters[static_cast<unsigned char>(byte)]);
        whole += symbols.back();
    }
    if (ignore_merges) {
        if (const auto found = vocabulary.find(whole); found != vocabulary.end()) {
            ids.push_back(found->second);
            return;
        }
    }
    // Each round finds the lowest-ranked pair and merges every occurrence of it, left to right without overlap: the
    // order tokenizers' per-position queue gives (a merge makes pairs of other ranks only, since ranks are unique),
    // in as many rounds as distinct merges apply rather than one per merge, so a long piece (a run of one
    // character) costs rounds of O(length), not O(length²).
    while (symbols.size() > 1) {
        int best_rank = std::numeric_limits<int>::max();
        std::string best_left, best_right;
        for (size_t index = 0; index + 1 < symbols.size(); ++index) {
            const auto found = merge_ranks.find(symbols[index] + " " + symbols[index + 1]);
            if (found != merge_ranks.end() && found->second < best_rank)
                best_rank = found->second, best_left = symbols[index], best_right = symbols[index + 1];
        }
        if (best_rank == std::numeric_limits<int>::max()) break;
        std::vector<std::string> merged;
        merged.reserve(symbols.size());
        for (size_t index = 0; index < symbols.size(); ++index) {
            if (index + 1 < symbols.size() && symbols[index] == best_left && symbols[index + 1] == best_right) {
                merged.push_back(symbols[index] + symbols[index + 1]);
                ++index;
            } else {
                merged.push_back(std::move(symbols[index]));
            }
        }
        symbols = std::move(merged);
    }
    for (const std::string& symbol : symbols) {
        const auto found = vocabulary.find(symbol);
        if (found == vocabulary.end()) refuse("the token \"" + symbol + "\" is not in the vocabulary (no unk fallback)");
        ids.push_back(found->second);
    }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
    for (size_t at = 0; at < text.size();) {
        uint32_t point = 0;
        const size_t length = utf8_length(text, at, &point);
        ENGINE_CHECK(length > 0, "tokenizer '" << state_->path << "': the text is not UTF-8 at byte " << at);
        at += length;
    }
    std::vector<int32_t> ids;
    std::vector<std::string> pieces;
    // The added tokens first, whole and longest first; the text between them goes through the pre-tokenizer and BPE.
    size_t start = 0, at = 0;
    const auto flush = [&](size_t end) {
        pieces.clear();
        state_->pieces(text.substr(start, end - start), pieces);
        for (const std::string& piece : pieces) state_->bpe(piece, ids);
    };
    while (at < text.size()) {
        const auto hit = std::find_if(state_->added.begin(), state_->added.end(), [&](const auto& token) {
            return text.compare(at, token.first.size(), token.first) == 0;
        });
        if (hit == state_->added.end()) {
            ++at;
            continue;
        }
        flush(at);
        ids.push_back(hit->second);
        at += hit->first.size();
        start = at;
    }
    flush(text.size());
    return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    std::string out;
    for (const int32_t id : ids) {
        ENGINE_CHECK(id >= 0 && static_cast<size_t>(id) < state_->tokens.size() && !state_->tokens[static_cast<size_t>(id)].empty(),
                     "tokenizer '" << state_->path << "': id " << id << " is not in the vocabulary of " << vocab_size());
        const std::string& token = state_->tokens[static_cast<size_t>(id)];
        const bool added = std::any_of(state_->added.begin(), state_->added.end(),
                                       [&](const auto& entry) { return entry.second == id; });
        if (added) {
            if (!(skip_special_tokens && state_->special[static_cast<size_t>(id)])) out += token;
            continue;
        }
        for (size_t at = 0; at < token.size();) {
            uint32_t point = 0;
            const size_t length = utf8_length(token, at, &point);
            const auto byte = length > 0 ? state_->character_bytes.find(point) : state_->character_bytes.end();
            ENGINE_CHECK(byte != state_->character_bytes.end(),
                         "tokenizer '" << state_->path << "': token " << id << " holds a character outside the byte map");
            out.push_back(static_cast<char>(byte->second));
            at += length;
        }
    }
    return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(state_->tokens.size()); }

size_t Tokenizer::longest_token_bytes() const {
    size_t longest = 1;
    for (size_t id = 0; id < state_->tokens.size(); ++id) {
        if (state_->tokens[id].empty()) continue;
        // A byte-level token's characters stand for one byte each; an added token for its own bytes.
        const bool added = std::any_of(state_->added.begin(), state_->added.end(),
                                       [&](const auto& entry) { return entry.second == static_cast<int32_t>(id); });
        size_t bytes = 0;
        if (added) bytes = state_->tokens[id].size();
        else
            for (size_t at = 0; at < state_->tokens[id].size();) {
                uint32_t point = 0;
                at += std::max<size_t>(utf8_length(state_->tokens[id], at, &point), 1);
                ++bytes;
            }
        longest = std::max(longest, bytes);
    }
    return longest;
}

int Tokenizer::token_id(const std::string& content) const {
    for (const auto& [token, id] : state_->added)
        if (token == content) return id;
    return -1;
}

} // namespace engine::nn
