// ZeRO's partition of a flat layout of elements over the ranks, and the pieces its collectives move at a time: what
// optim::ZeroShards allocates and the planner predicts, in one place.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"

namespace engine::distributed {

// The elements laid end to end are cut into `ranks` parts of `part` elements (the last ones padded), and each
// collective moves one piece of every part: `piece` elements per rank, as many as keep the pieces of all the ranks
// within zero_bucket_bytes, so that the buffers the collectives need stay that small whatever the model. `part` is a
// whole number of pieces. Rank r keeps elements [min(total, r·part), min(total, (r+1)·part)).
inline constexpr size_t zero_bucket_bytes = size_t(32) << 20;

// The bucket in use: zero_bucket_bytes, or the environment's ENGINE_ZERO_BUCKET_BYTES (a positive number of bytes):
// smaller buffers for more collectives. Read where the partition is made, by the trainer and the planner alike.
inline size_t zero_bucket_bytes_in_use() {
    const char* text = std::getenv("ENGINE_ZERO_BUCKET_BYTES");
    if (text == nullptr || *text == '\0') return zero_bucket_bytes;
    char* end = nullptr;
    const unsigned long long bytes = std::strtoull(text, &end, 10);
    ENGINE_CHECK(end != nullptr && *end == '\0' && bytes > 0 && text[0] != '-',
                 "ENGINE_ZERO_BUCKET_BYTES='" << text << "' is not a positive number of bytes");
    return static_cast<size_t>(bytes);
}

struct ZeroPartition {
    int64_t total = 0;
    int64_t ranks = 1;
    int64_t piece = 0;  // elements of one rank's part a collective moves
    int64_t part = 0;   // elements per rank: pieces * piece
    int64_t pieces = 0; // collectives per pass over the parts

    static ZeroPartition of(int64_t total, int64_t ranks, size_t element_bytes) {
        ZeroPartition partition;
        partition.total = total;
        partition.ranks = ranks;
        const int64_t even = (total + ranks - 1) / ranks; // the parts before padding to whole pieces
        const auto fitting =
            static_cast<int64_t>(zero_bucket_bytes_in_use() / (static_cast<size_t>(ranks) * element_bytes));
        partition.piece = std::max<int64_t>(1, std::min(even, std::max<int64_t>(1, fitting)));
        partition.pieces = (even + partition.piece - 1) / partition.piece;
        partition.part = partition.pieces * partition.piece;
        return partition;
    }
    int64_t begin(int64_t rank) const { return std::min(total, rank * part); }
    int64_t end(int64_t rank) const { return std::min(total, begin(rank) + part); }
    // The workspace a rank holds for the collectives: every rank's piece, and its own.
    int64_t buffer_elements() const { return (ranks + 1) * piece; }
};

} // namespace engine::distributed
