// AdamW parameter update with PyTorch semantics (CUDA twin of kernels/cpu/adamw.cpp), with 128-bit accesses
// when the pointers allow them: one tensor, or a list of tensors in one launch with the step's epilogue (the
// bf16 working copy written and the gradient zeroed) in the same pass.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/packs.cuh"

namespace engine::kernels::cuda {
namespace {
constexpr int block_size = 256;
// A block of the list kernel updates one tile of one tensor: 4 packs of 4 floats a thread. 4096 floats are
// 80 KiB of traffic (five f32 streams), long enough that finding the tile's tensor is noise.
constexpr int64_t list_tile = int64_t(block_size) * vector_width * 4;
constexpr int64_t tiles_of(int64_t count) { return (count + list_tile - 1) / list_tile; }

struct AdamWConstants {
    float learning_rate, beta1, beta2, epsilon, bias_correction1, bias_correction2, grad_scale;
};

// One element's update: the only place the CUDA update's arithmetic is written, so that the single and the list
// kernels give the same bits.
__device__ __forceinline__ void adamw_element(float& parameter, float& first, float& second, float gradient,
                                              float weight_decay, const AdamWConstants& k) {
    gradient *= k.grad_scale;
    parameter -= k.learning_rate * weight_decay * parameter; // decoupled decay acts on the pre-update parameter
    first = k.beta1 * first + (1.0f - k.beta1) * gradient;
    second = k.beta2 * second + (1.0f - k.beta2) * gradient * gradient;
    parameter -= k.learning_rate * (first / k.bias_correction1) / (sqrtf(second / k.bias_correction2) + k.epsilon);
}

// The count floats of a pack from `index`: updated, rounded into the working copy, the gradient zeroed.
template <int count>
__device__ __forceinline__ void adamw_pack(float* param, float* grad, float* m, float* v, bfloat16* copy,
                                           bool zero_gradient, int64_t index, float weight_decay,
                                           const AdamWConstants& k) {
    const Pack<count> gradients = load_pack<count>(grad + index);
    Pack<count> parameters = load_pack<count>(param + index), first = load_pack<count>(m + index),
                second = load_pack<count>(v + index);
    for (int lane = 0; lane < count; ++lane)
        adamw_element(parameters[lane], first[lane], second[lane], gradients[lane], weight_decay, k);
    store_pack<count>(m + index, first);
    store_pack<count>(v + index, second);
    store_pack<count>(param + index, parameters);
    if (copy != nullptr) store_pack<count>(copy + index, parameters);
    if (zero_gradient) store_pack<count>(grad + index, Pack<count>{});
}

template <int width>
__global__ void adamw_update_kernel(float* param, const float* grad, float* m, float* v, int64_t N,
                                    float weight_decay, AdamWConstants k) {
    for_each_pack<width>(N, [&]<int count>(int64_t index) {
        adamw_pack<count>(param, const_cast<float*>(grad), m, v, nullptr, false, index, weight_decay, k);
    });
}

// Up to adamw_list_capacity tensors, each cut into tiles of list_tile floats; block b updates tile b of the list.
struct AdamWTensorList {
    float* parameter[adamw_list_capacity];
    float* gradient[adamw_list_capacity];
    float* exp_avg[adamw_list_capacity];
    float* exp_avg_sq[adamw_list_capacity];
    bfloat16* working_copy[adamw_list_capacity];
    int64_t count[adamw_list_capacity];
    int64_t first_tile[adamw_list_capacity]; // of this tensor's tiles in the list
    float weight_decay[adamw_list_capacity];
    uint64_t vectorised; // bit t: tensor t's pointers all take 128-bit float (and 64-bit bf16) accesses
    int size;
    bool zero_gradients; // the gradients are written (zeroed), else only read
    // What the launch reads and writes, for the emulated device (emulator/launch.h), which sees no pointer inside
    // a struct.
    template <typename Visit>
    void for_each_pointer(Visit visit) const {
        for (int tensor = 0; tensor < size; ++tensor) {
            visit(parameter[tensor]), visit(exp_avg[tensor]), visit(exp_avg_sq[tensor]);
            if (zero_gradients) visit(gradient[tensor]);
            else visit(static_cast<const float*>(gradient[tensor]));
            if (working_copy[tensor] != nullptr) visit(working_copy[tensor]);
        }
    }
};
// The list travels as a kernel argument, which the classic limit holds to 4 KiB with the kernel's other arguments.
static_assert(sizeof(AdamWTensorList) + sizeof(AdamWConstants) + 16 <= 4096); // 16: the arguments' padding
static_assert(adamw_list_capacity <= 64, "one bit of `vectorised` a tensor");

__global__ void __launch_bounds__(block_size) adamw_update_list_kernel(AdamWTensorList list, AdamWConstants k) {
    const bool zero_gradients = list.zero_gradients;
    // The last tensor whose first tile is at or before this block's (tensors with no elements are not listed).
    int low = 0, high = list.size - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (list.first_tile[middle] <= int64_t(blockIdx.x)) low = middle;
        else high = middle - 1;
    }
    const int tensor = low;
    float* const param = list.parameter[tensor];
    float* const grad = list.gradient[tensor];
    float* const m = list.exp_avg[tensor];
    float* const v = list.exp_avg_sq[tensor];
    bfloat16* const copy = list.working_copy[tensor];
    const float decay = list.weight_decay[tensor];
    const int64_t begin = (int64_t(blockIdx.x) - list.first_tile[tensor]) * list_tile;
    const int64_t end = begin + list_tile < list.count[tensor] ? begin + list_tile : list.count[tensor];
    if ((list.vectorised >> tensor) & 1u) {
        // Packs from the tile's start (a multiple of 4096 floats, so aligned as the tensor's pointers are), then
        // the last tile's end % 4 floats one a thread: the same per-element arithmetic either way.
        const int64_t packed_end = begin + (end - begin) / vector_width * vector_width;
        for (int64_t index = begin + int64_t(threadIdx.x) * vector_width; index < packed_end;
             index += int64_t(blockDim.x) * vector_width)
            adamw_pack<vector_width>(param, grad, m, v, copy, zero_gradients, index, decay, k);
        if (packed_end + threadIdx.x < end)
            adamw_pack<1>(param, grad, m, v, copy, zero_gradients, packed_end + threadIdx.x, decay, k);
    } else {
        for (int64_t index = begin + threadIdx.x; index < end; index += blockDim.x)
            adamw_pack<1>(param, grad, m, v, copy, zero_gradients, index, decay, k);
    }
}

} // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2,
                  float grad_scale, cudaStream_t stream) {
    if (N == 0) return;
    const AdamWConstants constants{lr, beta1, beta2, eps, bias_correction1, bias_correction2, grad_scale};
    ENGINE_LAUNCH_PACKED(adamw_update_kernel, vector_aligned(param, grad, m, v), N, block_size, stream, param, grad, m,
                         v, N, weight_decay, constants);
}

