// The host grouping of a batch's rows by table row, shared by the CPU and CUDA embedding backward.
#include "kernels/cpu/token_groups.h"

#include <algorithm>
#include <cstddef>

namespace engine::kernels {

TokenGroups group_positions_by_token(const int32_t* tokens, int count) {
    TokenGroups groups;
    groups.count = count;
    const int32_t largest = count > 0 ? *std::max_element(tokens, tokens + count) : 0;
    std::vector<int32_t> starts(size_t(largest) + 2, 0); // counting sort over token values
    for (int position = 0; position < count; ++position) ++starts[size_t(tokens[position]) + 1];
    for (int32_t token = 0; token <= largest; ++token) groups.distinct += starts[size_t(token) + 1] > 0;
    for (size_t token = 1; token < starts.size(); ++token) starts[token] += starts[token - 1];
    groups.packed.resize(size_t(count) + 2 * size_t(groups.distinct) + 1);
    int32_t* positions = groups.packed.data();
    int32_t* distinct_tokens = positions + count;
    int32_t* group_starts = distinct_tokens + groups.distinct;
    int group = 0;
    for (int32_t token = 0; token <= largest; ++token) {
        if (starts[size_t(token) + 1] == starts[size_t(token)]) continue;
        distinct_tokens[group] = token;
        group_starts[group++] = starts[size_t(token)];
    }
    group_starts[groups.distinct] = count;
    std::vector<int32_t> next(starts.begin(), starts.end() - 1);
    for (int position = 0; position < count; ++position) positions[next[size_t(tokens[position])]++] = position;
    return groups;
}

} // namespace engine::kernels
