// Token plus position embedding lookup (or the token lookup alone, without a position table), the CPU
// reference for kernels/cuda/embedding.cu.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/token_groups.h"

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

template <typename Scalar>
void embedding_backward(Compute<Scalar>* dtoken_table, Compute<Scalar>* dposition_table, const Scalar* dout,
                        const int32_t* tokens, const int32_t* positions, int B, int T, int C) {
    // Each table row's terms are summed first, in ascending position order from zero, and the sum is added to the
    // table once. So a gradient buffer that accumulates micro-batches receives, per micro-batch, the one addition
    // that a fresh buffer summed into a running total would (ZeRO reduces the token table's gradient per micro-batch:
    // stages 2 and 3 train bitwise alike); the CUDA twin sums the same groups (kernels/cpu/token_groups.h) the same
    // way. A token repeated in the batch scatters into one row, so rows cannot be split across threads; channels can.
    // The tables are Compute<Scalar>, so no rounding to bf16 here.
    const int rows = B * T;
    const TokenGroups token_groups = group_positions_by_token(tokens, rows);
    TokenGroups position_groups;
    if (dposition_table != nullptr) {
        std::vector<int32_t> row_positions(static_cast<size_t>(rows)); // packed documents' positions, else t
        for (int row = 0; row < rows; ++row) row_positions[static_cast<size_t>(row)] = positions ? positions[row] : row % T;
        position_groups = group_positions_by_token(row_positions.data(), rows);
    }
    parallel_for(C, columns_per_chunk(rows), [&](int64_t first_channel, int64_t end_channel) {
        std::vector<Compute<Scalar>> sums(static_cast<size_t>(end_channel - first_channel));
        const auto add_groups = [&](const TokenGroups& groups, Compute<Scalar>* table) {
            for (int group = 0; group < groups.distinct; ++group) {
                std::fill(sums.begin(), sums.end(), Compute<Scalar>(0));
                for (int index = groups.starts()[group]; index < groups.starts()[group + 1]; ++index) {
                    const Scalar* dout_row = dout + int64_t(groups.positions()[index]) * C + first_channel;
                    for (size_t c = 0; c < sums.size(); ++c) sums[c] += widen(dout_row[c]);
                }
                Compute<Scalar>* table_row = table + int64_t(groups.tokens()[group]) * C + first_channel;
                for (size_t c = 0; c < sums.size(); ++c) table_row[c] += sums[c];
            }
        };
        add_groups(token_groups, dtoken_table);
        if (dposition_table != nullptr) add_groups(position_groups, dposition_table); // none: Llama
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