void adamw_update_list(const AdamWTensor<float>* tensors, int tensor_count, bool zero_gradients, float lr, float beta1,
                       float beta2, float eps, float bias_correction1, float bias_correction2, float grad_scale,
                       cudaStream_t stream) {
    const AdamWConstants constants{lr, beta1, beta2, eps, bias_correction1, bias_correction2, grad_scale};
    int next = 0;
    while (next < tensor_count) {
        AdamWTensorList list{};
        list.zero_gradients = zero_gradients;
        // Fill a list with the next tensors that hold elements; launch it when it is full or the tensors end.
        for (; next < tensor_count && list.size < adamw_list_capacity; ++next) {
            const AdamWTensor<float>& tensor = tensors[next];
            if (tensor.count == 0) continue;
            const int slot = list.size++;
            list.parameter[slot] = tensor.parameter;
            list.gradient[slot] = tensor.gradient;
            list.exp_avg[slot] = tensor.exp_avg;
            list.exp_avg_sq[slot] = tensor.exp_avg_sq;
            list.working_copy[slot] = tensor.working_copy;
            list.count[slot] = tensor.count;
            list.weight_decay[slot] = tensor.weight_decay;
            list.first_tile[slot] = slot == 0 ? 0 : list.first_tile[slot - 1] + tiles_of(list.count[slot - 1]);
            const bool copy_aligned = reinterpret_cast<uintptr_t>(tensor.working_copy) % (vector_width * sizeof(bfloat16)) == 0;
            if (vector_aligned(tensor.parameter, tensor.gradient, tensor.exp_avg, tensor.exp_avg_sq) && copy_aligned)
                list.vectorised |= uint64_t(1) << slot;
        }
        if (list.size == 0) break;
        const int64_t tiles = list.first_tile[list.size - 1] + tiles_of(list.count[list.size - 1]);
        ENGINE_CHECK(tiles <= int64_t(0x7fffffff), "adamw_update_list: " << tiles << " tiles exceed a launch's grid");
        ENGINE_LAUNCH(adamw_update_list_kernel, static_cast<unsigned>(tiles), block_size, 0, stream, list, constants);
    }
}

} // namespace engine::kernels::cuda
