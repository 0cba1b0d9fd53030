// attention_decode: causal attention of new positions over a key/value cache, appending their keys and
// values. Inference only: it records no node and refuses grad mode (engine/ops/decode.h).
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops/decode.h"
#include "kernels/cpu/decode_kernels.h"

namespace engine {
using namespace detail;

namespace detail {
// Shared by the decode ops: they have no backward, so they run only where no node would be recorded.
void require_inference(const char* op, const Tensor& input) {
    ENGINE_CHECK(!grad_enabled() || !input.requires_grad(),
                 op << ": inference only (no backward), but " << input.describe()
                    << " requires grad with grad mode on; run it under NoGradGuard");
}
} // namespace detail

Tensor attention_decode(const Tensor& qkv, const Tensor& key_cache, const Tensor& value_cache, int past,
                        int num_heads) {
    constexpr const char* op = "attention_decode";
    ENGINE_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op << ": qkv " << qkv.describe() << " must be (B,Tnew,3C)");
    // The kernels index in int: every product of extents they form is at most one of these element counts.
    ENGINE_CHECK(qkv.numel() <= 2147483647 && key_cache.numel() <= 2147483647,
                 op << ": " << qkv.describe() << " or " << key_cache.describe()
                    << " has more elements than the kernels index (2^31-1)");
    const int batch = static_cast<int>(qkv.size(0)), time = static_cast<int>(qkv.size(1));
    const int channels = static_cast<int>(qkv.size(2) / 3);
    ENGINE_CHECK(num_heads > 0 && channels % num_heads == 0,
                 op << ": " << num_heads << " heads do not divide the width " << channels << " of qkv "
                    << shape_string(qkv.shape()));
    const int head_size = channels / num_heads;
    ENGINE_CHECK(key_cache.dim() == 4 && key_cache.size(0) == batch && key_cache.size(1) == num_heads &&
                     key_cache.size(3) == head_size,
                 op << ": key cache " << key_cache.describe() << " must be (B,NH,max_T,HS) = (" << batch << ","
                    << num_heads << ",max_T," << head_size << ") for qkv " << shape_string(qkv.shape()));
    check_shape(op, "the value cache", value_cache, key_cache.shape());
    check_same_dtype(op, qkv, key_cache);
    check_same_dtype(op, qkv, value_cache);
    check_same_device(op, qkv, key_cache);
    check_same_device(op, qkv, value_cache);
    const int max_time = static_cast<int>(key_cache.size(2));
    ENGINE_CHECK(past >= 0 && int64_t(past) + time <= max_time,
                 op << ": positions [" << past << "," << int64_t(past) + time << ") do not fit the cache's " << max_time
                    << " positions (max_T)");
    require_inference(op, qkv);
    if (qkv.device() == Device::cuda)
        ENGINE_CUDA_ONLY(op, ENGINE_CHECK(head_size <= kernels::cuda::attention_decode_max_head_size,
                                          op << ": head size " << head_size << " exceeds the CUDA kernel's "
                                             << kernels::cuda::attention_decode_max_head_size));

    Tensor out = Tensor::empty({batch, time, channels}, qkv.dtype(), qkv.device()); // (B,Tnew,C)
    if (qkv.device() == Device::cpu) {
        dispatch_cpu(op, qkv.dtype(), [&]<typename T>() {
            kernels::cpu::attention_decode<T>(out.data<T>(), key_cache.data<T>(), value_cache.data<T>(), qkv.data<T>(),
                                              batch, time, past, max_time, channels, num_heads);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, qkv.dtype(), [&]<typename T>() {
            kernels::cuda::attention_decode(out.data<T>(), key_cache.data<T>(), value_cache.data<T>(), qkv.data<T>(),
                                            batch, time, past, max_time, channels, num_heads, cuda::compute_stream());
        });
    }
    return out;
}

} // namespace engine
