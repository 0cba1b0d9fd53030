// Sums (CUDA twin of kernels/cpu/reduce.cpp). The sum is two-stage and deterministic: a fixed number of blocks
// (a function of N only) each write a double partial, then one block adds the partials in a fixed order; the
// partials live in the caller's workspace (reduction_workspace_count doubles). The sum of squares (the gradient
// norm) follows the CPU's own association instead, so both give the same bits. No atomics anywhere.
#include "base/cuda/launch.h"
#include "kernels/common/sum_of_squares_order.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/grid.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
constexpr int max_partials = 1024; // enough blocks to cover every SM several times
constexpr int final_block_size = 1024;
} // namespace

int reduction_workspace_count(int64_t N) {
    const int blocks = ceil_div(N, block_size);
    return blocks < 1 ? 1 : (blocks > max_partials ? max_partials : blocks);
}

// The block's sum of one double per thread. The scratch is declared in this plain function rather than in
// the template kernel below: the emulated device (docs/CUDA.md) can poison the static shared memory of
// non-template functions only.
static __device__ double block_sum_of(double value) {
    __shared__ double scratch[warp_size];
    return block_sum(value, scratch);
}

// Input float or bf16 (widened exactly): the partials are double either way.
template <bool square, typename T>
static __global__ void partial_sum_kernel(double* partials, const T* inp, int64_t N) {
    double sum = 0.0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        const double value = widen(inp[i]);
        sum += square ? value * value : value;
    }
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// The sum of squares in the CPU kernel's association (kernels/common/sum_of_squares_order.h). A thread owns one
// (chunk, lane): the lanes of a chunk are 8 adjacent threads of one warp, reading 8 adjacent floats per step
// (32-byte segments), and the first of them adds the 8 lane sums in lane order. No atomics; the bits are the
// CPU's whatever the schedule.
static __global__ void chunk_sums_of_squares_kernel(double* chunk_sums, TensorList list) {
    const int64_t thread = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    const int64_t chunk = thread / sum_of_squares_lanes;
    const int lane = static_cast<int>(thread % sum_of_squares_lanes);
    double sum = 0.0;
    if (chunk < list.chunks) {
        int tensor = 0; // the tensor holding the chunk (tensors without elements hold none)
        while (tensor + 1 < list.size && list.first_chunk[tensor + 1] <= chunk) ++tensor;
        const int64_t begin = (chunk - list.first_chunk[tensor]) * sum_of_squares_chunk;
        const int64_t end = begin + sum_of_squares_chunk < list.count[tensor] ? begin + sum_of_squares_chunk
                                                                               : list.count[tensor];
        const float* values = list.data[tensor];
        for (int64_t i = begin + lane; i < end; i += sum_of_squares_lanes) {
            const double value = values[i];
            sum += value * value;
        }
    }
    // Every thread of the warp takes part in the shuffles, those past the last chunk with 0.
    const int first_lane = (threadIdx.x % warp_size) / sum_of_squares_lanes * sum_of_squares_lanes;
    double total = 0.0;
    for (int k = 0; k < sum_of_squares_lanes; ++k) total += __shfl_sync(0xffffffffu, sum, first_lane + k);
    if (lane == 0 && chunk < list.chunks) chunk_sums[chunk] = total;
}

// One thread: each tensor's chunks in order from 0.0, then the tensors in order onto the total so far (0.0 for
// the first list of a launch sequence).
static __global__ void ordered_total_kernel(double* out, const double* chunk_sums, TensorList list, bool first) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double total = first ? 0.0 : out[0];
    for (int tensor = 0; tensor < list.size; ++tensor) {
        const int64_t chunks = sum_of_squares_chunks(list.count[tensor]);
        double part = 0.0;
        for (int64_t chunk = 0; chunk < chunks; ++chunk) part += chunk_sums[list.first_chunk[tensor] + chunk];
        total += part;
    }
    out[0] = total;
}

