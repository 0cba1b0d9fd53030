// Shared pieces of the tensor-core attention kernels (attention_forward.cu, attention_backward.cu): tile
// shapes and shared-memory layouts per head size, global <-> shared tile copies, and the wmma tile product in
// plain TF32 or error-compensated 3xTF32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "base/cuda/check.h"
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda::attention_tiles {

inline constexpr int warps_per_block = 4;
inline constexpr int threads_per_block = warps_per_block * warp_size;
// wmma m16n16k8 (TF32): each product works on 16 x 16 output tiles, stepping 8 along the inner dimension.
inline constexpr int fragment_width = 16;
inline constexpr int fragment_depth = 8;
// Floats added to every shared row. wmma needs strides that are multiples of 4 floats; 4 extra floats move
// consecutive rows to different banks (a thread per row then meets 4-way, not 32-way, bank conflicts).
inline constexpr int row_padding = 4;
// sm_90: dynamic shared memory a block may use after cudaFuncSetAttribute, and the limit without it.
inline constexpr size_t max_shared_bytes = 227 * 1024;
inline constexpr size_t default_shared_bytes = 48 * 1024;

// The head dimension rounded up to the wmma tile width; the extra columns of every shared tile hold zeros,
// so products over them add nothing.
__host__ __device__ constexpr int padded_head_size(int head_size) {
    return (head_size + fragment_width - 1) / fragment_width * fragment_width;
}
// Rows of a tile of the wide operand (64, or 32 above a padded head of 128 so that the largest kernel,
// the key/value backward, stays within max_shared_bytes at head size 256).
__host__ __device__ constexpr int wide_tile_rows(int padded_head) { return padded_head <= 128 ? 64 : 32; }
// Query rows per step of the key/value backward kernel: it holds six head-wide tiles, so its query tiles
// are half as tall as its key tiles.
inline constexpr int backward_query_rows = 32;

// Where each array of a kernel's dynamic shared memory starts. Every kernel holds `head_tiles` tiles of
// (query_rows or key_rows, head_stride) floats, `score_tiles` tiles of (query_rows, score_stride) and
// `row_statistics` arrays of query_rows floats, in that order. Tile sizes are multiples of 16 rows times a
// multiple of 4 floats, so every tile starts 256-byte aligned, as wmma's pointers must be (32 bytes).
struct SharedLayout {
    int query_rows, key_rows, head_stride, score_stride;

    __host__ __device__ SharedLayout(int padded_head, int query_tile_rows, int key_tile_rows)
        : query_rows(query_tile_rows), key_rows(key_tile_rows), head_stride(padded_head + row_padding),
          score_stride(key_tile_rows + row_padding) {}

    __host__ __device__ size_t query_tile_floats() const { return size_t(query_rows) * head_stride; }
    __host__ __device__ size_t key_tile_floats() const { return size_t(key_rows) * head_stride; }
    __host__ __device__ size_t score_tile_floats() const { return size_t(query_rows) * score_stride; }
    __host__ __device__ size_t bytes(int query_tiles, int key_tiles, int score_tiles, int row_statistics) const {
        return sizeof(float) * (query_tiles * query_tile_floats() + key_tiles * key_tile_floats() +
                                score_tiles * score_tile_floats() + size_t(row_statistics) * query_rows);
    }
};

// Hands out consecutive arrays of the block's dynamic shared memory.
class SharedCursor {
public:
    __device__ explicit SharedCursor(float* start) : next_(start) {}
    __device__ float* take(size_t floats) {
        float* array = next_;
        next_ += floats;
        return array;
    }

private:
    float* next_;
};

// Head `head`'s slice of token (batch, 0) in a packed buffer of `row_length` floats per token: part 0, 1, 2
// of the (B,T,3C) qkv are q, k and v; the (B,T,C) out and dout have only part 0.
template <typename Pointer>
__device__ Pointer head_slice(Pointer buffer, int batch, int part, int head, int T, int C, int row_length,
                              int head_size) {
    return buffer + int64_t(batch) * T * row_length + int64_t(part) * C + int64_t(head) * head_size;
}

// Calls visit(row, column) once for every group of `width` consecutive columns (4 when float4s move, else 1)
// of a (rows, columns) tile, the groups spread over the block's threads.
template <typename Visit>
__device__ void for_each_group(int rows, int columns, int width, Visit&& visit) {
    const int groups_per_row = columns / width;
    for (int index = threadIdx.x; index < rows * groups_per_row; index += blockDim.x) {
        visit(index / groups_per_row, index % groups_per_row * width);
    }
}

// tile (rows, stride) = rows first_row.. of `source` (row_length floats apart), head_size columns; rows at or
// beyond T and the padding columns up to padded_head become zero. `vectorized`: head_size, the row length
// and source are multiples of 4 floats, so each thread moves float4s.
__device__ inline void load_tile(float* tile, int stride, const float* source, int row_length, int first_row,
                                 int rows, int T, int head_size, int padded_head, bool vectorized) {
    for_each_group(rows, padded_head, vectorized ? 4 : 1, [&](int row, int column) {
        const bool inside = first_row + row < T && column < head_size;
        const float* from = source + int64_t(first_row + row) * row_length + column;
        float* to = tile + row * stride + column;
        if (vectorized) {
            *reinterpret_cast<float4*>(to) = inside ? *reinterpret_cast<const float4*>(from) : make_float4(0, 0, 0, 0);
        } else {
            *to = inside ? *from : 0.0f;
        }
    });
}

// destination rows first_row.. (below T, head_size columns) += tile; the backward kernels' gradients.
__device__ inline void add_tile(float* destination, int row_length, const float* tile, int stride, int first_row,
                                int rows, int T, int head_size, bool vectorized) {
    for_each_group(rows, head_size, vectorized ? 4 : 1, [&](int row, int column) {
        if (first_row + row >= T) return;
        float* to = destination + int64_t(first_row + row) * row_length + column;
        const float* from = tile + row * stride + column;
        if (vectorized) {
            const float4 sum = *reinterpret_cast<float4*>(to);
            *reinterpret_cast<float4*>(to) =
                make_float4(sum.x + from[0], sum.y + from[1], sum.z + from[2], sum.w + from[3]);
        } else {
            *to += *from;
        }
    });
}

// Sets `rows * columns` floats of a (rows, stride) tile to zero.
__device__ inline void zero_tile(float* tile, int stride, int rows, int columns) {
    for (int index = threadIdx.x; index < rows * columns; index += blockDim.x) {
        tile[index / columns * stride + index % columns] = 0.0f;
    }
}

namespace wmma = nvcuda::wmma;
template <typename Use, typename Layout>
using Operand = wmma::fragment<Use, fragment_width, fragment_width, fragment_depth, wmma::precision::tf32, Layout>;
using Accumulator = wmma::fragment<wmma::accumulator, fragment_width, fragment_width, fragment_depth, float>;

// Splits the float operand in `high` into TF32 parts: high = tf32(x) and, for 3xTF32, low = tf32(x - high),
// so that x = high + low up to 2^-22 relative. Elementwise work on x[] is what the wmma API allows.
template <bool tf32, typename Fragment>
__device__ void split_operand(Fragment& high, Fragment& low) {
    for (int i = 0; i < high.num_elements; ++i) {
        const float value = high.x[i];
        high.x[i] = wmma::__float_to_tf32(value);
        if constexpr (!tf32) low.x[i] = wmma::__float_to_tf32(value - high.x[i]);
    }
}

// Element (row, column) of a row-major (rows, leading) array, or of the transpose of one (col_major).
template <typename Layout>
__device__ const float* operand_tile(const float* matrix, int leading, int row, int column) {
    if constexpr (std::is_same_v<Layout, wmma::row_major>) return matrix + int64_t(row) * leading + column;
    else return matrix + int64_t(column) * leading + row;
}

// c (m, n) = (accumulate ? c : 0) + a (m, k) . b (k, n), all in shared memory, c row-major with stride ldc.
// a and b are row-major with strides lda and ldb, or col_major: then the stored array is the transpose.
// m and n are multiples of 16 and k of 8; each warp takes 16 x 16 output tiles in turn. tf32: one TF32 mma
// per step. Otherwise 3xTF32: a.b ~ a_high.b_high + a_high.b_low + a_low.b_high, fp32-accurate (the dropped
// a_low.b_low is 2^-22 relative), the small terms first so they are not lost against the large one.
template <bool tf32, typename LayoutA, typename LayoutB>
__device__ void tile_product(float* c, int ldc, const float* a, int lda, const float* b, int ldb, int m, int n, int k,
                             bool accumulate) {
    const int warp = threadIdx.x / warp_size, warps = blockDim.x / warp_size;
    const int tiles_across = n / fragment_width;
    for (int tile = warp; tile < (m / fragment_width) * tiles_across; tile += warps) {
        const int row = tile / tiles_across * fragment_width, column = tile % tiles_across * fragment_width;
        float* c_tile = c + int64_t(row) * ldc + column;
        Accumulator sum;
        if (accumulate) wmma::load_matrix_sync(sum, c_tile, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(sum, 0.0f);
        for (int inner = 0; inner < k; inner += fragment_depth) {
            Operand<wmma::matrix_a, LayoutA> a_high, a_low;
            Operand<wmma::matrix_b, LayoutB> b_high, b_low;
            wmma::load_matrix_sync(a_high, operand_tile<LayoutA>(a, lda, row, inner), lda);
            wmma::load_matrix_sync(b_high, operand_tile<LayoutB>(b, ldb, inner, column), ldb);
            split_operand<tf32>(a_high, a_low);
            split_operand<tf32>(b_high, b_low);
            if constexpr (!tf32) {
                wmma::mma_sync(sum, a_low, b_high, sum);
                wmma::mma_sync(sum, a_high, b_low, sum);
            }
            wmma::mma_sync(sum, a_high, b_high, sum);
        }
        wmma::store_matrix_sync(c_tile, sum, ldc, wmma::mem_row_major);
    }
}

// Raises a kernel's dynamic shared-memory limit when a launch needs more than the default 48 KiB.
template <typename Kernel>
void allow_shared_bytes(Kernel* kernel, size_t bytes) {
    ENGINE_CHECK(bytes <= max_shared_bytes, "attention: " << bytes << " bytes of shared memory exceed sm_90's "
                                                          << max_shared_bytes);
    if (bytes > default_shared_bytes) {
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    }
}

// Head sizes whose kernels are compiled for a fixed padded width (loops unrolled); others take width 0,
// the generic instantiation that reads it at run time.
template <typename Launch>
void dispatch_head_size(int head_size, Launch&& launch) {
    switch (padded_head_size(head_size)) {
    case 64: launch.template operator()<64>(); break;
    case 128: launch.template operator()<128>(); break;
    default: launch.template operator()<0>(); break;
    }
}

inline void check_shape(int C, int NH) {
    ENGINE_CHECK(NH > 0 && C % NH == 0, "attention: C=" << C << " is not a multiple of NH=" << NH);
    ENGINE_CHECK(C / NH <= attention_max_head_size,
                 "attention: head size " << C / NH << " exceeds the CUDA kernels' " << attention_max_head_size);
}

// float4 access is safe when every row, head offset and base pointer is 16-byte aligned.
inline bool float4_aligned(int C, int NH, std::initializer_list<const void*> pointers) {
    bool aligned = C % 4 == 0 && (C / NH) % 4 == 0;
    for (const void* pointer : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
    return aligned;
}

} // namespace engine::kernels::cuda::attention_tiles
