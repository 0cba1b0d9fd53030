// permute as a contiguous copy (CUDA twin of kernels/cpu/permute.cpp). The host first merges the axes that stay
// adjacent and drops size-1 axes; a permutation that then moves the last axis runs through 32x32 shared-memory
// tiles, any other as a gather along the kept last axis. Both are bounded by memory bandwidth (one read and one
// write per element, two reads when accumulating); the gather adds an int64 div/mod per merged axis per element.
#include "base/cuda/launch.h"
#include "kernels/cpu/layout_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"

namespace engine::kernels::cuda {
namespace {

constexpr int max_rank = cpu::max_permute_rank;
constexpr int block_size = 256;
constexpr int tile = 32;       // a warp's width: one tile row is one coalesced access
constexpr int tile_rows = 8;   // threads per tile column; each thread moves tile / tile_rows elements
constexpr int64_t max_grid_yz = 65535;

// The output's axes, each with its extent and the input's element stride along it.
struct PermuteLayout {
    int rank = 0;
    int64_t extents[max_rank] = {};
    int64_t input_strides[max_rank] = {};
};

// Merges output axes whose input axes are consecutive (they move as one) and drops extent-1 axes, so the
// kernels see the fewest axes: a (B,T,NH,HS) -> (B,NH,T,HS) permute becomes a batched (T,NH) swap of HS rows.
PermuteLayout simplified_layout(const int64_t* shape, const int64_t* dims, int rank) {
    int64_t strides[max_rank];
    int64_t stride = 1;
    for (int axis = rank - 1; axis >= 0; --axis) {
        strides[axis] = stride;
        stride *= shape[axis];
    }
    PermuteLayout layout;
    int previous_input_axis = -2;
    for (int axis = 0; axis < rank; ++axis) {
        const int input_axis = static_cast<int>(dims[axis]);
        if (shape[input_axis] == 1) continue;
        if (layout.rank > 0 && input_axis == previous_input_axis + 1) {
            // Continues the previous output axis in the input's order too: one axis of the product's extent,
            // stepping as the inner one.
            layout.extents[layout.rank - 1] *= shape[input_axis];
            layout.input_strides[layout.rank - 1] = strides[input_axis];
        } else {
            layout.extents[layout.rank] = shape[input_axis];
            layout.input_strides[layout.rank] = strides[input_axis];
            ++layout.rank;
        }
        previous_input_axis = input_axis;
    }
    return layout;
}

template <bool accumulate, typename T>
static __device__ __forceinline__ void store(T* destination, float value) {
    if constexpr (accumulate) value += widen(*destination);
    *destination = narrow<T>(value);
}

// Grid-stride over the output in order: writes are coalesced, and since the last output axis is the input's
// last (stride 1) the reads are too.
template <bool accumulate, typename T>
static __global__ void permute_gather_kernel(T* out, const T* inp, PermuteLayout layout, int64_t count) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t position = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; position < count; position += stride) {
        int64_t remaining = position, offset = 0;
        for (int axis = layout.rank - 1; axis >= 0; --axis) {
            const int64_t extent = layout.extents[axis], index = remaining % extent;
            remaining /= extent;
            offset += index * layout.input_strides[axis];
        }
        store<accumulate>(out + position, widen(inp[offset]));
    }
}

// The last output axis `row_axis` (input stride `row_stride`) and the input's last axis (output position
// `column_axis`, output stride `column_stride`) form a 2-D transpose per batch entry. A block reads a 32x32
// tile along the input's last axis (coalesced), and writes it along the output's last axis (coalesced); the
// tile's extra column keeps the transposed reads in shared memory off a single bank.
struct TiledLayout {
    int64_t rows = 0, columns = 0;         // extents of the output's last axis and of the input's last axis
    int64_t row_stride = 0;                // input stride along the output's last axis
    int64_t column_stride = 0;             // output stride along the input's last axis
    PermuteLayout batch;                   // the remaining axes: extents, input strides
    int64_t batch_output_strides[max_rank] = {};
    int64_t batch_count = 1;
};

