// parallel_for for the CPU kernels: OpenMP over fixed-size chunks, so that results are bitwise the same for any
// thread count (docs/PERF.md, "Threads for the non-GEMM CPU kernels").
//
// The contract a kernel keeps when it uses this: each chunk writes outputs no other chunk writes, and every output
// element's arithmetic (its operations and their order) is the one the single-threaded loop does. The chunk size
// is a constant of the kernel and its shape, never of the thread count, so the only thing threads change is which
// core runs a chunk. One chunk, one thread, or a call from inside a parallel region: the body runs inline, with no
// OpenMP region, so small tensors pay no thread start-up.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace engine::kernels::cpu {

// Work per chunk, in elements of the kernel's main tensor. A region costs a few microseconds to start and join,
// so a chunk should take well over that on one core:
// - cheap: a plain stream (residual, bias add, copies, SGD): ~0.05 ns per byte from L2, so 64 Ki elements take
//   ~10-20 us;
// - row: a normalisation row or a column sum (a double add chain, ~1 ns per element): 8 Ki elements ~10 us;
// - costly: a libm call or a Philox block per element (GELU, exp, dropout, AdamW's sqrt and divisions at
//   ~2-20 ns per element): 4 Ki elements ~10-80 us.
inline constexpr int64_t cheap_elements_per_chunk = int64_t(1) << 16;
inline constexpr int64_t row_elements_per_chunk = int64_t(1) << 13;
inline constexpr int64_t costly_elements_per_chunk = int64_t(1) << 12;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many chunks parallel_for(count, chunk, ...) runs: the tests use it to check that a shape really splits.
inline int64_t chunk_count(int64_t count, int64_t chunk) { return count <= 0 ? 0 : ceil_div(count, std::max<int64_t>(chunk, 1)); }

// Rows (or columns, or blocks) of `elements_per_item` each, grouped so that a chunk holds about
// `elements_per_chunk` elements and at least one item.
inline int64_t items_per_chunk(int64_t elements_per_item, int64_t elements_per_chunk) {
    return std::max<int64_t>(1, elements_per_chunk / std::max<int64_t>(elements_per_item, 1));
}

// Columns of a (rows, columns) column sum per chunk: about row_elements_per_chunk elements, at least 16 columns
// (a 64-byte line of floats, so that chunks do not share the lines they write), a multiple of 16.
inline int64_t columns_per_chunk(int64_t rows) {
    const int64_t columns = std::max<int64_t>(16, ceil_div(row_elements_per_chunk, std::max<int64_t>(rows, 1)));
    return ceil_div(columns, 16) * 16;
}

// Calls body(begin, end) for [0,count) split into chunks of `chunk` (the last may be shorter), in any order and on
// any thread. Dynamic scheduling: on a shared machine one descheduled thread should not hold the others up.
template <typename Body>
void parallel_for(int64_t count, int64_t chunk, Body&& body) {
    if (count <= 0) return;
    chunk = std::max<int64_t>(chunk, 1);
    const int64_t chunks = ceil_div(count, chunk);
    if (chunks == 1 || omp_get_max_threads() == 1 || omp_in_parallel()) {
        // The same chunks in ascending order: not needed for correctness (chunks are independent) but it keeps
        // the inline path identical to the threaded one in every respect a kernel could observe.
        for (int64_t index = 0; index < chunks; ++index) body(index * chunk, std::min(count, (index + 1) * chunk));
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t index = 0; index < chunks; ++index) body(index * chunk, std::min(count, (index + 1) * chunk));
}

} // namespace engine::kernels::cpu
