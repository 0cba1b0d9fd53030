// Attention of new queries over a key/value cache (twin of kernels/cpu/attention_decode.cpp): the append of the
// new keys and values, then one warp per (batch, head, new query). Inference only. The append is bounded by
// memory bandwidth; the attention reads its head's cache once per query (4 flops per element), which bounds it
// by bandwidth only with many (batch, head) warps in flight: with few, by the latency of the per-key chain
// (shuffle tree, two expf), which splitting the keys over several warps (flash-decoding) would shorten.
#include <cmath>

#include "base/cuda/launch.h"
#include "base/error.h"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

// The per-lane arrays stay in registers only if their loops unroll; the emulated build's host compiler knows
// no such pragma.
#if defined(__CUDACC__)
#define DECODE_UNROLL _Pragma("unroll")
#else
#define DECODE_UNROLL
#endif

namespace engine::kernels::cuda {
namespace {

constexpr int append_block_size = 256;
constexpr int warps_per_block = 4;

// One thread per new key (and value) element: reads along qkv's rows and writes along the cache's head rows,
// both coalesced.
template <typename T>
__global__ void kv_cache_append_kernel(T* key_cache, T* value_cache, const T* qkv, int Tnew, int past, int max_T,
                                       int C, int NH, int64_t count) {
    const int head_size = C / NH;
    for (int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; index < count;
         index += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = index / C; // b*Tnew + t
        const int column = static_cast<int>(index % C);
        const int b = static_cast<int>(row / Tnew), t = static_cast<int>(row % Tnew);
        const int h = column / head_size, d = column % head_size;
        const int64_t destination = ((int64_t(b) * NH + h) * max_T + past + t) * head_size + d;
        key_cache[destination] = qkv[row * 3 * C + C + column];
        value_cache[destination] = qkv[row * 3 * C + 2 * C + column];
    }
}

// Lane l holds dimensions l, l+32, ... (per_lane of them) of its query and of its output accumulator. For each
// cached key in ascending order the lanes' partial dot products are summed by a butterfly of shuffles (every
// lane ends with the same bits: each step adds the same two values in either order), then the online softmax
// rescales the accumulator and adds p·v.
template <typename T, int per_lane>
__global__ void attention_decode_kernel(T* out, const T* key_cache, const T* value_cache, const T* qkv, int B,
                                        int Tnew, int past, int max_T, int C, int NH) {
    const int warp = static_cast<int>(blockIdx.x) * warps_per_block + static_cast<int>(threadIdx.x) / warp_size;
    const int lane = static_cast<int>(threadIdx.x) % warp_size;
    if (warp >= B * NH * Tnew) return; // whole warps leave together, so the shuffles below stay full
    const int t = warp % Tnew, h = (warp / Tnew) % NH, b = warp / (Tnew * NH);
    const int head_size = C / NH;
    const float scale = 1.0f / sqrtf(static_cast<float>(head_size));
    const T* query = qkv + (int64_t(b) * Tnew + t) * 3 * C + int64_t(h) * head_size;
    const int64_t head_base = (int64_t(b) * NH + h) * max_T * head_size;

    float q[per_lane], accumulator[per_lane];
DECODE_UNROLL
    for (int j = 0; j < per_lane; ++j) {
        const int d = lane + j * warp_size;
        q[j] = d < head_size ? widen(query[d]) : 0.0f;
        accumulator[j] = 0.0f;
    }
    float running_max = -INFINITY, running_sum = 0.0f;
    for (int key = 0; key <= past + t; ++key) { // causal: keys 0..past+t
        const T* key_row = key_cache + head_base + int64_t(key) * head_size;
        float partial = 0.0f;
DECODE_UNROLL
        for (int j = 0; j < per_lane; ++j) {
            const int d = lane + j * warp_size;
            if (d < head_size) partial += q[j] * widen(key_row[d]);
        }
        const float score = warp_sum(partial) * scale;
        const float new_max = fmaxf(running_max, score);
        const float correction = expf(running_max - new_max); // 0 for the first key
        const float probability = expf(score - new_max);
        running_sum = running_sum * correction + probability;
        running_max = new_max;
        const T* value_row = value_cache + head_base + int64_t(key) * head_size;
DECODE_UNROLL
        for (int j = 0; j < per_lane; ++j) {
            const int d = lane + j * warp_size;
            if (d < head_size) accumulator[j] = accumulator[j] * correction + probability * widen(value_row[d]);
        }
    }
    const float inverse_sum = 1.0f / running_sum;
    T* out_head = out + (int64_t(b) * Tnew + t) * C + int64_t(h) * head_size;
DECODE_UNROLL
    for (int j = 0; j < per_lane; ++j) {
        const int d = lane + j * warp_size;
        if (d < head_size) out_head[d] = narrow<T>(accumulator[j] * inverse_sum);
    }
}

template <typename T>
void launch_attention_decode(T* out, T* key_cache, T* value_cache, const T* qkv, int B, int Tnew, int past, int max_T,
                             int C, int NH, cudaStream_t stream) {
    ENGINE_CHECK(NH > 0 && C % NH == 0, "attention_decode: C=" << C << " is not a multiple of NH=" << NH);
    const int head_size = C / NH;
    ENGINE_CHECK(head_size <= attention_decode_max_head_size,
                 "attention_decode: head size " << head_size << " exceeds " << attention_decode_max_head_size);
    ENGINE_CHECK(past >= 0 && int64_t(past) + Tnew <= max_T,
                 "attention_decode: positions [" << past << "," << int64_t(past) + Tnew << ") exceed the cache's " << max_T);
    if (B == 0 || Tnew == 0) return;
    const int64_t count = int64_t(B) * Tnew * C;
    ENGINE_LAUNCH(kv_cache_append_kernel<T>, elementwise_grid(count, append_block_size), append_block_size, 0, stream,
                  key_cache, value_cache, qkv, Tnew, past, max_T, C, NH, count);
    const int grid = ceil_div(int64_t(B) * NH * Tnew, warps_per_block), block = warps_per_block * warp_size;
    // The fewest registers that hold a lane's dimensions.
    if (head_size <= 32)
        ENGINE_LAUNCH((attention_decode_kernel<T, 1>), grid, block, 0, stream, out, key_cache, value_cache, qkv, B,
                      Tnew, past, max_T, C, NH);
    else if (head_size <= 64)
        ENGINE_LAUNCH((attention_decode_kernel<T, 2>), grid, block, 0, stream, out, key_cache, value_cache, qkv, B,
                      Tnew, past, max_T, C, NH);
    else if (head_size <= 128)
        ENGINE_LAUNCH((attention_decode_kernel<T, 4>), grid, block, 0, stream, out, key_cache, value_cache, qkv, B,
                      Tnew, past, max_T, C, NH);
    else
        ENGINE_LAUNCH((attention_decode_kernel<T, 8>), grid, block, 0, stream, out, key_cache, value_cache, qkv, B,
                      Tnew, past, max_T, C, NH);
}

} // namespace

void attention_decode(float* out, float* key_cache, float* value_cache, const float* qkv, int B, int Tnew, int past,
                      int max_T, int C, int NH, cudaStream_t stream) {
    launch_attention_decode(out, key_cache, value_cache, qkv, B, Tnew, past, max_T, C, NH, stream);
}
void attention_decode(bfloat16* out, bfloat16* key_cache, bfloat16* value_cache, const bfloat16* qkv, int B,
                      int Tnew, int past, int max_T, int C, int NH, cudaStream_t stream) {
    launch_attention_decode(out, key_cache, value_cache, qkv, B, Tnew, past, max_T, C, NH, stream);
}

} // namespace engine::kernels::cuda
