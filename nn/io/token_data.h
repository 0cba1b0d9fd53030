// Token data for training: byte-level files, llm.c token shards, a built-in synthetic corpus, padded
// variable-length micro-batches, and a seeded, resumable loader that feeds the trainer (nn/io/batch.h).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "nn/io/batch.h"

namespace engine::nn {

// ---- token sources ----

// Every byte of the file is one token id in [0,256).
std::vector<int32_t> read_byte_tokens(const std::string& path);

// llm.c shards: an int32[256] header {magic, version, token count, 0...}, then `count` ids. Two layouts, as llm.c's
// data scripts write them (docs/FORMATS.md): GPT-2's, uint16 ids (magic 20240520, version 1), and Llama-3's, uint32
// ids for vocabularies past 65536 (magic 20240801, version 7).
enum class TokenIdWidth { u16, u32 };
inline constexpr int32_t token_shard_magic = 20240520; // uint16 ids
inline constexpr int32_t token_shard_version = 1;
inline constexpr int32_t wide_token_shard_magic = 20240801; // uint32 ids
inline constexpr int32_t wide_token_shard_version = 7;
inline constexpr int64_t token_shard_header_bytes = 256 * 4;
int64_t token_id_bytes(TokenIdWidth width); // 2 or 4
// The width a shard's first four bytes announce (its magic), or nullopt when they are no shard magic.
std::optional<TokenIdWidth> token_shard_width(const std::string& path);
// Throws EngineError naming the file on a bad magic, a version that is not its magic's, a negative count, a size
// other than 1024 + width·count, or a uint32 id past INT32_MAX.
std::vector<int32_t> read_token_shard(const std::string& path);
// Writes atomically (temporary file + rename). Every token must fit the width (uint16: below 65536).
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       TokenIdWidth width = TokenIdWidth::u16);

// A shard when the file starts with either shard magic (then strictly validated), else byte-level tokens.
// Validates every id against vocab_size, naming the file, the token index and its byte offset.
std::vector<int32_t> load_tokens(const std::string& path, int vocab_size);

// Throws EngineError naming `source` and the first token index whose id is outside [0, vocab_size).
// first_token_byte and bytes_per_token turn the index into a byte offset in the file for the message.
void validate_tokens(const std::vector<int32_t>& tokens, int vocab_size, const std::string& source,
                     int64_t first_token_byte = 0, int64_t bytes_per_token = 4);

// The built-in dataset: English-like sentences from a small seeded grammar, as bytes (vocab 256), exactly
// `token_count` long. The stream is std::mt19937_64 (fully specified by the C++ standard) with our own
// unbiased bounded draw, so the corpus is identical on every platform. docs/FORMATS.md gives the grammar.
std::string builtin_corpus_text(size_t token_count, uint64_t seed = 0);
std::vector<int32_t> builtin_corpus(size_t token_count, uint64_t seed = 0);

// ---- batches ----

// Sequences of different valid lengths padded to T: inputs hold pad_token at padding, labels hold the
// tokens themselves (unshifted, as Hugging Face) and -100 at padding. Every sequence must have 1..T tokens.
Batch make_padded_batch(const std::vector<std::vector<int32_t>>& sequences, int sequence_length,
                        int32_t pad_token = 0, Device device = Device::cpu);

// Rows of whole documents packed back to back (DataLayout::packed_documents): inputs hold the tokens and pad_token
// after the last document, labels the tokens with -100 at each document's first token (it is no target: the
// position before it is another document's last) and at the padding, positions each token's place in its
// document (the padding counts as one more document). Every row holds 1..T tokens.
Batch make_packed_document_batch(const std::vector<std::vector<std::vector<int32_t>>>& rows, int sequence_length,
                                 int32_t pad_token = 0, Device device = Device::cpu);

// Platform-stable uniform draw in [0, bound) by rejection; std::uniform_int_distribution is not specified
// bit-for-bit by the standard, so shuffles built on it would differ between standard libraries.
uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound);

// How the token stream becomes sequences. packed: consecutive windows of T tokens, every position a target.
// padded: documents split at an end-of-text token (kept as the document's last token), each truncated or
// padded to T with labels -100 at the padding, as Hugging Face's collators do: token counts then differ
// between sequences, micro-batches and ranks. packed_documents: the same documents (each truncated to T), packed in
// file order into rows of at most T tokens (a document that does not fit starts the next row; the rest is
// padding) and the rows shuffled; positions restart and attention stays inside each document (Batch::positions),
// as Hugging Face's DataCollatorWithFlattening with varlen attention does.
enum class DataLayout { packed, padded, packed_documents };
DataLayout parse_data_layout(const std::string& name); // "packed" | "padded" | "packed-documents"
const char* data_layout_name(DataLayout layout);

