// Shared pieces of the bf16 tensor-core attention kernels (attention_bf16_forward.cu, attention_bf16_backward.cu):
// bf16 wmma fragments (16x16x16, f32 accumulators), bf16 shared tiles and their loads, and the stores that round
// an f32 accumulator once into bf16 global memory. Tile shapes and helpers common with the f32 kernels come from
// attention_tiles.cuh.
// Why the bf16 kernels round where they do: the bf16 tensor cores take bf16 operands, so P (and, in backward, dS)
// is rounded to bf16 before its product while the softmax statistics and every accumulator stay f32, and each
// output is rounded once on store. The forward's key tile is the CPU reference's, so its online softmax rescales
// at the same keys and the rounded P are the same numbers on both. Blocks are 4 warps of 16 rows (64 rows).
// Where: attention_bf16_forward.cu / attention_bf16_backward.cu, the bf16 overloads of attention_forward/backward
// (engine/ops/attention.cpp); CPU twins kernels/cpu/attention_bf16_forward.cpp, attention_bf16_backward.cpp;
// tests/cuda/test_bf16_gemm_attention.cpp (CUDA against the CPU bf16), tests/test_bf16_gemm_attention.cpp (CPU
// bf16 against f32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/attention_tiles.cuh"

namespace engine::kernels::cuda::attention_bf16 {
using namespace attention_tiles;

// wmma m16n16k16 with bf16 operands: each product steps 16 along the inner dimension.
inline constexpr int bf16_depth = 16;
// bf16 elements added to every shared row: wmma needs 16-bit strides in multiples of 8 elements (16 bytes), and
// 8 extra elements move consecutive rows to different banks.
inline constexpr int bf16_padding = 8;
// Float stripes: multiples of 4 floats, as wmma's f32 stores need.
inline constexpr int float_padding = 4;
// 4 warps (64 rows) per block in every bf16 kernel.
inline constexpr int bf16_warps = 4;
inline constexpr int bf16_rows = bf16_warps * fragment_width;
// The forward's key tile is the CPU reference's: its online softmax rescales at the same keys, so the rounded
// probabilities exp(score - running max) are the same numbers on both.
inline constexpr int forward_key_tile = cpu::attention_bf16_key_tile;
static_assert(forward_key_tile % fragment_width == 0);
// Query rows per step of the key/value pass and key rows per step of the query pass.
inline constexpr int backward_step = 32;

namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16; // what wmma reads; engine::bfloat16 has the same layout
template <typename Layout>
using RowOperand16 = wmma::fragment<wmma::matrix_a, fragment_width, fragment_width, bf16_depth, Bf16, Layout>;
template <typename Layout>
using ColumnOperand16 = wmma::fragment<wmma::matrix_b, fragment_width, fragment_width, bf16_depth, Bf16, Layout>;
using Accumulator16 = wmma::fragment<wmma::accumulator, fragment_width, fragment_width, bf16_depth, float>;

__device__ inline const Bf16* as_wmma(const bfloat16* pointer) { return reinterpret_cast<const Bf16*>(pointer); }

// Hands out consecutive arrays of the block's dynamic shared memory, each a multiple of 32 bytes, so every array
// stays 32-byte aligned, as wmma's pointers must be.
class ByteCursor {
public:
    __device__ explicit ByteCursor(unsigned char* start) : next_(start) {}
    template <typename T>
    __device__ T* take(size_t count) {
        T* array = reinterpret_cast<T*>(next_);
        next_ += (count * sizeof(T) + 31) / 32 * 32;
        return array;
    }

private:
    unsigned char* next_;
};
// The host's side of ByteCursor: bytes of an array of `count` T.
template <typename T>
__host__ __device__ constexpr size_t aligned_bytes(size_t count) {
    return (count * sizeof(T) + 31) / 32 * 32;
}

// tile (rows, stride) = rows first_row.. of `source` (row_length elements apart), head_size columns; rows at or
// beyond T and the padding columns become zero. `vectorized`: head_size, row length and source are multiples of
// 8 elements (16 bytes), so each thread moves 8 bf16 at once; the copy is bitwise, no rounding.
__device__ inline void load_bf16_tile(Workers workers, bfloat16* tile, int stride, const bfloat16* source,
                                      int row_length, int first_row, int rows, int T, int head_size, int padded_head,
                                      bool vectorized) {
    for_each_group(workers, rows, padded_head, vectorized ? 8 : 1, [&](int row, int column) {
        const bool inside = first_row + row < T && column < head_size;
        const bfloat16* from = source + int64_t(first_row + row) * row_length + column;
        bfloat16* to = tile + row * stride + column;
        if (vectorized) {
            *reinterpret_cast<uint4*>(to) = inside ? *reinterpret_cast<const uint4*>(from) : make_uint4(0, 0, 0, 0);
        } else {
            *to = inside ? *from : bfloat16{0};
        }
    });
}

// The row of every element of a 16x16 accumulator, as an accumulator itself (see attention_tiles.cuh's
// ElementPositions): lets a warp scale accumulator rows in registers.
__device__ inline Accumulator16 load_rows(const float* position_table) {
    Accumulator16 rows;
    wmma::load_matrix_sync(rows, position_table, fragment_width, wmma::mem_row_major);
    return rows;
}

template <int count>
__device__ void scale_rows16(Accumulator16 (&accumulators)[count], int fragments, const Accumulator16& rows,
                             const float* factor) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        if (f >= fragments) break;
        for (int i = 0; i < accumulators[f].num_elements; ++i) accumulators[f].x[i] *= factor[static_cast<int>(rows.x[i])];
    }
}

