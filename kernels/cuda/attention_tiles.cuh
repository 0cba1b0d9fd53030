// Shared pieces of the tensor-core attention kernels (attention_forward.cu, attention_backward.cu): tile
// shapes and shared-memory layouts per head size, global <-> shared tile copies, and the wmma tile product in
// plain TF32 or error-compensated 3xTF32.
// Why: FlashAttention-2's plan, so that no T x T matrix exists: Q tiles against K/V tiles streamed through shared
// memory, an online softmax, the logsumexp saved, P recomputed in backward. Each warp owns 16 rows of output for
// the whole loop, so its accumulators stay in registers; since the accumulator layout is unspecified, position
// fragments (below) tell each element its row and column. Kernels are compiled for a padded width of 64, 128 or
// 256 because register arrays need a size known at compile time. Without TF32, 3xTF32 gives fp32 accuracy on the
// same tensor cores. Backward sums dK/dV in the block that owns the key tile, so it needs no atomics.
// Where: engine/ops/attention.cpp dispatches to attention_forward.cu / attention_backward.cu (f32, this header)
// and attention_bf16_*.cu (attention_bf16_tiles.cuh); CPU twins kernels/cpu/attention_forward.cpp,
// attention_backward.cpp; tests/cuda/test_attention_kernels.cpp (CUDA against the CPU), tests/test_attention_f32.cpp
// and tests/test_gqa_attention.cpp (the CPU references).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "base/cuda/check.h"
#include "base/cuda/launch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/warp_reduce.cuh"

// Loops over a warp's register fragments must be unrolled, or nvcc places the arrays in local memory; the
// host compiler of the emulated build knows no such pragma.
#if defined(__CUDACC__)
#define ATTENTION_UNROLL _Pragma("unroll")
#else
#define ATTENTION_UNROLL
#endif

namespace engine::kernels::cuda::attention_tiles {

// Every kernel gives each warp 16 rows of its block's output for the whole loop, so that the output's
// accumulators stay in registers; each kernel picks its own number of warps.
// wmma m16n16k8 (TF32): each product works on 16 x 16 output tiles, stepping 8 along the inner dimension.
inline constexpr int fragment_width = 16;
inline constexpr int fragment_depth = 8;
// Floats added to every shared row. wmma needs strides that are multiples of 4 floats; 4 extra floats move
// consecutive rows to different banks.
inline constexpr int row_padding = 4;
// sm_90: dynamic shared memory a block may use after cudaFuncSetAttribute, and the limit without it.
inline constexpr size_t max_shared_bytes = 227 * 1024;
inline constexpr size_t default_shared_bytes = 48 * 1024;

// The head dimension rounded up to the wmma tile width; the extra columns of every shared tile hold zeros,
// so products over them add nothing.
__host__ __device__ constexpr int padded_head_size(int head_size) {
    return (head_size + fragment_width - 1) / fragment_width * fragment_width;
}
// Kernels are compiled for a maximum padded width (64, 128, 256): register arrays need a size known at
// compile time. Loops over fragments are unrolled to that maximum and skip the ones past the run-time width,
// so the arrays stay in registers and head sizes such as 80 pay for 80, not 128.
__host__ __device__ constexpr int max_width_for(int head_size) {
    const int padded = padded_head_size(head_size);
    return padded <= 64 ? 64 : padded <= 128 ? 128 : 256;
}

// Hands out consecutive arrays of the block's dynamic shared memory; every size is a multiple of 8 floats,
// so every array stays 32-byte aligned, as wmma's pointers must be.
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

// Grouped-query attention's packed qkv row: NH query heads, then KVH key heads, then KVH value heads, each
// head_size wide (KVH == NH is plain multi-head attention). Query head h reads kv head h / group, group = NH / KVH
// (Hugging Face's repeat_kv), so K and V are read in place and never repeated in memory.
struct QkvLayout {
    int C, head_size, group, kv_width; // C = NH * head_size: the query and output width; kv_width = KVH * head_size