template <bool accumulate, typename T>
static __global__ void permute_tiled_kernel(T* out, const T* inp, TiledLayout layout) {
    ENGINE_DYNAMIC_SHARED(float, shared); // (tile, tile + 1)
    const int64_t column_start = int64_t(blockIdx.x) * tile;
    const int64_t row_tiles = (layout.rows + tile - 1) / tile;
    for (int64_t work = blockIdx.z * int64_t(gridDim.y) + blockIdx.y; work < layout.batch_count * row_tiles;
         work += int64_t(gridDim.z) * gridDim.y) {
        const int64_t entry = work / row_tiles, row_start = (work - entry * row_tiles) * tile;
        int64_t remaining = entry, input_base = 0, output_base = 0;
        for (int axis = layout.batch.rank - 1; axis >= 0; --axis) {
            const int64_t extent = layout.batch.extents[axis], index = remaining % extent;
            remaining /= extent;
            input_base += index * layout.batch.input_strides[axis];
            output_base += index * layout.batch_output_strides[axis];
        }
        for (int r = threadIdx.y; r < tile; r += tile_rows) {
            const int64_t row = row_start + r, column = column_start + threadIdx.x;
            if (row < layout.rows && column < layout.columns)
                shared[r * (tile + 1) + threadIdx.x] = widen(inp[input_base + row * layout.row_stride + column]);
        }
        __syncthreads();
        for (int c = threadIdx.y; c < tile; c += tile_rows) {
            const int64_t column = column_start + c, row = row_start + threadIdx.x;
            if (row < layout.rows && column < layout.columns)
                store<accumulate>(out + output_base + column * layout.column_stride + row,
                                  shared[threadIdx.x * (tile + 1) + c]);
        }
        __syncthreads(); // the tile is read before the next batch entry overwrites it
    }
}

template <bool accumulate, typename T>
void launch_permute(T* out, const T* inp, const int64_t* shape, const int64_t* dims, int rank, cudaStream_t stream) {
    int64_t count = 1;
    for (int axis = 0; axis < rank; ++axis) count *= shape[axis];
    if (count == 0) return;
    const PermuteLayout layout = simplified_layout(shape, dims, rank);
    const int last = layout.rank - 1;
    if (layout.rank <= 1 || layout.input_strides[last] == 1) {
        ENGINE_LAUNCH((permute_gather_kernel<accumulate, T>), elementwise_grid(count, block_size), block_size, 0,
                      stream, out, inp, layout, count);
        return;
    }
    TiledLayout tiled;
    int64_t output_strides[max_rank];
    int64_t stride = 1;
    for (int axis = last; axis >= 0; --axis) {
        output_strides[axis] = stride;
        stride *= layout.extents[axis];
    }
    tiled.rows = layout.extents[last];
    tiled.row_stride = layout.input_strides[last];
    for (int axis = 0; axis < last; ++axis) {
        if (layout.input_strides[axis] == 1) {
            tiled.columns = layout.extents[axis];
            tiled.column_stride = output_strides[axis];
            continue;
        }
        const int batch_axis = tiled.batch.rank++;
        tiled.batch.extents[batch_axis] = layout.extents[axis];
        tiled.batch.input_strides[batch_axis] = layout.input_strides[axis];
        tiled.batch_output_strides[batch_axis] = output_strides[axis];
        tiled.batch_count *= layout.extents[axis];
    }
    // y and z together walk (batch entry, row tile) pairs, capped; x covers the column tiles.
    const int64_t pairs = tiled.batch_count * ceil_div(tiled.rows, tile);
    const int64_t pairs_y = pairs < max_grid_yz ? pairs : max_grid_yz;
    const int64_t rest = (pairs + pairs_y - 1) / pairs_y;
    const dim3 grid(ceil_div(tiled.columns, tile), static_cast<unsigned>(pairs_y),
                    static_cast<unsigned>(rest < max_grid_yz ? rest : max_grid_yz));
    const dim3 block(tile, tile_rows);
    ENGINE_LAUNCH((permute_tiled_kernel<accumulate, T>), grid, block, tile * (tile + 1) * sizeof(float), stream, out,
                  inp, tiled);
}

// The backward permutes dout back by the inverse, over dout's shape, so it writes dinp in order too.
template <typename T>
void launch_permute_backward(T* dinp, const T* dout, const int64_t* shape, const int64_t* dims, int rank,
                             cudaStream_t stream) {
    int64_t out_shape[max_rank] = {}, inverse[max_rank] = {};
    for (int axis = 0; axis < rank; ++axis) {
        out_shape[axis] = shape[dims[axis]];
        inverse[dims[axis]] = axis;
    }
    launch_permute<true>(dinp, dout, out_shape, inverse, rank, stream);
}

} // namespace

void permute_forward(float* out, const float* inp, const int64_t* shape, const int64_t* dims, int rank,
                     cudaStream_t stream) {
    launch_permute<false>(out, inp, shape, dims, rank, stream);
}
void permute_forward(bfloat16* out, const bfloat16* inp, const int64_t* shape, const int64_t* dims, int rank,
                     cudaStream_t stream) {
    launch_permute<false>(out, inp, shape, dims, rank, stream);
}
void permute_backward(float* dinp, const float* dout, const int64_t* shape, const int64_t* dims, int rank,
                      cudaStream_t stream) {
    launch_permute_backward(dinp, dout, shape, dims, rank, stream);
}
void permute_backward(bfloat16* dinp, const bfloat16* dout, const int64_t* shape, const int64_t* dims, int rank,
                      cudaStream_t stream) {
    launch_permute_backward(dinp, dout, shape, dims, rank, stream);
}

} // namespace engine::kernels::cuda
