// Token files, the built-in corpus, padded batches and the resumable shuffling loader.
#include "nn/io/token_data.h"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/io/atomic_file.h"
#include "engine/ops.h"
#include "nn/io/files.h"

namespace engine::nn {
namespace {

// splitmix64: a fixed mixing function, so derived seeds are the same everywhere.
uint64_t mix64(uint64_t value) {
    value += 0x9E3779B97F4A7C15ull;
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
    value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
    return value ^ (value >> 31);
}

int32_t read_int32_le(const unsigned char* bytes) {
    return static_cast<int32_t>(static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
                                static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24);
}

void append_int32_le(std::string& out, int32_t value) {
    const auto word = static_cast<uint32_t>(value);
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((word >> shift) & 0xFF));
}

} // namespace

uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
    ENGINE_CHECK(bound > 0, "uniform_below: bound must be positive");
    // Reject the top partial block of 2^64 so every residue is equally likely.
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
    uint64_t word = generator();
    while (word >= limit) word = generator();
    return word % bound;
}

// ---- token sources ----

std::vector<int32_t> read_byte_tokens(const std::string& path) {
    int64_t size = 0;
    std::ifstream file = io_detail::open_for_reading(path, &size);
    std::vector<unsigned char> bytes(static_cast<size_t>(size));
    if (size > 0) io_detail::read_exactly(file, path, 0, bytes.data(), size, "byte tokens");
    return std::vector<int32_t>(bytes.begin(), bytes.end());
}

int64_t token_id_bytes(TokenIdWidth width) { return width == TokenIdWidth::u16 ? 2 : 4; }

std::optional<TokenIdWidth> token_shard_width(const std::string& path) {
    int64_t size = 0;
    std::ifstream file = io_detail::open_for_reading(path, &size);
    if (size < 4) return std::nullopt;
    std::array<unsigned char, 4> start{};
    io_detail::read_exactly(file, path, 0, start.data(), 4, "the first bytes");
    const int32_t magic = read_int32_le(start.data());
    if (magic == token_shard_magic) return TokenIdWidth::u16;
    if (magic == wide_token_shard_magic) return TokenIdWidth::u32;
    return std::nullopt;
}