    __host__ __device__ QkvLayout(int C, int NH, int KVH)
        : C(C), head_size(C / NH), group(NH / KVH), kv_width(C / NH * KVH) {}
    __host__ __device__ int row() const { return C + 2 * kv_width; } // floats per token of qkv and dqkv
    __host__ __device__ int query_column(int head) const { return head * head_size; }
    __host__ __device__ int key_column(int kv_head) const { return C + kv_head * head_size; }
    __host__ __device__ int value_column(int kv_head) const { return C + kv_width + kv_head * head_size; }
};

// Token (batch, 0) of a packed buffer of `row_length` elements per token, offset to `column`: a head's
// (T, head_size) slice with rows row_length apart.
template <typename Pointer>
__device__ Pointer token_slice(Pointer buffer, int batch, int T, int row_length, int column) {
    return buffer + int64_t(batch) * T * row_length + column;
}

// The threads that share a copy: the whole block, or one warp for its own stripe.
struct Workers {
    int index, count;
};
__device__ inline Workers whole_block() { return Workers{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}; }
__device__ inline Workers own_warp() { return Workers{static_cast<int>(threadIdx.x % warp_size), warp_size}; }

// Calls visit(row, column) once for every group of `width` consecutive columns (4 when float4s move, else 1)
// of a (rows, columns) tile, the groups spread over the workers.
template <typename Visit>
__device__ void for_each_group(Workers workers, int rows, int columns, int width, Visit&& visit) {
    const int groups_per_row = columns / width;
    for (int index = workers.index; index < rows * groups_per_row; index += workers.count) {
        visit(index / groups_per_row, index % groups_per_row * width);
    }
}

// tile (rows, stride) = rows first_row.. of `source` (row_length floats apart), head_size columns; rows at or
// beyond T and the padding columns up to padded_head become zero. `vectorized`: head_size, the row length
// and source are multiples of 4 floats, so each thread moves float4s.
__device__ inline void load_tile(Workers workers, float* tile, int stride, const float* source, int row_length,
                                 int first_row, int rows, int T, int head_size, int padded_head, bool vectorized) {
    for_each_group(workers, rows, padded_head, vectorized ? 4 : 1, [&](int row, int column) {
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
__device__ inline void add_tile(Workers workers, float* destination, int row_length, const float* tile, int stride,
                                int first_row, int rows, int T, int head_size, bool vectorized) {
    for_each_group(workers, rows, head_size, vectorized ? 4 : 1, [&](int row, int column) {
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

namespace wmma = nvcuda::wmma;
template <typename Use, typename Layout>
using Operand = wmma::fragment<Use, fragment_width, fragment_width, fragment_depth, wmma::precision::tf32, Layout>;
using RowOperand = Operand<wmma::matrix_a, wmma::row_major>;
using Accumulator = wmma::fragment<wmma::accumulator, fragment_width, fragment_width, fragment_depth, float>;

// sum += a . b, one 16 x 16 x 8 step. tf32: one TF32 mma. Otherwise 3xTF32: each operand is split into
// high = tf32(x) and low = tf32(x - high), and a.b ~ a_low.b_high + a_high.b_low + a_high.b_high, the small
// terms first so they are not lost against the large one (the dropped a_low.b_low is 2^-22 relative).
// The operands come by value: held fragments stay unrounded, so each use splits its own copy.
template <bool tf32, typename A, typename B>
__device__ void multiply_add(Accumulator& sum, A a, B b) {
    A a_low;
    B b_low;
    for (int i = 0; i < a.num_elements; ++i) {
        const float value = a.x[i];
        a.x[i] = wmma::__float_to_tf32(value);
        if constexpr (!tf32) a_low.x[i] = wmma::__float_to_tf32(value - a.x[i]);
    }
    for (int i = 0; i < b.num_elements; ++i) {
        const float value = b.x[i];
        b.x[i] = wmma::__float_to_tf32(value);
        if constexpr (!tf32) b_low.x[i] = wmma::__float_to_tf32(value - b.x[i]);
    }
    if constexpr (!tf32) {
        wmma::mma_sync(sum, a_low, b, sum);
        wmma::mma_sync(sum, a, b_low, sum);
    }
    wmma::mma_sync(sum, a, b, sum);
}

// The row and the column of every element of an accumulator fragment, as fragments themselves. Legal
// although the layout is unspecified: every accumulator fragment of one type uses the same element ->
// (row, column) mapping for load, store and mma, so a fragment loaded from a table whose element (r, c) is r
// holds, in x[i], the row of x[i] in every other accumulator of the warp. (The emulator's mapping is
// scrambled but fixed per lane and element, so it must and does hold there too.) The same table loaded as
// column-major reads (r, c) from table[c][r] = c: the column. It lets a warp scale rows of an accumulator in
// registers and mask elements by position without a round trip through shared memory.
struct ElementPositions {
    Accumulator row, column;
};
inline constexpr int position_table_floats = fragment_width * fragment_width;
// Fills the (16, 16) table with table[r][c] = r; the caller synchronises before the first load.
__device__ inline void fill_position_table(float* table) {
    for (int index = threadIdx.x; index < position_table_floats; index += blockDim.x) {
        table[index] = static_cast<float>(index / fragment_width);
    }
}
__device__ inline ElementPositions load_positions(const float* table) {
    ElementPositions positions;
    wmma::load_matrix_sync(positions.row, table, fragment_width, wmma::mem_row_major);
    wmma::load_matrix_sync(positions.column, table, fragment_width, wmma::mem_col_major);
    return positions;
}

// Multiplies row r of each of `fragments` accumulators by factor[r], r in 0..15.
template <int count>
__device__ void scale_rows(Accumulator (&accumulators)[count], int fragments, const ElementPositions& positions,
                           const float* factor) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        if (f >= fragments) break;
        for (int i = 0; i < accumulators[f].num_elements; ++i) {
            accumulators[f].x[i] *= factor[static_cast<int>(positions.row.x[i])];
        }
    }
}

// Loads the 16-row operand stripe at `stripe` (row-major, `stride`) as `fragments` matrix_a fragments of 8
// columns each, to be held across a loop.
template <int count>
__device__ void load_row_operands(RowOperand (&operands)[count], int fragments, const float* stripe, int stride) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        if (f < fragments) wmma::load_matrix_sync(operands[f], stripe + f * fragment_depth, stride);
    }
}

// Stores `fragments` accumulators side by side into a 16-row stripe (row-major, `stride`).
template <int count>
__device__ void store_accumulators(float* stripe, int stride, const Accumulator (&accumulators)[count], int fragments) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) {
        if (f < fragments) {
            wmma::store_matrix_sync(stripe + f * fragment_width, accumulators[f], stride, wmma::mem_row_major);
        }
    }
}

// sums[f] += A . B_f^T: A the warp's 16 rows (held fragments, or reloaded per step from a_stripe when not
// held), B_f the f-th 16 rows of a row-major shared tile, read column-major as B^T. S = Q K^T and its kin.
template <bool tf32, bool hold, int max_steps, int held_count, int count>
__device__ void add_transposed_product(Accumulator (&sums)[count], const RowOperand (&held)[held_count],
                                       const float* a_stripe, const float* b_tile, int depth_steps, int stride) {
    ATTENTION_UNROLL
    for (int step = 0; step < max_steps; ++step) {
        if (step >= depth_steps) break;
        RowOperand a;
        if constexpr (hold) a = held[step];
        else wmma::load_matrix_sync(a, a_stripe + step * fragment_depth, stride);
        ATTENTION_UNROLL
        for (int f = 0; f < count; ++f) {
            Operand<wmma::matrix_b, wmma::col_major> b;
            wmma::load_matrix_sync(b, b_tile + f * fragment_width * stride + step * fragment_depth, stride);
            multiply_add<tf32>(sums[f], a, b);
        }
    }
}

// sums[f] += A . B[:, 16f..]: A a warp's (16, 8 * steps) stripe (P or dS), B a row-major shared tile of
// 8 * steps rows; each A fragment is loaded once and used for every output fragment. O += P V and its kin.
template <bool tf32, int count>
__device__ void add_stripe_product(Accumulator (&sums)[count], int fragments, const float* a_stripe, int a_stride,
                                   int steps, const float* b_tile, int b_stride) {
    for (int step = 0; step < steps; ++step) {
        RowOperand a;
        wmma::load_matrix_sync(a, a_stripe + step * fragment_depth, a_stride);
        ATTENTION_UNROLL
        for (int f = 0; f < count; ++f) {
            if (f >= fragments) break;
            Operand<wmma::matrix_b, wmma::row_major> b;
            wmma::load_matrix_sync(b, b_tile + step * fragment_depth * b_stride + f * fragment_width, b_stride);
            multiply_add<tf32>(sums[f], a, b);
        }
    }
}

template <int count>
__device__ void zero_accumulators(Accumulator (&accumulators)[count]) {
    ATTENTION_UNROLL
    for (int f = 0; f < count; ++f) wmma::fill_fragment(accumulators[f], 0.0f);
}

// One online-softmax step over a row of raw scores (FlashAttention-2's): lanes 2r and 2r + 1 share row r, each
// every other column. The tile maximum of the visible scaled scores, columns first_visible..end_visible - 1 (the
// row's keys: its document's, up to the row itself), raises the running maximum; the probabilities exp(scale·score
// - max) of every column (0 outside the visible ones) are stored into probability_row through narrow<P> (f32: in
// place over the scores, by the lane that read them; bf16: rounded for the tensor cores), while the running sum
// adds them unrounded. Returns the factor that rescales the row's earlier output: 0 on the row's first tile with
// a visible key (exp(-inf)), and exactly 1 when the maximum stays, in particular on a tile without a visible key,
// which so leaves the row's statistics and output untouched even while its maximum is still -inf (where
// exp(-inf + inf) would be NaN).
template <typename P>
__device__ float online_softmax_step(const float* score_row, P* probability_row, int first_visible, int end_visible,
                                     int columns, int half, float scale, float& running_max, float& running_sum) {
    float tile_max = -INFINITY;
    for (int column = first_visible + ((first_visible ^ half) & 1); column < end_visible; column += 2) {
        tile_max = fmaxf(tile_max, score_row[column] * scale);
    }
    const float new_max = fmaxf(running_max, fmaxf(tile_max, __shfl_xor_sync(full_warp_mask, tile_max, 1)));
    float sum = 0.0f;
    for (int column = half; column < columns; column += 2) {
        const bool visible = column >= first_visible && column < end_visible;
        const float probability = visible ? expf(score_row[column] * scale - new_max) : 0.0f;
        probability_row[column] = narrow<P>(probability);
        sum += probability;
    }
    sum += __shfl_xor_sync(full_warp_mask, sum, 1);
    const float correction = running_max == new_max ? 1.0f : expf(running_max - new_max);
    running_sum = running_sum * correction + sum;
    running_max = new_max;
    return correction;
}

// Packed documents (cuda_kernels.h): query `row` of a batch sees keys document_start(row)..row, its document's
// first token up to itself; null positions are one document per batch row (start 0). Positions restart at 0 and
// count up by one (the op checks it on the host), so starts never decrease along the rows: a block finds its
// first useful key tile from its first row, and a key tile's queries end once one starts past the tile.
__host__ __device__ inline const int32_t* batch_positions(const int32_t* positions, int batch, int T) {
    return positions == nullptr ? nullptr : positions + int64_t(batch) * T;
}
__device__ inline int document_start(const int32_t* row_positions, int row) {
    return row_positions == nullptr ? 0 : row - row_positions[row];
}
// starts[r] = the document start of row first_row + r, r < rows, read once per block or step; rows at or past T
// hold 0 (their P is zero whatever it is).
__device__ inline void load_document_starts(int* starts, const int32_t* row_positions, int first_row, int rows, int T) {
    for (int row = threadIdx.x; row < rows; row += blockDim.x) {
        starts[row] = first_row + row < T ? document_start(row_positions, first_row + row) : 0;
    }
}
// The first key of the tile, `tile_keys` keys long and aligned at key 0, that holds `key`: a block whose first
// row starts at `key` begins its key tiles there, every earlier tile being masked for all of its rows.
__device__ inline int tile_holding(int key, int tile_keys) { return key / tile_keys * tile_keys; }
// Whether any query of first_query..last_query (last_query below T) sees a key of first_key..last_key, its
// start (start_of(query)) at most last_key and itself at least first_key: starts never decrease, so the query
// max(first_query, first_key) decides. Uniform across a warp when its arguments are.
template <typename StartOf>
__device__ bool sees_any_key(int first_query, int last_query, int first_key, int last_key, StartOf&& start_of) {
    const int query = max(first_query, first_key);
    return query <= last_query && start_of(query) <= last_key;
}

// D_i = rowsum(dout_i * out_i) per (batch, head, row), one warp per row of (B,NH,T): the softmax Jacobian's
// shared term, in f32 for f32 and bf16 storage alike.
inline constexpr int row_dot_warps = 4;
template <typename T>
__global__ void attention_row_dot_kernel(float* row_dot, const T* dout, const T* out, int B, int T_, int C, int NH) {
    const int head_size = C / NH, lane = threadIdx.x % warp_size;
    const int64_t row_index = int64_t(blockIdx.x) * row_dot_warps + threadIdx.x / warp_size; // into (B,NH,T)
    if (row_index >= int64_t(B) * NH * T_) return; // whole warps leave; no barrier follows
    const int row = static_cast<int>(row_index % T_), head = static_cast<int>((row_index / T_) % NH);
    const int batch = static_cast<int>(row_index / (int64_t(T_) * NH));
    const int64_t base = (int64_t(batch) * T_ + row) * C + int64_t(head) * head_size;
    float sum = 0.0f;
    for (int d = lane; d < head_size; d += warp_size) sum += widen(dout[base + d]) * widen(out[base + d]);
    sum = warp_sum(sum);
    if (lane == 0) row_dot[row_index] = sum;
}

// Rows first_row.. of the (B,NH,T) logsumexp and D; rows at or past T read as zero (their P is zero).
__device__ inline void load_row_statistics(float* row_logsumexp, float* row_dot, const float* logsumexp_head,
                                           const float* row_dot_head, int first_row, int rows, int T) {
    for (int row = threadIdx.x; row < rows; row += blockDim.x) {
        const bool inside = first_row + row < T;
        row_logsumexp[row] = inside ? logsumexp_head[first_row + row] : 0.0f;
        row_dot[row] = inside ? row_dot_head[first_row + row] : 0.0f;
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

// Calls launch.operator()<max_width>() with the compiled maximum width for this head size.
template <typename Launch>
void dispatch_head_size(int head_size, Launch&& launch) {
    switch (max_width_for(head_size)) {
    case 64: launch.template operator()<64>(); break;
    case 128: launch.template operator()<128>(); break;
    default: launch.template operator()<256>(); break;
    }
}

inline void check_shape(int C, int NH, int KVH) {
    ENGINE_CHECK(NH > 0 && C % NH == 0, "attention: C=" << C << " is not a multiple of NH=" << NH);
    ENGINE_CHECK(KVH > 0 && NH % KVH == 0,
                 "attention: NH=" << NH << " query heads are not a multiple of KVH=" << KVH << " kv heads");
    ENGINE_CHECK(C / NH <= attention_max_head_size,
                 "attention: head size " << C / NH << " exceeds the CUDA kernels' " << attention_max_head_size);
}

// float4 access is safe when every row, head offset and base pointer is 16-byte aligned (the qkv row,
// C + 2 * KVH * C / NH, is then a multiple of 4 too).
inline bool float4_aligned(int C, int NH, std::initializer_list<const void*> pointers) {
    bool aligned = C % 4 == 0 && (C / NH) % 4 == 0;
    for (const void* pointer : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
    return aligned;
}

} // namespace engine::kernels::cuda::attention_tiles
