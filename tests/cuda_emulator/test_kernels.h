// Launchers for the kernels of the emulated-device tests: broken_kernels.cu holds kernels with one
// deliberate bug each, probe_kernels.cu kernels that expose what the emulator does. All take device
// pointers and queue on `stream`; the emulated build alone compiles them.
#pragma once

#include <cstdint>
#include <string>

#include "base/cuda/headers.h"

namespace engine::test::emulated {

// ---- broken_kernels.cu ----
// out[4*b..4*b+3]: the block's sum and sum of squares as thread 0 and as the last thread see them, from a
// block reduction that lacks its leading barrier.
void two_block_sums_missing_barrier(float* out, const float* in, int blocks, int threads, cudaStream_t stream);
// out[i] = in[i + 1] for every i < n: reads in[n], one past the end.
void shift_left_off_by_one(float* out, const float* in, int n, cudaStream_t stream);
// A full-mask warp sum in a block of `threads`; a partial last warp is the bug.
void full_mask_warp_sum(float* out, const float* in, int threads, cudaStream_t stream);

// ---- probe_kernels.cu ----
void read_shared_before_write(float* out_static, float* out_dynamic, cudaStream_t stream); // 32 threads each
void lanes_exit_then_shuffle(float* out, cudaStream_t stream);   // lanes 16..31 return, the rest shuffle 0xffffffff
void some_threads_skip_barrier(float* out, cudaStream_t stream); // odd threads return before __syncthreads
void warp_waits_for_barrier(cudaStream_t stream);                // lane 0 in __syncwarp(0x3), the rest at a barrier
// Per lane of one warp: __shfl_sync(v, 5, 8), __shfl_up_sync(v, 3, 8), __shfl_down_sync(v, 3, 8),
// __shfl_xor_sync(v, 6, 8) with v = 100 + lane, then __ballot_sync, __any_sync, __all_sync of lane % 3 == 0.
void shuffles_and_votes(int* out /* (32, 7) */, cudaStream_t stream);
// out[lane] = __shfl_xor_sync(0xffffffff, 100 + lane, 33): PTX reads the operand's low five bits, so lane ^ 1.
void shuffle_xor_33(int* out /* (32) */, cudaStream_t stream);
// order[t] = the position in which thread t passed a point after a __syncwarp: schedule-dependent output.
void arrival_order(int* order /* (64) */, int* counter /* (1) */, cudaStream_t stream);
// C = A B for one 16x16 tile through wmma: A (16,8) and B (8,16) in tf32, or A (16,16) and B (16,16) in bf16;
// row-major, C (16,16) fp32.
void wmma_tile_tf32(float* c, const float* a, const float* b, cudaStream_t stream);
void wmma_tile_bf16(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, cudaStream_t stream);
// Launch-configuration probes: a kernel that does nothing with `threads` threads, `blocks` blocks and
// `dynamic_shared_bytes` (the launch error's message, or empty); raise_shared_limit sets its
// cudaFuncAttributeMaxDynamicSharedMemorySize.
std::string launch_empty(int blocks, int threads, size_t dynamic_shared_bytes, cudaStream_t stream);
cudaError_t raise_shared_limit(int bytes);
// A kernel whose argument is `pointer`, whatever memory it points to.
void touch(float* pointer, cudaStream_t stream);

} // namespace engine::test::emulated
