// attention: causal grouped-query self-attention over packed qkv (multi-head when num_kv_heads == num_heads).
// Saves qkv, its output and the per-row logsumexp (B,NH,T); backward recomputes the probabilities, so no T×T
// matrix outlives the forward, and query heads read their shared kv head in place, so no repeated K/V exists.
// bf16 qkv: bf16 out and dqkv, f32 logsumexp.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

Tensor attention(const Tensor& qkv, int num_heads) { return attention(qkv, num_heads, num_heads); }

Tensor attention(const Tensor& qkv, int num_heads, int num_kv_heads) {
    constexpr const char* op = "attention";
    ENGINE_CHECK(qkv.dim() == 3, op << ": qkv " << qkv.describe() << " must be (B,T,(NH+2*KVH)*D)");
    ENGINE_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
                 op << ": num_kv_heads=" << num_kv_heads << " must divide num_heads=" << num_heads
                    << " (both positive) for qkv " << shape_string(qkv.shape()));
    const int64_t packed_heads = int64_t(num_heads) + 2 * int64_t(num_kv_heads);
    ENGINE_CHECK(qkv.size(2) > 0 && qkv.size(2) % packed_heads == 0,
                 op << ": the width " << qkv.size(2) << " of qkv " << shape_string(qkv.shape())
                    << " is not (NH+2*KVH)*D for an integer head size D > 0, with num_heads=" << num_heads
                    << " and num_kv_heads=" << num_kv_heads);
    const int batch = static_cast<int>(qkv.size(0)), time = static_cast<int>(qkv.size(1));
    const int head_size = static_cast<int>(qkv.size(2) / packed_heads);
    const int channels = num_heads * head_size; // C: the query and output width
    Tensor out = Tensor::empty({batch, time, channels}, qkv.dtype(), qkv.device());        // (B,T,C)
    Tensor logsumexp =
        Tensor::empty({batch, num_heads, time}, compute_dtype(qkv.dtype()), qkv.device()); // (B,NH,T)
    if (qkv.device() == Device::cpu) {
        dispatch_cpu(op, qkv.dtype(), [&]<typename T>() {
            kernels::cpu::attention_forward<T>(out.data<T>(), logsumexp.data<Compute<T>>(), qkv.data<T>(), batch, time,
                                               channels, num_heads, num_kv_heads);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, qkv.dtype(), [&]<typename T>() {
            kernels::cuda::attention_forward(out.data<T>(), logsumexp.data<float>(), qkv.data<T>(), batch, time,
                                             channels, num_heads, num_kv_heads, cuda::tf32_enabled(),
                                             cuda::compute_stream());
        });
    }
    GradTarget qkv_target(qkv);
    // The closure keeps `out` by id and a detached alias of its storage: capturing the Tensor itself would
    // be the same memory, but the alias makes explicit that backward reads it as saved data.
    record_node(op, {&qkv}, {&out},
                [=, saved_qkv = qkv, saved_out = out.detach(), saved_logsumexp = logsumexp,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dqkv = context.input_grad(qkv_target);
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::attention_backward<T>(dqkv.data<T>(), dout.data<T>(), saved_qkv.data<T>(),
                                                                saved_out.data<T>(), saved_logsumexp.data<Compute<T>>(),
                                                                batch, time, channels, num_heads, num_kv_heads);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            const cuda::Scratch<float> row_dot(size_t(batch) * num_heads * time,
                                                               cuda::compute_stream()); // (B,NH,T)
                            kernels::cuda::attention_backward(dqkv.data<T>(), row_dot.get(), dout.data<T>(),
                                                              saved_qkv.data<T>(), saved_out.data<T>(),
                                                              saved_logsumexp.data<float>(), batch, time, channels,
                                                              num_heads, num_kv_heads, cuda::tf32_enabled(),
                                                              cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