template <int count>
__device__ void zero16(Accumulator16 (&accumulators)[count]) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) wmma::fill_fragment(accumulators[f], 0.0f);
}

// sum += A B^T: A the warp's 16 rows of a row-major bf16 tile, B 16 rows of another read column-major as B^T,
// over depth_steps x 16 columns. S = Q K^T and dP = dout V^T.
__device__ inline void add_transposed16(Accumulator16& sum, const bfloat16* a_stripe, const bfloat16* b_rows,
                                        int depth_steps, int stride) {
    for (int step = 0; step < depth_steps; ++step) {
        RowOperand16<wmma::row_major> a;
        ColumnOperand16<wmma::col_major> b;
        wmma::load_matrix_sync(a, as_wmma(a_stripe + step * bf16_depth), stride);
        wmma::load_matrix_sync(b, as_wmma(b_rows + step * bf16_depth), stride);
        wmma::mma_sync(sum, a, b, sum);
    }
}

// sums[f] += A B[:, 16f..]: A a warp's (16, 16 steps) bf16 stripe (P or dS), B a row-major bf16 tile of
// 16 steps rows. O += P V and its kin.
template <int count>
__device__ void add_stripe16(Accumulator16 (&sums)[count], int fragments, const bfloat16* a_stripe, int a_stride,
                             int steps, const bfloat16* b_tile, int b_stride) {
    for (int step = 0; step < steps; ++step) {
        RowOperand16<wmma::row_major> a;
        wmma::load_matrix_sync(a, as_wmma(a_stripe + step * bf16_depth), a_stride);
        ATTENTION_UNROLL
        for (int f = 0; f < count; ++f) {
            if (f >= fragments) break;
            ColumnOperand16<wmma::row_major> b;
            wmma::load_matrix_sync(b, as_wmma(b_tile + step * bf16_depth * b_stride + f * fragment_width), b_stride);
            wmma::mma_sync(sums[f], a, b, sums[f]);
        }
    }
}

// destination rows first_row.. (below T, head_size columns) get the warp's accumulators, rounded once: written
// (accumulate false) or added to what is there (accumulate true, the backward's +=). Staged one 16x16
// fragment at a time through the warp's float stripe (16 rows, `stripe_stride`).
template <int count>
__device__ void store_rounded(bfloat16* destination, int row_length, const Accumulator16 (&accumulators)[count],
                              int fragments, float* stripe, int stripe_stride, int first_row, int T, int head_size,
                              bool accumulate) {
    const int lane = threadIdx.x % warp_size;
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        if (f >= fragments) break;
        __syncwarp(); // the stripe's last readers are this warp's lanes
        wmma::store_matrix_sync(stripe, accumulators[f], stripe_stride, wmma::mem_row_major);
        __syncwarp();
        for (int index = lane; index < fragment_width * fragment_width; index += warp_size) {
            const int row = index / fragment_width, column = f * fragment_width + index % fragment_width;
            if (first_row + row >= T || column >= head_size) continue;
            bfloat16& to = destination[int64_t(first_row + row) * row_length + column];
            const float value = stripe[row * stripe_stride + index % fragment_width];
            to = to_bfloat16(accumulate ? to_float(to) + value : value);
        }
    }
    __syncwarp();
}

// 16-byte accesses are safe when every row, head offset and base pointer is 16-byte aligned.
inline bool bf16_vectorizable(int C, int NH, std::initializer_list<const void*> pointers) {
    bool aligned = C % 8 == 0 && (C / NH) % 8 == 0;
    for (const void* pointer : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
    return aligned;
}

} // namespace engine::kernels::cuda::attention_bf16
