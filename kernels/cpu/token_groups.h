// The rows of a batch grouped by the table row they touch (a token, or a position), built on the host: what the
// embedding's backward walks on the CPU (kernels/cpu/embedding.cpp) and uploads for the CUDA twin
// (kernels/cuda/embedding.cu), so both sum each table row's terms in the same order.
#pragma once

#include <cstdint>
#include <vector>

namespace engine::kernels {

// The positions of a batch grouped by token (a counting sort, O(B*T + largest token)): `packed` holds, one after the
// other, the positions (count) ordered by token and ascending within a token, the distinct tokens (distinct)
// ascending, and where each token's positions start (distinct + 1, the last being count). The CUDA backward takes
// `packed` uploaded as is.
struct TokenGroups {
    std::vector<int32_t> packed;
    int count = 0;
    int distinct = 0;
    const int32_t* positions() const { return packed.data(); }
    const int32_t* tokens() const { return packed.data() + count; }
    const int32_t* starts() const { return packed.data() + count + distinct; }
};
TokenGroups group_positions_by_token(const int32_t* tokens, int count);

} // namespace engine::kernels
