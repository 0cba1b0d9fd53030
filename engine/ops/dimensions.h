// Dimension arguments of the general ops: negative dimensions counted from the end, and a tensor seen as
// (outer, size, inner) around one dimension, the layout every "over a dimension" kernel takes.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "engine/tensor.h"

namespace engine::detail {

// dim in [-rank, rank) -> [0, rank); anything else is an error naming the op and the shape.
inline int64_t normalize_dimension(const char* op, int64_t dim, const Shape& shape) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    ENGINE_CHECK(dim >= -rank && dim < rank, op << ": dimension " << dim << " is out of range for shape "
                                                << shape_string(shape) << " (rank " << rank << ")");
    return dim < 0 ? dim + rank : dim;
}

// A contiguous tensor around dimension `dim`: outer = product of the dimensions before it, size = its
// extent, inner = product of those after it. Element (o, i, n) sits at (o * size + i) * inner + n.
struct AroundDimension {
    int64_t outer = 1;
    int64_t size = 1;
    int64_t inner = 1;
};
inline AroundDimension around_dimension(const Shape& shape, int64_t dim) {
    AroundDimension split;
    for (int64_t axis = 0; axis < static_cast<int64_t>(shape.size()); ++axis) {
        const int64_t extent = shape[static_cast<size_t>(axis)];
        if (axis < dim) split.outer *= extent;
        else if (axis == dim) split.size = extent;
        else split.inner *= extent;
    }
    return split;
}

} // namespace engine::detail
