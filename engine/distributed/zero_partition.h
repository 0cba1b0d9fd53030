// ZeRO's partition of a flat layout of elements over the ranks, and the pieces its collectives move at a time: what
// optim::ZeroShards allocates and the planner predicts, in one place.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"

namespace engine::distributed {

// The elements laid end to end are cut into `ranks` parts of `part` elements (the last ones padded), and each
// collective moves one piece of every part: as few pieces as keep each rank's piece within zero_bucket_bytes / ranks
// (so the N pieces within the bucket), all of one size, so that the buffers the collectives need stay that small
// whatever the model: N + 1 pieces, (N + 1) / N of the bucket at most. `part` is a whole number of pieces, padded by
// fewer elements than there are pieces. Rank r keeps elements [min(total, r·part), min(total, (r+1)·part)).
inline constexpr size_t zero_bucket_bytes = size_t(32) << 20;

// The bucket in use: zero_bucket_bytes, or the environment's ENGINE_ZERO_BUCKET_BYTES (a positive number of bytes):
// smaller buffers for more collectives. Read where the partition is made, by the trainer and the planner alike.
inline size_t zero_bucket_bytes_in_use() {
    const char* text = std::getenv("ENGINE_ZERO_BUCKET_BYTES");
    if (text == nullptr || *text == '\0') return zero_bucket_bytes;
    bool digits = true;
    for (const char* at = text; *at != '\0'; ++at) digits = digits && *at >= '0' && *at <= '9';
    errno = 0;
    const unsigned long long bytes = digits ? std::strtoull(text, nullptr, 10) : 0;
    ENGINE_CHECK(digits && errno != ERANGE && bytes > 0,
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
        const int64_t even = std::max<int64_t>(1, (total + ranks - 1) / ranks); // the parts before whole pieces
        const int64_t fitting = std::max<int64_t>(
            1, static_cast<int64_t>(zero_bucket_bytes_in_use() / (static_cast<size_t>(ranks) * element_bytes)));
        partition.pieces = (even + fitting - 1) / fitting;
        partition.piece = (even + partition.pieces - 1) / partition.pieces; // at most `fitting`, pieces equal
        partition.part = partition.pieces * partition.piece;
        return partition;
    }
    int64_t begin(int64_t rank) const { return std::min(total, rank * part); }
    int64_t end(int64_t rank) const { return std::min(total, begin(rank) + part); }
    // The workspace a rank holds for the collectives: every rank's piece, and its own.
    int64_t buffer_elements() const { return (ranks + 1) * piece; }
};

} // namespace engine::distributed