static __global__ void final_sum_kernel(float* float_out, double* double_out, const double* partials, int count,
                                        double scale) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
    sum = block_sum_of(sum);
    if (threadIdx.x == 0) {
        if (float_out != nullptr) float_out[0] = static_cast<float>(scale * sum);
        if (double_out != nullptr) double_out[0] = sum;
    }
}

template <typename T>
static __global__ void sum_backward_kernel(T* dinp, const float* dout, int64_t N, float scale) {
    const float gradient = scale * dout[0];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
        dinp[i] = narrow<T>(widen(dinp[i]) + gradient);
    }
}

template <bool square, typename T>
static void two_stage_sum(float* float_out, double* double_out, double* partials, const T* inp, int64_t N,
                          double scale, cudaStream_t stream) {
    const int count = reduction_workspace_count(N);
    ENGINE_LAUNCH((partial_sum_kernel<square, T>), count, block_size, 0, stream, partials, inp, N);
    ENGINE_LAUNCH(final_sum_kernel, 1, final_block_size, 0, stream, float_out, double_out, partials, count, scale);
}

void sum_forward(float* out, double* partials_workspace, const float* inp, int64_t N, float scale,
                 cudaStream_t stream) {
    two_stage_sum<false>(out, nullptr, partials_workspace, inp, N, scale, stream);
}
void sum_forward(float* out, double* partials_workspace, const bfloat16* inp, int64_t N, float scale,
                 cudaStream_t stream) {
    two_stage_sum<false>(out, nullptr, partials_workspace, inp, N, scale, stream);
}

template <typename T>
static void launch_sum_backward(T* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    if (N == 0) return;
    ENGINE_LAUNCH(sum_backward_kernel<T>, elementwise_grid(N, block_size), block_size, 0, stream, dinp, dout, N, scale);
}
void sum_backward(float* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, N, scale, stream);
}
void sum_backward(bfloat16* dinp, const float* dout, int64_t N, float scale, cudaStream_t stream) {
    launch_sum_backward(dinp, dout, N, scale, stream);
}

int64_t sum_of_squares_workspace_count(const int64_t* counts, int tensor_count) {
    int64_t largest_list = 1; // the lists run one after the other and reuse the workspace
    for (int first = 0; first < tensor_count; first += tensor_list_capacity) {
        int64_t chunks = 0;
        for (int index = first; index < tensor_count && index < first + tensor_list_capacity; ++index)
            chunks += sum_of_squares_chunks(counts[index]);
        largest_list = chunks > largest_list ? chunks : largest_list;
    }
    return largest_list;
}

void sum_of_squares_list(double* out, double* chunks_workspace, const float* const* tensors, const int64_t* counts,
                         int tensor_count, cudaStream_t stream) {
    for (int first = 0; first == 0 || first < tensor_count; first += tensor_list_capacity) {
        TensorList list{};
        list.size = tensor_count - first < tensor_list_capacity ? tensor_count - first : tensor_list_capacity;
        for (int index = 0; index < list.size; ++index) {
            list.data[index] = tensors[first + index];
            list.count[index] = counts[first + index];
            list.first_chunk[index] = list.chunks;
            list.chunks += sum_of_squares_chunks(list.count[index]);
        }
        if (list.chunks > 0)
            ENGINE_LAUNCH(chunk_sums_of_squares_kernel,
                          static_cast<int>(ceil_div(list.chunks * sum_of_squares_lanes, int64_t(block_size))), block_size,
                          0, stream, chunks_workspace, list);
        ENGINE_LAUNCH(ordered_total_kernel, 1, 1, 0, stream, out, chunks_workspace, list, first == 0);
    }
}

void sum_of_squares(double* out, double* chunks_workspace, const float* inp, int64_t N, cudaStream_t stream) {
    sum_of_squares_list(out, chunks_workspace, &inp, &N, 1, stream);
}

} // namespace engine::kernels::cuda