std::vector<int32_t> read_token_shard(const std::string& path) {
    int64_t size = 0;
    std::ifstream file = io_detail::open_for_reading(path, &size);
    ENGINE_CHECK(size >= token_shard_header_bytes, "token shard '" << path << "': " << size
                                                     << " bytes is shorter than the 1024-byte header");
    std::array<unsigned char, token_shard_header_bytes> header{};
    io_detail::read_exactly(file, path, 0, header.data(), token_shard_header_bytes, "the shard header");
    const int32_t magic = read_int32_le(&header[0]);
    const int32_t version = read_int32_le(&header[4]);
    const int32_t count = read_int32_le(&header[8]);
    ENGINE_CHECK(magic == token_shard_magic || magic == wide_token_shard_magic,
                 "token shard '" << path << "': bad magic " << magic << " (expected " << token_shard_magic
                                 << " for uint16 ids or " << wide_token_shard_magic << " for uint32 ids)");
    const TokenIdWidth width = magic == token_shard_magic ? TokenIdWidth::u16 : TokenIdWidth::u32;
    const int32_t expected_version = width == TokenIdWidth::u16 ? token_shard_version : wide_token_shard_version;
    ENGINE_CHECK(version == expected_version, "token shard '" << path << "': unsupported version " << version
                                                              << " for magic " << magic << " (expected "
                                                              << expected_version << ")");
    ENGINE_CHECK(count >= 0, "token shard '" << path << "': negative token count " << count);
    const int64_t id_bytes = token_id_bytes(width);
    const int64_t expected = token_shard_header_bytes + id_bytes * static_cast<int64_t>(count);
    ENGINE_CHECK(size == expected, "token shard '" << path << "': header says " << count << " tokens ("
                                                   << (width == TokenIdWidth::u16 ? "uint16" : "uint32") << "), so "
                                                   << expected << " bytes, but the file has " << size << " bytes");
    std::vector<unsigned char> payload(static_cast<size_t>(id_bytes * static_cast<int64_t>(count)));
    if (count > 0)
        io_detail::read_exactly(file, path, token_shard_header_bytes, payload.data(), id_bytes * int64_t{count}, "tokens");
    std::vector<int32_t> tokens(static_cast<size_t>(count));
    for (size_t index = 0; index < tokens.size(); ++index) {
        if (width == TokenIdWidth::u16) {
            tokens[index] = static_cast<int32_t>(payload[2 * index] | payload[2 * index + 1] << 8);
            continue;
        }
        const int32_t id = read_int32_le(&payload[4 * index]);
        // An id is an int32 everywhere past the reader: one past INT32_MAX is a corrupt file, not a token.
        ENGINE_CHECK(id >= 0, "token shard '" << path << "': uint32 token " << static_cast<uint32_t>(id) << " at token index "
                                              << index << " (byte offset " << token_shard_header_bytes + 4 * int64_t(index)
                                              << ") exceeds 2147483647");
        tokens[index] = id;
    }
    return tokens;
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, TokenIdWidth width) {
    ENGINE_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                 "write_token_shard '" << path << "': " << tokens.size() << " tokens do not fit the int32 count");
    const bool narrow = width == TokenIdWidth::u16;
    for (size_t index = 0; index < tokens.size(); ++index)
        ENGINE_CHECK(tokens[index] >= 0 && (!narrow || tokens[index] <= 0xFFFF),
                     "write_token_shard '" << path << "': token " << tokens[index] << " at index " << index
                                           << (narrow ? " does not fit uint16 (write uint32 ids for a vocabulary past 65536)"
                                                      : " is negative"));
    std::string bytes;
    bytes.reserve(static_cast<size_t>(token_shard_header_bytes) + static_cast<size_t>(token_id_bytes(width)) * tokens.size());
    append_int32_le(bytes, narrow ? token_shard_magic : wide_token_shard_magic);
    append_int32_le(bytes, narrow ? token_shard_version : wide_token_shard_version);
    append_int32_le(bytes, static_cast<int32_t>(tokens.size()));
    bytes.resize(static_cast<size_t>(token_shard_header_bytes), '\0');
    for (int32_t token : tokens) {
        if (narrow) {
            bytes.push_back(static_cast<char>(token & 0xFF));
            bytes.push_back(static_cast<char>((token >> 8) & 0xFF));
        } else {
            append_int32_le(bytes, token);
        }
    }
    io::write_file_atomically(path, [&](const io::ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

void validate_tokens(const std::vector<int32_t>& tokens, int vocab_size, const std::string& source,
                     int64_t first_token_byte, int64_t bytes_per_token) {
    for (size_t index = 0; index < tokens.size(); ++index) {
        const int32_t token = tokens[index];
        ENGINE_CHECK(token >= 0 && token < vocab_size,
                     source << ": token id " << token << " at token index " << index << " (byte offset "
                            << first_token_byte + bytes_per_token * static_cast<int64_t>(index)
                            << ") is outside the vocabulary [0," << vocab_size << ")");
    }
}

std::vector<int32_t> load_tokens(const std::string& path, int vocab_size) {
    if (const std::optional<TokenIdWidth> width = token_shard_width(path)) {
        std::vector<int32_t> tokens = read_token_shard(path);
        validate_tokens(tokens, vocab_size, "token shard '" + path + "'", token_shard_header_bytes, token_id_bytes(*width));
        return tokens;
    }
    std::vector<int32_t> tokens = read_byte_tokens(path);
    validate_tokens(tokens, vocab_size, "byte file '" + path + "'", 0, 1);
    return tokens;
}

// ---- the built-in corpus ----

std::string builtin_corpus_text(size_t token_count, uint64_t seed) {
    static const std::vector<std::string> nouns = {"cat", "dog", "bird", "fox", "child", "farmer", "robot", "king",
                                                   "river", "garden", "house", "tree"};
    static const std::vector<std::string> adjectives = {"small", "old", "red", "quiet", "happy", "green", "tall", "brave"};
    static const std::vector<std::string> verbs = {"sees", "likes", "follows", "finds", "carries", "watches"};
    static const std::vector<std::string> places = {"in the garden", "by the river", "near the house", "under the tree",
                                                    "at night", "in the morning"};
    static const std::vector<std::string> numbers = {"one", "two", "three", "four", "five", "six", "seven", "eight",
                                                     "nine"};
    std::mt19937_64 generator(seed);
    auto pick = [&](const std::vector<std::string>& words) -> const std::string& {
        return words[uniform_below(generator, words.size())];
    };
    std::string text;
    text.reserve(token_count + 128);
    int sentences_in_line = 0;
    while (text.size() < token_count) {
        std::string sentence;
        switch (uniform_below(generator, 4)) {
        case 0: // the ADJ NOUN VERB the NOUN.
            sentence = "the " + pick(adjectives) + " " + pick(nouns) + " " + pick(verbs) + " the " + pick(nouns) + ".";
            break;
        case 1: // a NOUN VERB a ADJ NOUN PLACE.
            sentence = "a " + pick(nouns) + " " + pick(verbs) + " a " + pick(adjectives) + " " + pick(nouns) + " " +
                       pick(places) + ".";
            break;
        case 2: { // counting from a random start: the model can learn the successor rule.
            const uint64_t first = uniform_below(generator, 5);
            const uint64_t length = 3 + uniform_below(generator, 3);
            for (uint64_t step = 0; step < length; ++step) sentence += (step ? " " : "") + numbers[first + step];
            sentence += ".";
            break;
        }
        default: // PLACE, the NOUN is ADJ.
            sentence = pick(places) + ", the " + pick(nouns) + " is " + pick(adjectives) + ".";
            break;
        }
        sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
        text += sentence;
        text += (++sentences_in_line % 4 == 0) ? "\n" : " ";
    }
    text.resize(token_count);
    return text;
}

std::vector<int32_t> builtin_corpus(size_t token_count, uint64_t seed) {
    const std::string text = builtin_corpus_text(token_count, seed);
    std::vector<int32_t> tokens(text.size());
    for (size_t index = 0; index < text.size(); ++index) tokens[index] = static_cast<unsigned char>(text[index]);
    return tokens;
}

// ---- batches ----

Batch make_padded_batch(const std::vector<std::vector<int32_t>>& sequences, int sequence_length, int32_t pad_token,
                        Device device) {
    ENGINE_CHECK(!sequences.empty(), "make_padded_batch: no sequences");
    ENGINE_CHECK(sequence_length > 0, "make_padded_batch: sequence length " << sequence_length << " must be positive");
    const size_t T = static_cast<size_t>(sequence_length);
    std::vector<int32_t> inputs(sequences.size() * T, pad_token); // (B,T)
    std::vector<int32_t> labels(sequences.size() * T, -100);      // (B,T)
    for (size_t row = 0; row < sequences.size(); ++row) {
        const std::vector<int32_t>& sequence = sequences[row];
        ENGINE_CHECK(!sequence.empty() && sequence.size() <= T, "make_padded_batch: sequence "
                                                                    << row << " has " << sequence.size()
                                                                    << " tokens; it needs 1.." << T);
        std::copy(sequence.begin(), sequence.end(), inputs.begin() + static_cast<std::ptrdiff_t>(row * T));
        std::copy(sequence.begin(), sequence.end(), labels.begin() + static_cast<std::ptrdiff_t>(row * T));
    }
    const Shape shape = {static_cast<int64_t>(sequences.size()), sequence_length};
    Batch batch;
    batch.inputs = Tensor::from_vector<int32_t>(inputs, shape, device);
    batch.labels = Tensor::from_vector<int32_t>(labels, shape, device);
    return batch;
}

// ---- the loader ----

DataLayout parse_data_layout(const std::string& name) {
    if (name == "packed") return DataLayout::packed;
    if (name == "padded") return DataLayout::padded;
    if (name == "packed-documents") return DataLayout::packed_documents;
    ENGINE_FAIL("data layout: unknown layout '" << name << "' (known: packed, padded, packed-documents)");
}

const char* data_layout_name(DataLayout layout) {
    switch (layout) {
    case DataLayout::padded:
        return "padded";
    case DataLayout::packed_documents:
        return "packed-documents";
    case DataLayout::packed:
        break;
    }
    return "packed";
}

Batch make_packed_document_batch(const std::vector<std::vector<std::vector<int32_t>>>& rows, int sequence_length,
                                 int32_t pad_token, Device device) {
    constexpr const char* op = "make_packed_document_batch";
    ENGINE_CHECK(!rows.empty(), op << ": no rows");
    ENGINE_CHECK(sequence_length > 0, op << ": sequence length " << sequence_length << " must be positive");
    const auto T = static_cast<size_t>(sequence_length);
    std::vector<int32_t> inputs(rows.size() * T, pad_token), labels(rows.size() * T, default_ignore_index),
        positions(rows.size() * T, 0);
    for (size_t row = 0; row < rows.size(); ++row) {
        size_t t = 0;
        for (const std::vector<int32_t>& document : rows[row]) {
            ENGINE_CHECK(!document.empty(), op << ": row " << row << " holds an empty document");
            ENGINE_CHECK(t + document.size() <= T, op << ": row " << row << " holds more than " << T << " tokens");
            for (size_t index = 0; index < document.size(); ++index, ++t) {
                inputs[row * T + t] = document[index];
                // A document's first token is no target: the position before it ends another document.
                labels[row * T + t] = index == 0 ? default_ignore_index : document[index];
                positions[row * T + t] = static_cast<int32_t>(index);
            }
        }
        ENGINE_CHECK(t > 0, op << ": row " << row << " holds no document");
        for (int32_t position = 0; t < T; ++t) positions[row * T + t] = position++; // the padding: one more document
    }
    const Shape shape = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(T)};
    Batch batch;
    batch.inputs = Tensor::from_vector(inputs, shape, device);
    batch.labels = Tensor::from_vector(labels, shape, device);
    batch.positions = Tensor::from_vector(positions, shape, device);
    return batch;
}

std::string LoaderCursor::to_json() const {
    return nlohmann::json{{"seed", seed}, {"epoch", epoch}, {"position", position}, {"rank", rank}, {"world_size", world_size}}
        .dump();
}

LoaderCursor LoaderCursor::from_json(const std::string& text) {
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(json.is_object() && json.contains("seed") && json["seed"].is_number_unsigned() &&
                     json.contains("epoch") && json["epoch"].is_number_integer() && json.contains("position") &&
                     json["position"].is_number_integer(),
                 "loader cursor: expected {\"seed\":uint,\"epoch\":int,\"position\":int}, got '" << text << "'");
    LoaderCursor cursor;
    cursor.seed = json["seed"].get<uint64_t>();
    cursor.epoch = json["epoch"].get<int64_t>();
    cursor.position = json["position"].get<int64_t>();
    for (const auto& [key, field] : {std::pair{"rank", &cursor.rank}, std::pair{"world_size", &cursor.world_size}}) {
        if (!json.contains(key)) continue; // a cursor from before data parallelism: rank 0 of 1
        ENGINE_CHECK(json[key].is_number_integer(), "loader cursor: '" << key << "' must be an integer, got '" << text << "'");
        *field = json[key].get<int>();
    }
    return cursor;
}

DataLoader::DataLoader(std::vector<int32_t> tokens, const DataLoaderOptions& options)
    : tokens_(std::move(tokens)), options_(options) {
    ENGINE_CHECK(options.batch_size > 0, "DataLoader: batch_size " << options.batch_size << " must be positive");
    ENGINE_CHECK(options.sequence_length > 0,
                 "DataLoader: sequence_length " << options.sequence_length << " must be positive");
    ENGINE_CHECK(options.min_valid_length >= 0 && options.min_valid_length <= options.sequence_length,
                 "DataLoader: min_valid_length " << options.min_valid_length << " must be in [0,"
                                                 << options.sequence_length << "]");
    ENGINE_CHECK(options.max_epochs >= 0, "DataLoader: max_epochs " << options.max_epochs << " is negative");
    ENGINE_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
                 "DataLoader: rank " << options.rank << " is not in a world of " << options.world_size);
    ENGINE_CHECK(options.world_size == 1 || options.drop_last,
                 "DataLoader: " << options.world_size << " ranks need drop_last, so that every rank gets a full part");
    ENGINE_CHECK(options.max_tokens == 0 || options.max_tokens >= options.sequence_length,
                 "DataLoader: a token budget of " << options.max_tokens << " per micro-batch is below one row of "
                                                  << options.sequence_length << " tokens (sequence_length)");
    ENGINE_CHECK(options.max_tokens >= 0, "DataLoader: max_tokens " << options.max_tokens << " is negative");
    ENGINE_CHECK(options.max_tokens == 0 || options.world_size == 1,
                 "DataLoader: a token budget per micro-batch works on one rank; "
                     << options.world_size << " ranks would each need their own budgeted batch of the global one");
    ENGINE_CHECK(options.layout == DataLayout::packed || options.min_valid_length == 0,
                 "DataLoader: min_valid_length applies to the packed layout; padded documents have their own lengths");
    if (options.vocab_size > 0) validate_tokens(tokens_, options.vocab_size, "DataLoader tokens");
    if (options.layout != DataLayout::packed) {
        int64_t first = 0;
        const auto count = static_cast<int64_t>(tokens_.size());
        for (int64_t index = 0; index < count; ++index) {
            if (tokens_[static_cast<size_t>(index)] != options.end_of_text) continue;
            documents_.emplace_back(first, index + 1 - first);
            first = index + 1;
        }
        if (first < count) documents_.emplace_back(first, count - first); // text after the last end-of-text
        window_count_ = static_cast<int64_t>(documents_.size());
        if (options.layout == DataLayout::packed_documents) {
            // Greedy in file order: a row takes documents (each truncated to T) while they fit.
            int64_t row_tokens = 0;
            for (int64_t document = 0; document < window_count_; ++document) {
                const int64_t length =
                    std::min<int64_t>(documents_[static_cast<size_t>(document)].second, options.sequence_length);
                if (packs_.empty() || row_tokens + length > options.sequence_length) {
                    packs_.emplace_back(document, 0);
                    row_tokens = 0;
                }
                ++packs_.back().second;
                row_tokens += length;
            }
            window_count_ = static_cast<int64_t>(packs_.size());
        }
    } else {
        window_count_ = static_cast<int64_t>(tokens_.size()) / options.sequence_length;
    }
    ENGINE_CHECK(
        batches_per_epoch() > 0,
        "DataLoader: " << tokens_.size() << " tokens make " << window_count_
                       << (options.layout == DataLayout::padded
                               ? " documents (end of text " + std::to_string(options.end_of_text) + ")"
                           : options.layout == DataLayout::packed_documents
                               ? " rows of packed documents (end of text " + std::to_string(options.end_of_text) + ")"
                               : " windows of " + std::to_string(options.sequence_length))
                       << ", too few for one batch of " << options.batch_size << " on each of " << options.world_size
                       << " ranks");
    cursor_.seed = options.seed;
    cursor_.rank = options.rank;
    cursor_.world_size = options.world_size;
}

