// Kernels that expose what the emulated device does (tests/cuda_emulator/test_emulator.cpp): shared-memory
// poisoning, the undefined behaviour it reports, shuffle and vote semantics, schedules, and wmma.
#include <string>

#include "base/cuda/launch.h"
#include "tests/cuda_emulator/test_kernels.h"

namespace engine::test::emulated {
namespace {
constexpr unsigned full_mask = 0xffffffffu;
}

static __global__ void read_shared_before_write_kernel(float* out_static, float* out_dynamic) {
    __shared__ float static_values[32];
    ENGINE_DYNAMIC_SHARED(float, dynamic_values);
    out_static[threadIdx.x] = static_values[threadIdx.x];
    out_dynamic[threadIdx.x] = dynamic_values[threadIdx.x];
    __syncthreads();
    static_values[threadIdx.x] = 1.0f; // what the next block would see, were shared memory not poisoned
    dynamic_values[threadIdx.x] = 1.0f;
}

static __global__ void lanes_exit_then_shuffle_kernel(float* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(full_mask, static_cast<float>(threadIdx.x), 1);
}

static __global__ void some_threads_skip_barrier_kernel(float* out) {
    if (threadIdx.x % 2 == 1) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

static __global__ void warp_waits_for_barrier_kernel() {
    if (threadIdx.x == 0) {
        __syncwarp(0x3u);
    } else {
        __syncthreads();
    }
}

static __global__ void shuffles_and_votes_kernel(int* out) {
    const int lane = static_cast<int>(threadIdx.x);
    const int value = 100 + lane;
    int* row = out + lane * 7;
    row[0] = __shfl_sync(full_mask, value, 5, 8);
    row[1] = __shfl_up_sync(full_mask, value, 3, 8);
    row[2] = __shfl_down_sync(full_mask, value, 3, 8);
    row[3] = __shfl_xor_sync(full_mask, value, 6, 8);
    const int predicate = lane % 3 == 0;
    row[4] = static_cast<int>(__ballot_sync(full_mask, predicate));
    row[5] = __any_sync(full_mask, predicate);
    row[6] = __all_sync(full_mask, predicate);
}

static __global__ void shuffle_xor_33_kernel(int* out) {
    out[threadIdx.x] = __shfl_xor_sync(full_mask, 100 + static_cast<int>(threadIdx.x), 33);
}

static __global__ void arrival_order_kernel(int* order, int* counter) {
    __syncwarp();
    order[threadIdx.x] = atomicAdd(counter, 1);
}

static __global__ void wmma_tile_tf32_kernel(float* c, const float* a, const float* b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_fragment;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_fragment;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> c_fragment;
    wmma::fill_fragment(c_fragment, 0.0f);
    wmma::load_matrix_sync(a_fragment, a, 8);
    wmma::load_matrix_sync(b_fragment, b, 16);
    for (int i = 0; i < a_fragment.num_elements; ++i) a_fragment.x[i] = wmma::__float_to_tf32(a_fragment.x[i]);
    for (int i = 0; i < b_fragment.num_elements; ++i) b_fragment.x[i] = wmma::__float_to_tf32(b_fragment.x[i]);
    wmma::mma_sync(c_fragment, a_fragment, b_fragment, c_fragment);
    wmma::store_matrix_sync(c, c_fragment, 16, wmma::mem_row_major);
}

static __global__ void wmma_tile_bf16_kernel(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_fragment;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b_fragment;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c_fragment;
    wmma::fill_fragment(c_fragment, 0.0f);
    wmma::load_matrix_sync(a_fragment, a, 16);
    wmma::load_matrix_sync(b_fragment, b, 16); // b is row-major (16,16): read as column-major it is b^T
    wmma::mma_sync(c_fragment, a_fragment, b_fragment, c_fragment);
    wmma::store_matrix_sync(c, c_fragment, 16, wmma::mem_row_major);
}

static __global__ void empty_kernel() {}

static __global__ void touch_kernel(float* pointer) {
    if (threadIdx.x == 0 && pointer != nullptr) pointer[0] += 1.0f;
}

void read_shared_before_write(float* out_static, float* out_dynamic, cudaStream_t stream) {
    ENGINE_LAUNCH(read_shared_before_write_kernel, 2, 32, 32 * sizeof(float), stream, out_static, out_dynamic);
}
void lanes_exit_then_shuffle(float* out, cudaStream_t stream) {
    ENGINE_LAUNCH(lanes_exit_then_shuffle_kernel, 1, 32, 0, stream, out);
}
void some_threads_skip_barrier(float* out, cudaStream_t stream) {
    ENGINE_LAUNCH(some_threads_skip_barrier_kernel, 1, 64, 0, stream, out);
}
void warp_waits_for_barrier(cudaStream_t stream) { ENGINE_LAUNCH(warp_waits_for_barrier_kernel, 1, 32, 0, stream); }
void shuffles_and_votes(int* out, cudaStream_t stream) { ENGINE_LAUNCH(shuffles_and_votes_kernel, 1, 32, 0, stream, out); }
void shuffle_xor_33(int* out, cudaStream_t stream) { ENGINE_LAUNCH(shuffle_xor_33_kernel, 1, 32, 0, stream, out); }
void arrival_order(int* order, int* counter, cudaStream_t stream) {
    ENGINE_LAUNCH(arrival_order_kernel, 1, 64, 0, stream, order, counter);
}
void wmma_tile_tf32(float* c, const float* a, const float* b, cudaStream_t stream) {
    ENGINE_LAUNCH(wmma_tile_tf32_kernel, 1, 32, 0, stream, c, a, b);
}
void wmma_tile_bf16(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, cudaStream_t stream) {
    ENGINE_LAUNCH(wmma_tile_bf16_kernel, 1, 32, 0, stream, c, a, b);
}
std::string launch_empty(int blocks, int threads, size_t dynamic_shared_bytes, cudaStream_t stream) {
    try {
        ENGINE_LAUNCH(empty_kernel, blocks, threads, dynamic_shared_bytes, stream);
    } catch (const std::exception& error) {
        return error.what();
    }
    return {};
}
cudaError_t raise_shared_limit(int bytes) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(empty_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                bytes);
}
void touch(float* pointer, cudaStream_t stream) { ENGINE_LAUNCH(touch_kernel, 1, 32, 0, stream, pointer); }

} // namespace engine::test::emulated
