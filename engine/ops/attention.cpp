// attention: causal grouped-query self-attention over packed qkv (multi-head when num_kv_heads == num_heads).
// Saves qkv, its output and the per-row logsumexp (B,NH,T); backward recomputes the probabilities, so no T×T
// matrix outlives the forward, and query heads read their shared kv head in place, so no repeated K/V exists.
// bf16 qkv: bf16 out and dqkv, f32 logsumexp. Packed documents: positions (B,T) bound each query's keys to its own
// document (kernels/cpu/cpu_kernels.h), checked here once per call.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/cuda/scratch.h"

namespace engine {
using namespace detail;

Tensor attention(const Tensor& qkv, int num_heads) { return attention(qkv, num_heads, num_heads); }

void check_document_positions(const char* op, const Tensor& positions, int64_t batch, int64_t time, Device device,
                              int64_t limit) {
    ENGINE_CHECK(positions.defined() && positions.dtype() == DType::i32 && positions.dim() == 2 &&
                     positions.size(0) == batch && positions.size(1) == time,
                 op << ": document positions " << (positions.defined() ? positions.describe() : "(undefined)")
                    << " must be (" << batch << "," << time << ") i32");
    ENGINE_CHECK(positions.device() == device, op << ": document positions " << positions.describe() << " are on "
                                                  << device_name(positions.device()) << ", the data on "
                                                  << device_name(device));
    const std::vector<int32_t> values = positions.to_vector<int32_t>();
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = 0; t < time; ++t) {
            const int32_t value = values[static_cast<size_t>(b * time + t)];
            const int32_t previous = t == 0 ? -1 : values[static_cast<size_t>(b * time + t - 1)];
            ENGINE_CHECK(value == 0 || value == previous + 1,
                         op << ": document positions " << shape_string(positions.shape()) << " hold " << value
                            << " at (" << b << "," << t << ") after " << previous
                            << ": a row restarts at 0 at each document and counts up by one inside it");
            ENGINE_CHECK(value < limit, op << ": document position " << value << " at (" << b << "," << t
                                           << ") is past the " << limit << " positions the model has");
        }
}

Tensor attention(const Tensor& qkv, int num_heads, int num_kv_heads, const Tensor& positions) {
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
    if (positions.defined()) check_document_positions(op, positions, batch, time, qkv.device(), time);
    const int32_t* position_rows = positions.defined() ? positions.data<int32_t>() : nullptr; // (B,T) or null
    Tensor out = Tensor::empty({batch, time, channels}, qkv.dtype(), qkv.device());        // (B,T,C)
    Tensor logsumexp =
        Tensor::empty({batch, num_heads, time}, compute_dtype(qkv.dtype()), qkv.device()); // (B,NH,T)
    if (qkv.device() == Device::cpu) {
        dispatch_cpu(op, qkv.dtype(), [&]<typename T>() {
            kernels::cpu::attention_forward<T>(out.data<T>(), logsumexp.data<Compute<T>>(), qkv.data<T>(),
                                               position_rows, batch, time, channels, num_heads, num_kv_heads);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, qkv.dtype(), [&]<typename T>() {
            kernels::cuda::attention_forward(out.data<T>(), logsumexp.data<float>(), qkv.data<T>(), position_rows,
                                             batch, time, channels, num_heads, num_kv_heads, cuda::tf32_enabled(),
                                             cuda::compute_stream());
        });
    }
    GradTarget qkv_target(qkv);
    // The closure keeps `out` by id and a detached alias of its storage: capturing the Tensor itself would
    // be the same memory, but the alias makes explicit that backward reads it as saved data.
    record_node(op, {&qkv}, {&out},
                [=, saved_qkv = qkv, saved_out = out.detach(), saved_logsumexp = logsumexp, saved_positions = positions,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dout = context.output_grad(output_id);
                    Tensor dqkv = context.input_grad(qkv_target);
                    const int32_t* rows = saved_positions.defined() ? saved_positions.data<int32_t>() : nullptr;
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::attention_backward<T>(dqkv.data<T>(), dout.data<T>(), saved_qkv.data<T>(),
                                                                saved_out.data<T>(), saved_logsumexp.data<Compute<T>>(),
                                                                rows, batch, time, channels, num_heads, num_kv_heads);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            const cuda::Scratch<float> row_dot(size_t(batch) * num_heads * time,
                                                               cuda::compute_stream()); // (B,NH,T)
                            kernels::cuda::attention_backward(
                                dqkv.data<T>(), row_dot.get(), dout.data<T>(), saved_qkv.data<T>(), saved_out.data<T>(),
                                saved_logsumexp.data<float>(), rows, batch, time, channels, num_heads, num_kv_heads,
                                cuda::tf32_enabled(), cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