int64_t DataLoader::row_tokens(int64_t epoch, int64_t window) const {
    const int64_t T = options_.sequence_length;
    if (options_.layout == DataLayout::padded) return std::min(documents_[static_cast<size_t>(window)].second, T);
    if (options_.layout == DataLayout::packed_documents) {
        const auto [first, count] = packs_[static_cast<size_t>(window)];
        int64_t tokens = 0;
        for (int64_t document = first; document < first + count; ++document)
            tokens += std::min(documents_[static_cast<size_t>(document)].second, T);
        return tokens;
    }
    (void)epoch; // packed windows are all T wide, their padding (min_valid_length) included
    return T;
}

int64_t DataLoader::budget_rows(const std::vector<int64_t>& order, int64_t epoch, int64_t position) const {
    int64_t rows = 0, longest = 0;
    const auto count = static_cast<int64_t>(order.size());
    while (position + rows < count && rows < options_.batch_size) {
        const int64_t length = std::max(longest, row_tokens(epoch, order[static_cast<size_t>(position + rows)]));
        if ((rows + 1) * length > options_.max_tokens) break;
        longest = length;
        ++rows;
    }
    return rows; // >= 1 when a window is left: max_tokens >= T >= any row
}

std::pair<int, int> largest_batch_shape(int batch_size, int sequence_length, int max_tokens, bool full_rows) {
    if (max_tokens <= 0) return {batch_size, sequence_length};
    if (full_rows) return {std::max(1, std::min(batch_size, max_tokens / sequence_length)), sequence_length};
    std::pair<int, int> best = {1, std::min(sequence_length, max_tokens)};
    for (int rows = 2; rows <= batch_size; ++rows) {
        const int length = std::min(sequence_length, max_tokens / rows);
        if (length >= 1 && int64_t(rows) * length > int64_t(best.first) * best.second) best = {rows, length};
    }
    return best;
}

