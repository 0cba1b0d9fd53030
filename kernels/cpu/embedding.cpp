// Token plus position embedding lookup (or the token lookup alone, without a position table), the CPU
// reference for kernels/cuda/embedding.cu.
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

template <typename Scalar>
void embedding_backward(Compute<Scalar>* dtoken_table, Compute<Scalar>* dposition_table, const Scalar* dout,
                        const int32_t* tokens, const int32_t* positions, int B, int T, int C) {
    // A token repeated in the batch scatters into the same table row, so positions cannot be split across threads.
    // Channels can: a chunk of channels visits every position in order (b, then t, ascending), so each table
    // element receives its terms in the order of the serial loop. The tables are Compute<Scalar>, so no rounding
    // to bf16 here.
    const int64_t rows = int64_t(B) * T;
    parallel_for(C, columns_per_chunk(rows), [&](int64_t first_channel, int64_t end_channel) {
        for (int64_t row = 0; row < rows; ++row) {
            const int64_t t = positions ? positions[row] : row % T;
            const Scalar* dout_row = dout + row * C;
            Compute<Scalar>* dtoken_row = dtoken_table + static_cast<int64_t>(tokens[row]) * C;
            for (int64_t c = first_channel; c < end_channel; ++c) dtoken_row[c] += widen(dout_row[c]);
            if (dposition_table == nullptr) continue; // no position table
            Compute<Scalar>* dposition_row = dposition_table + t * C;
            for (int64_t c = first_channel; c < end_channel; ++c) dposition_row[c] += widen(dout_row[c]);
        }
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
