// Builds the broadcast layouts of kernels/common/pointwise_functions.h from shapes, on the host: for the op
// layer and for kernel tests. Shapes must already be broadcast-compatible (the op layer checks and names them).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/pointwise_functions.h"

namespace engine::kernels {

// NumPy's rule: shapes right-aligned, each pair of extents equal or one of them 1. Empty on a mismatch.
inline std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                            bool& compatible) {
    const size_t rank = a.size() > b.size() ? a.size() : b.size();
    std::vector<int64_t> out(rank);
    compatible = true;
    for (size_t axis = 0; axis < rank; ++axis) {
        const int64_t a_extent = axis + a.size() >= rank ? a[axis + a.size() - rank] : 1;
        const int64_t b_extent = axis + b.size() >= rank ? b[axis + b.size() - rank] : 1;
        if (a_extent != b_extent && a_extent != 1 && b_extent != 1) compatible = false;
        out[axis] = a_extent == 1 ? b_extent : a_extent;
    }
    if (!compatible) out.clear();
    return out;
}

// The layout of out = f(a, b) for out's shape; out must be broadcast_shape(a, b). Returns false, leaving
// `layout` unusable, when the merged rank exceeds max_broadcast_rank (the op layer reports it).
inline bool make_broadcast_layout(BroadcastLayout& layout, const std::vector<int64_t>& out,
                                  const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    const size_t rank = out.size();
    const std::vector<int64_t>* operands[2] = {&a, &b};
    // Right-aligned contiguous strides of each operand in output dimensions, 0 where it broadcasts.
    std::vector<int64_t> strides[2];
    for (int which = 0; which < 2; ++which) {
        const std::vector<int64_t>& shape = *operands[which];
        strides[which].assign(rank, 0);
        int64_t stride = 1;
        for (size_t axis = rank; axis-- > 0;) {
            const size_t offset = rank - shape.size();
            if (axis < offset) continue;
            const int64_t extent = shape[axis - offset];
            if (extent != 1) strides[which][axis] = stride;
            stride *= extent;
        }
    }
    layout = BroadcastLayout{};
    layout.count = 1;
    for (size_t axis = 0; axis < rank; ++axis) {
        const int64_t extent = out[axis];
        layout.count *= extent;
        if (extent == 1) continue; // reaches only index 0: no arithmetic needed
        const int last = layout.rank - 1;
        // Merge into the previous kept dimension when both operands broadcast there exactly as here: their
        // contiguous strides then chain (stride[previous] = stride[this] * extent).
        const bool merges = last >= 0 && (layout.strides[0][last] == 0) == (strides[0][axis] == 0) &&
                            (layout.strides[1][last] == 0) == (strides[1][axis] == 0);
        if (merges) {
            layout.sizes[last] *= extent;
            for (int which = 0; which < 2; ++which) layout.strides[which][last] = strides[which][axis];
            continue;
        }
        if (layout.rank == max_broadcast_rank) return false;
        layout.sizes[layout.rank] = extent;
        for (int which = 0; which < 2; ++which) layout.strides[which][layout.rank] = strides[which][axis];
        ++layout.rank;
    }
    return true;
}

// Output strides of a layout (contiguous over its merged extents).
inline void layout_output_strides(const BroadcastLayout& layout, int64_t* output_strides) {
    int64_t stride = 1;
    for (int axis = layout.rank - 1; axis >= 0; --axis) {
        output_strides[axis] = stride;
        stride *= layout.sizes[axis];
    }
}

// The gradient walk of operand `which` of `layout`.
inline GradientLayout make_gradient_layout(const BroadcastLayout& layout, int which) {
    int64_t output_strides[max_broadcast_rank];
    layout_output_strides(layout, output_strides);
    GradientLayout gradient;
    gradient.which = which;
    const int other = 1 - which;
    for (int axis = 0; axis < layout.rank; ++axis) {
        if (layout.strides[which][axis] != 0) {
            const int k = gradient.kept_rank++;
            gradient.kept_sizes[k] = layout.sizes[axis];
            gradient.kept_output_strides[k] = output_strides[axis];
            gradient.kept_other_strides[k] = layout.strides[other][axis];
            gradient.kept_count *= layout.sizes[axis];
        } else {
            const int r = gradient.reduced_rank++;
            gradient.reduced_sizes[r] = layout.sizes[axis];
            gradient.reduced_output_strides[r] = output_strides[axis];
            gradient.reduced_other_strides[r] = layout.strides[other][axis];
            gradient.reduced_count *= layout.sizes[axis];
        }
    }
    gradient.innermost_reduced = layout.rank > 0 && layout.strides[which][layout.rank - 1] == 0;
    return gradient;
}

} // namespace engine::kernels
