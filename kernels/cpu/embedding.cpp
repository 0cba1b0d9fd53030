// Token plus position embedding lookup (or the token lookup alone, without a position table), the CPU
// reference for kernels/cuda/embedding.cu.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename Scalar>
void embedding_forward(Scalar* out, const int32_t* tokens, const Scalar* token_table, const Scalar* position_table,
                       const int32_t* positions, int B, int T, int C) {
    // Positions are independent: chunks of them on threads.
    parallel_for(int64_t(B) * T, items_per_chunk(C, cheap_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t row = first_row; row < end_row; ++row) {
            const int64_t t = positions ? positions[row] : row % T; // the position row (packed documents: restarting)
            Scalar* out_row = out + row * C;
            const Scalar* token_row = token_table + static_cast<int64_t>(tokens[row]) * C;
            if (position_table == nullptr) { // Llama: no position table, a plain copy of the token's row
                for (int c = 0; c < C; ++c) out_row[c] = token_row[c];
                continue;
            }
            const Scalar* position_row = position_table + t * C;
            for (int c = 0; c < C; ++c) out_row[c] = narrow<Scalar>(widen(token_row[c]) + widen(position_row[c]));
        }
    });
}

namespace {

// The rows in order of their key (a table row), ascending within a key: a stable counting sort.
template <typename KeyOf>
std::vector<int64_t> rows_by_key(int64_t rows, const KeyOf& key_of) {
    int64_t largest = 0;
    for (int64_t row = 0; row < rows; ++row) largest = std::max(largest, key_of(row));
    std::vector<int64_t> starts(static_cast<size_t>(largest) + 2, 0);
    for (int64_t row = 0; row < rows; ++row) ++starts[static_cast<size_t>(key_of(row)) + 1];
    for (size_t key = 1; key < starts.size(); ++key) starts[key] += starts[key - 1];
    std::vector<int64_t> order(static_cast<size_t>(rows));
    for (int64_t row = 0; row < rows; ++row) order[static_cast<size_t>(starts[static_cast<size_t>(key_of(row))]++)] = row;
    return order;
}

} // namespace

template <typename Scalar>
void embedding_backward(Compute<Scalar>* dtoken_table, Compute<Scalar>* dposition_table, const Scalar* dout,
                        const int32_t* tokens, const int32_t* positions, int B, int T, int C) {
    // Each table row's terms are summed first, in ascending position order from zero, and the sum is added to the
    // table once. So a gradient buffer that accumulates micro-batches receives, per micro-batch, the one addition
    // that a fresh buffer summed into a running total would (ZeRO-3 reduces the token table's gradient per
    // micro-batch: it trains bitwise as stage 2, which accumulates); the CUDA twin sums the same way. A token repeated
    // in the batch scatters into one row, so rows cannot be split across threads; channels can. The tables are
    // Compute<Scalar>, so no rounding to bf16 here.
    const int64_t rows = int64_t(B) * T;
    const std::vector<int64_t> token_order = rows_by_key(rows, [&](int64_t row) { return int64_t(tokens[row]); });
    std::vector<int64_t> position_order;
    const auto position_of = [&](int64_t row) { return positions ? int64_t(positions[row]) : row % T; };
    if (dposition_table != nullptr) position_order = rows_by_key(rows, position_of);
    parallel_for(C, columns_per_chunk(rows), [&](int64_t first_channel, int64_t end_channel) {
        std::vector<Compute<Scalar>> sums(static_cast<size_t>(end_channel - first_channel));
        const auto add_groups = [&](const std::vector<int64_t>& order, const auto& key_of, Compute<Scalar>* table) {
            for (size_t index = 0; index < order.size();) {
                const int64_t key = key_of(order[index]);
                std::fill(sums.begin(), sums.end(), Compute<Scalar>(0));
                for (; index < order.size() && key_of(order[index]) == key; ++index) {
                    const Scalar* dout_row = dout + order[index] * C + first_channel;
                    for (size_t c = 0; c < sums.size(); ++c) sums[c] += widen(dout_row[c]);
                }
                Compute<Scalar>* table_row = table + key * C + first_channel;
                for (size_t c = 0; c < sums.size(); ++c) table_row[c] += sums[c];
            }
        };
        add_groups(token_order, [&](int64_t row) { return int64_t(tokens[row]); }, dtoken_table);
        if (dposition_table != nullptr) add_groups(position_order, position_of, dposition_table); // none: Llama
    });
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, const int32_t*, int, int,
                                       int);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*, const int32_t*, int, int,
                                        int);
template void embedding_forward<bfloat16>(bfloat16*, const int32_t*, const bfloat16*, const bfloat16*, const int32_t*,
                                          int, int, int);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, const int32_t*, int, int, int);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, const int32_t*, int, int,
                                         int);
template void embedding_backward<bfloat16>(float*, float*, const bfloat16*, const int32_t*, const int32_t*, int, int,
                                           int);

} // namespace engine::kernels::cpu
