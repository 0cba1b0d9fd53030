// NF4 quantisation and dequantisation (CUDA twin of kernels/cpu/nf4.cpp; kernels/cuda/nf4_kernels.h says why it is
// shaped so). Every product and sum is spelled __fmul_rn/__fadd_rn, so no FMA contraction moves a bit away from the
// CPU twin's, and 1.0f / absmax is IEEE division there as here.
#include <array>

#include "base/cuda/launch.h"
#include "kernels/cpu/nf4_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/nf4_kernels.h"

namespace engine::kernels::cuda {
namespace {

constexpr int block_size = 256;
constexpr int64_t nf4_block = cpu::nf4_block;
constexpr int64_t scale_block = cpu::nf4_scale_block;
constexpr int group = 8; // elements a dequantising thread makes: 4 code bytes in, 16 or 32 bytes out

struct Nf4Table {
    float values[16];
    float thresholds[15];
};
struct DynamicMap {
    float values[256];
};

Nf4Table nf4_table() {
    Nf4Table table{};
    for (int i = 0; i < 16; ++i) table.values[i] = cpu::nf4_values[static_cast<size_t>(i)];
    for (int i = 0; i < 15; ++i) table.thresholds[i] = cpu::nf4_thresholds()[static_cast<size_t>(i)];
    return table;
}

DynamicMap dynamic_map() {
    DynamicMap map{};
    for (int i = 0; i < 256; ++i) map.values[i] = cpu::dynamic_map()[static_cast<size_t>(i)];
    return map;
}

__device__ __forceinline__ uint8_t encode(const Nf4Table& table, float x) {
    uint8_t code = 0;
    for (int i = 0; i < 15; ++i) code += x > table.thresholds[i] ? 1 : 0;
    return code;
}

// One thread per block of 64 (load time: n/64 threads, each reading its 256 contiguous bytes).
__global__ void nf4_quantize_kernel(uint8_t* codes, float* absmax, const float* inp, int64_t n, Nf4Table table) {
    const int64_t blocks = (n + nf4_block - 1) / nf4_block;
    for (int64_t block = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; block < blocks;
         block += int64_t(gridDim.x) * blockDim.x) {
        const int64_t first = block * nf4_block, last = first + nf4_block < n ? first + nf4_block : n;
        float largest = 0.0f;
        for (int64_t i = first; i < last; ++i) largest = fmaxf(largest, fabsf(inp[i]));
        absmax[block] = largest;
        const float scale = __fdiv_rn(1.0f, largest);
        for (int64_t i = first; i < last; i += 2) {
            const uint8_t high = encode(table, __fmul_rn(inp[i], scale));
            const uint8_t low = i + 1 < last ? encode(table, __fmul_rn(inp[i + 1], scale)) : 0;
            codes[i / 2] = static_cast<uint8_t>(high << 4 | low);
        }
    }
}

__global__ void nf4_dequantize_scales_kernel(float* absmax, const uint8_t* scale_codes, const float* scale_absmax,
                                             float offset, int64_t blocks, DynamicMap map) {
    __shared__ float values[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) values[i] = map.values[i];
    __syncthreads();
    for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x)
        absmax[b] = __fadd_rn(__fmul_rn(values[scale_codes[b]], scale_absmax[b / scale_block]), offset);
}

__device__ __forceinline__ void store(float* out, float value) { *out = value; }
__device__ __forceinline__ void store(bfloat16* out, float value) { *out = narrow<bfloat16>(value); }

// One thread per group of 8 elements (inside one block of 64: 8 divides 64). `vectors`: every group but a last
// partial one is loaded as one 32-bit word and stored as whole 16-byte pieces (the launcher checked the alignment).
template <typename S, bool vectors>
__global__ void nf4_dequantize_kernel(S* out, const uint8_t* codes, const float* absmax, int64_t n, Nf4Table table) {
    __shared__ float values[16];
    if (threadIdx.x < 16) values[threadIdx.x] = table.values[threadIdx.x];
    __syncthreads();
    const int64_t groups = (n + group - 1) / group;
    for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
        const int64_t first = g * group;
        const float scale = absmax[first / nf4_block];
        if (vectors && first + group <= n) {
            const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + first / 2);
            alignas(16) S result[group];
            for (int k = 0; k < group / 2; ++k) {
                const uint32_t byte = (word >> (8 * k)) & 0xffu;
                store(&result[2 * k], __fmul_rn(values[byte >> 4], scale));
                store(&result[2 * k + 1], __fmul_rn(values[byte & 15u], scale));
            }
            for (int piece = 0; piece < int(sizeof(result) / 16); ++piece)
                reinterpret_cast<uint4*>(out + first)[piece] = reinterpret_cast<const uint4*>(result)[piece];
            continue;
        }
        for (int64_t i = first; i < n && i < first + group; ++i) {
            const uint8_t byte = codes[i / 2];
            store(out + i, __fmul_rn(values[i % 2 == 0 ? byte >> 4 : byte & 15], scale));
        }
    }
}

template <typename S>
void dequantize(S* out, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int grid = elementwise_grid((n + group - 1) / group, block_size);
    const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 4 == 0;
    if (aligned) ENGINE_LAUNCH((nf4_dequantize_kernel<S, true>), grid, block_size, 0, stream, out, codes, absmax, n, nf4_table());
    else ENGINE_LAUNCH((nf4_dequantize_kernel<S, false>), grid, block_size, 0, stream, out, codes, absmax, n, nf4_table());
}

} // namespace

void nf4_quantize(uint8_t* codes, float* absmax, const float* inp, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int grid = elementwise_grid((n + nf4_block - 1) / nf4_block, block_size);
    ENGINE_LAUNCH(nf4_quantize_kernel, grid, block_size, 0, stream, codes, absmax, inp, n, nf4_table());
}

void nf4_dequantize_scales(float* absmax, const uint8_t* scale_codes, const float* scale_absmax, float offset,
                           int64_t blocks, cudaStream_t stream) {
    if (blocks == 0) return;
    ENGINE_LAUNCH(nf4_dequantize_scales_kernel, elementwise_grid(blocks, block_size), block_size, 0, stream, absmax,
                  scale_codes, scale_absmax, offset, blocks, dynamic_map());
}

void nf4_dequantize(float* out, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream) {
    dequantize(out, codes, absmax, n, stream);
}
void nf4_dequantize(bfloat16* out, const uint8_t* codes, const float* absmax, int64_t n, cudaStream_t stream) {
    dequantize(out, codes, absmax, n, stream);
}

} // namespace engine::kernels::cuda