std::pair<int, int> DataLoader::largest_batch_shape() const {
    return nn::largest_batch_shape(options_.batch_size, options_.sequence_length, options_.max_tokens,
                                   options_.layout == DataLayout::packed);
}

int64_t DataLoader::batches_per_epoch() const {
    if (options_.max_tokens > 0) {
        const std::vector<int64_t> order = epoch_order(cursor_.seed, cursor_.epoch);
        int64_t batches = 0;
        for (int64_t position = 0; position < window_count_; ++batches)
            position += budget_rows(order, cursor_.epoch, position);
        return batches;
    }
    const int64_t B = int64_t{options_.batch_size} * options_.world_size;
    return options_.drop_last ? window_count_ / B : (window_count_ + B - 1) / B;
}

std::vector<int64_t> DataLoader::epoch_order(uint64_t seed, int64_t epoch) const {
    std::vector<int64_t> order(static_cast<size_t>(window_count_));
    for (size_t index = 0; index < order.size(); ++index) order[index] = static_cast<int64_t>(index);
    if (!options_.shuffle) return order;
    std::mt19937_64 generator(mix64(seed ^ mix64(static_cast<uint64_t>(epoch))));
    for (size_t index = order.size(); index > 1; --index) // Fisher-Yates, last slot first
        std::swap(order[index - 1], order[uniform_below(generator, index)]);
    return order;
}

