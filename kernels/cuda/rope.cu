// Rotary position embedding, forward and backward (CUDA twin of kernels/cpu/rope.cpp). One grid-stride thread per
// pack of 4 rotation pairs (i, i + D/2) of one head, or per pair on the scalar path; memory-bound: x and out move
// once, the (T, D/2) tables are re-read by every batch row and head from L2. With positions (packed documents) token
// (b, t) reads table row positions[b*T + t] in place of t.
#include "base/cuda/launch.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/llama_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
} // namespace

// Where a pair index lands: pair = ((b*T + t)*H + h)*half + i; its table row is t, or positions[b*T + t]. Packs of 4 pairs never straddle a head because
// the launcher takes them only when half % 4 == 0.
struct PairPlace {
    int64_t first; // element offset of x[i] in (B,T,H*D); x[i + half] is `half` further
    int64_t table; // element offset of (t, i) in the (P, D/2) tables
};
static __device__ __forceinline__ PairPlace place_of(int64_t pair, const int32_t* positions, int T, int H, int half) {
    const int64_t head = pair / half; // (b*T + t)*H + h
    const int i = static_cast<int>(pair % half);
    const int64_t token = head / H; // b*T + t
    const int row = positions ? positions[token] : static_cast<int>(token % T);
    return {head * 2 * half + i, int64_t(row) * half + i};
}

// __fmul_rn/__fadd_rn/__fsub_rn keep nvcc from fusing a*c - b*s into an FMA, so the kernel rounds where the
// CPU twin does (each product, then the sum) and the two agree bitwise on a GPU as on the emulated device.
template <typename S, int width>
static __global__ void rope_forward_kernel(S* out, const S* inp, const float* cos, const float* sin,
                                           const int32_t* positions, int T, int H, int half, int64_t pairs) {
    for_each_pack<width>(pairs, [&]<int count>(int64_t pair) {
        const PairPlace place = place_of(pair, positions, T, H, half);
        const Pack<count> first = load_pack<count>(inp + place.first);
        const Pack<count> second = load_pack<count>(inp + place.first + half);
        const Pack<count> c = load_pack<count>(cos + place.table), s = load_pack<count>(sin + place.table);
        Pack<count> rotated_first, rotated_second;
        for (int k = 0; k < count; ++k) {
            rotated_first[k] = __fsub_rn(__fmul_rn(first[k], c[k]), __fmul_rn(second[k], s[k]));
            rotated_second[k] = __fadd_rn(__fmul_rn(second[k], c[k]), __fmul_rn(first[k], s[k]));
        }
        store_pack<count>(out + place.first, rotated_first);
        store_pack<count>(out + place.first + half, rotated_second);
    });
}

// The inverse rotation added into dinp: the rotation's value first, then one += (one rounding for bf16).
template <typename S, int width>
static __global__ void rope_backward_kernel(S* dinp, const S* dout, const float* cos, const float* sin,
                                            const int32_t* positions, int T, int H, int half, int64_t pairs) {
    for_each_pack<width>(pairs, [&]<int count>(int64_t pair) {
        const PairPlace place = place_of(pair, positions, T, H, half);
        const Pack<count> first = load_pack<count>(dout + place.first);
        const Pack<count> second = load_pack<count>(dout + place.first + half);
        const Pack<count> c = load_pack<count>(cos + place.table), s = load_pack<count>(sin + place.table);
        Pack<count> gradient_first = load_pack<count>(dinp + place.first);
        Pack<count> gradient_second = load_pack<count>(dinp + place.first + half);
        for (int k = 0; k < count; ++k) {
            const float rotated_first = __fadd_rn(__fmul_rn(first[k], c[k]), __fmul_rn(second[k], s[k]));
            const float rotated_second = __fsub_rn(__fmul_rn(second[k], c[k]), __fmul_rn(first[k], s[k]));
            gradient_first[k] = __fadd_rn(gradient_first[k], rotated_first);
            gradient_second[k] = __fadd_rn(gradient_second[k], rotated_second);
        }
        store_pack<count>(dinp + place.first, gradient_first);
        store_pack<count>(dinp + place.first + half, gradient_second);
    });
}

template <typename S>
static void launch_rope_forward(S* out, const S* inp, const float* cos, const float* sin, const int32_t* positions,
                                int B, int T, int H, int D, cudaStream_t stream) {
    const int half = D / 2;
    const int64_t pairs = int64_t(B) * T * H * half;
    if (pairs == 0) return;
    const bool vectorized = half % vector_width == 0 && vector_aligned(out, inp, cos, sin);
    ENGINE_LAUNCH_PACKED_TYPED(rope_forward_kernel, S, vectorized, pairs, block_size, stream, out, inp, cos, sin,
                               positions, T, H, half, pairs);
}

template <typename S>
static void launch_rope_backward(S* dinp, const S* dout, const float* cos, const float* sin, const int32_t* positions,
                                 int B, int T, int H, int D, cudaStream_t stream) {
    const int half = D / 2;
    const int64_t pairs = int64_t(B) * T * H * half;
    if (pairs == 0) return;
    const bool vectorized = half % vector_width == 0 && vector_aligned(dinp, dout, cos, sin);
    ENGINE_LAUNCH_PACKED_TYPED(rope_backward_kernel, S, vectorized, pairs, block_size, stream, dinp, dout, cos, sin,
                               positions, T, H, half, pairs);
}

void rope_forward(float* out, const float* inp, const float* cos, const float* sin, const int32_t* positions, int B,
                  int T, int H, int D, cudaStream_t stream) {
    launch_rope_forward(out, inp, cos, sin, positions, B, T, H, D, stream);
}
void rope_forward(bfloat16* out, const bfloat16* inp, const float* cos, const float* sin, const int32_t* positions,
                  int B, int T, int H, int D, cudaStream_t stream) {
    launch_rope_forward(out, inp, cos, sin, positions, B, T, H, D, stream);
}
void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, const int32_t* positions, int B,
                   int T, int H, int D, cudaStream_t stream) {
    launch_rope_backward(dinp, dout, cos, sin, positions, B, T, H, D, stream);
}
void rope_backward(bfloat16* dinp, const bfloat16* dout, const float* cos, const float* sin, const int32_t* positions,
                   int B, int T, int H, int D, cudaStream_t stream) {
    launch_rope_backward(dinp, dout, cos, sin, positions, B, T, H, D, stream);
}

} // namespace engine::kernels::cuda