// The worst micro-batch a token budget allows (what the planner plans for): the (rows, length) with the most
// positions rows x length among rows <= batch_size, length <= sequence_length, rows x length <= max_tokens, the
// fewest rows on a tie; with full_rows (DataLayout::packed: every window is T long) length is T and rows
// min(batch_size, max_tokens / T); max_tokens 0 (no budget): (batch_size, sequence_length).
std::pair<int, int> largest_batch_shape(int batch_size, int sequence_length, int max_tokens, bool full_rows = false);

struct DataLoaderOptions {
    int batch_size = 4;      // B
    int sequence_length = 64; // T
    uint64_t seed = 0;
    bool shuffle = true;
    bool drop_last = true;   // drop an epoch's last partial batch
    int64_t max_epochs = 0;  // 0: cycle forever; else next() returns nullopt after this many epochs
    // When > 0, each window keeps a deterministic pseudo-random valid length in [min_valid_length, T] and
    // the rest is padding (-100 labels): variable-length data from any token stream.
    int min_valid_length = 0;
    int vocab_size = 0;      // when > 0, every token is validated against it at construction
    Device device = Device::cpu;
    DataLayout layout = DataLayout::packed;
    int32_t end_of_text = 50256; // padded: the token that ends a document (GPT-2's <|endoftext|>)
    // A token budget per micro-batch (train_gpt's --max-tokens-per-micro-batch), 0: none. A batch takes rows in the
    // epoch's order while rows x its longest row stays within it (and rows within batch_size), and is cut to that
    // longest row (padded: its longest document; packed_documents: its fullest row; packed: T), so a batch's
    // positions, and with them its memory, are bounded by tokens, not rows (fairseq's --max-tokens; Hugging Face's
    // padding to the longest in the batch). At least sequence_length, so that any row fits. Every row of an epoch
    // is used (the last batch takes what is left: drop_last does not apply). One rank only.
    int max_tokens = 0;
    // Data parallelism: each global batch holds world_size·batch_size windows and this rank takes rows
    // rank·batch_size .. rank·batch_size+batch_size-1 of it, so the ranks' parts are disjoint and together
    // are the batch one process with batch world_size·batch_size reads. Needs drop_last when world_size > 1.
    int rank = 0;
    int world_size = 1;
};

// Where the loader stands: the next global batch is rows position.. of epoch `epoch`'s permutation under
// `seed`, and this rank's part of it is given by (rank, world_size).
struct LoaderCursor {
    uint64_t seed = 0;
    int64_t epoch = 0;
    int64_t position = 0; // index of the next window within the epoch's order
    int rank = 0;         // absent in cursors saved before data parallelism: rank 0 of 1
    int world_size = 1;
    bool operator==(const LoaderCursor&) const = default;
    std::string to_json() const;
    static LoaderCursor from_json(const std::string& text); // throws EngineError on malformed text
};

// Cuts the token stream into non-overlapping windows of T tokens (labels = inputs, unshifted; the causal
// loss shifts them), orders the windows of each epoch by a seeded Fisher-Yates shuffle, and yields batches
// of B windows. Epoch e's order depends only on (seed, e), so a restored cursor continues exactly.
class DataLoader {
public:
    DataLoader(std::vector<int32_t> tokens, const DataLoaderOptions& options);

    std::optional<Batch> next();
    BatchSource source(); // the trainer's adapter; the loader must outlive it

    LoaderCursor cursor() const { return cursor_; }
    // Throws EngineError (and changes nothing) if the position is outside the epoch, or the cursor is another
    // rank's or was saved with another world size (each rank's part of a batch depends on it).
    void restore(const LoaderCursor& cursor);

    int64_t window_count() const { return window_count_; }
    // Global batches, each world_size·batch_size windows; with a token budget, those the current epoch's order makes.
    int64_t batches_per_epoch() const;
    // The worst batch it can yield (largest_batch_shape of its options).
    std::pair<int, int> largest_batch_shape() const;
    const DataLoaderOptions& options() const { return options_; }
    // The window order of one epoch (a permutation of 0..window_count-1), for inspection and tests.
    std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch) const;

private:
    int valid_length(int64_t epoch, int64_t window) const;
    // The window's tokens in a row: its document (cut to T), its packed documents, or its valid length.
    int64_t row_tokens(int64_t epoch, int64_t window) const;
    // With a token budget: how many windows of `order` from `position` the next batch takes.
    int64_t budget_rows(const std::vector<int64_t>& order, int64_t epoch, int64_t position) const;

    std::vector<int32_t> tokens_;
    // padded: each document's (first token, length); window w is document w
    std::vector<std::pair<int64_t, int64_t>> documents_;
    // packed_documents: window w is documents first .. first + count - 1 (first, count)
    std::vector<std::pair<int64_t, int64_t>> packs_;
    DataLoaderOptions options_;
    int64_t window_count_ = 0;
    LoaderCursor cursor_;
    std::vector<int64_t> order_; // order of cursor_.epoch under cursor_.seed
    int64_t order_epoch_ = -1;
    uint64_t order_seed_ = 0;
};

} // namespace engine::nn