int DataLoader::valid_length(int64_t epoch, int64_t window) const {
    if (options_.min_valid_length == 0) return options_.sequence_length;
    const uint64_t hash = mix64(cursor_.seed ^ mix64(static_cast<uint64_t>(epoch) ^ mix64(static_cast<uint64_t>(window))));
    const auto span = static_cast<uint64_t>(options_.sequence_length - options_.min_valid_length + 1);
    return options_.min_valid_length + static_cast<int>(hash % span);
}

std::optional<Batch> DataLoader::next() {
    const int64_t B = int64_t{options_.batch_size} * options_.world_size; // the global batch
    while (true) {
        if (options_.max_epochs > 0 && cursor_.epoch >= options_.max_epochs) return std::nullopt;
        if (order_epoch_ != cursor_.epoch || order_seed_ != cursor_.seed) {
            order_ = epoch_order(cursor_.seed, cursor_.epoch);
            order_epoch_ = cursor_.epoch;
            order_seed_ = cursor_.seed;
        }
        const int64_t rows = options_.max_tokens > 0 ? budget_rows(order_, cursor_.epoch, cursor_.position)
                                                     : std::min(B, window_count_ - cursor_.position);
        if (rows <= 0 || (options_.max_tokens == 0 && options_.drop_last && rows < B)) {
            ++cursor_.epoch;
            cursor_.position = 0;
            continue;
        }
        int T = options_.sequence_length;
        if (options_.max_tokens > 0) { // cut to the batch's longest row
            int64_t longest = 1;
            for (int64_t row = 0; row < rows; ++row)
                longest =
                    std::max(longest, row_tokens(cursor_.epoch, order_[static_cast<size_t>(cursor_.position + row)]));
            if (options_.layout != DataLayout::packed) T = static_cast<int>(longest);
        }
        std::vector<std::vector<int32_t>> sequences;
        std::vector<std::vector<std::vector<int32_t>>> packed_rows; // packed_documents
        // This rank's rows of the global batch (all of it in one process; drop_last keeps every part full).
        const int64_t first_row = int64_t{options_.rank} * options_.batch_size;
        const int64_t end_row = options_.world_size == 1 ? rows : first_row + options_.batch_size;
        for (int64_t row = first_row; row < end_row; ++row) {
            const int64_t window = order_[static_cast<size_t>(cursor_.position + row)];
            if (options_.layout == DataLayout::packed_documents) {
                const auto [first_document, count] = packs_[static_cast<size_t>(window)];
                std::vector<std::vector<int32_t>>& row_documents = packed_rows.emplace_back();
                for (int64_t document = first_document; document < first_document + count; ++document) {
                    const auto [start, length] = documents_[static_cast<size_t>(document)];
                    const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(start);
                    row_documents.emplace_back(first, first + std::min<int64_t>(length, options_.sequence_length));
                }
                continue;
            }
            if (options_.layout == DataLayout::padded) {
                const auto [start, length] = documents_[static_cast<size_t>(window)];
                const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(start);
                // longer documents are truncated
                sequences.emplace_back(first, first + std::min<int64_t>(length, options_.sequence_length));
                continue;
            }
            const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(window * T);
            sequences.emplace_back(first, first + valid_length(cursor_.epoch, window));
        }
        cursor_.position += rows;
        if (options_.layout == DataLayout::packed_documents)
            return make_packed_document_batch(packed_rows, T, 0, options_.device);
        return make_padded_batch(sequences, T, 0, options_.device);
    }
}

BatchSource DataLoader::source() {
    return [this]() { return next(); };
}

void DataLoader::restore(const LoaderCursor& cursor) {
    ENGINE_CHECK(cursor.epoch >= 0 && cursor.position >= 0 && cursor.position <= window_count_,
                 "DataLoader::restore: cursor " << cursor.to_json() << " is outside the data (" << window_count_
                                                << " windows per epoch)");
    ENGINE_CHECK(cursor.world_size == options_.world_size,
                 "DataLoader::restore: the cursor was saved by a run of " << cursor.world_size
                     << " ranks and this run has " << options_.world_size
                     << "; each rank's part of a batch depends on the world size, so resume with the same number of ranks");
    ENGINE_CHECK(cursor.rank == options_.rank,
                 "DataLoader::restore: the cursor is rank " << cursor.rank << "'s, this loader is rank " << options_.rank);
    cursor_ = cursor;
}

} // namespace engine::nn
