// cast: a tensor in another floating dtype (f32, f64, bf16). Its backward converts the gradient back and
// adds it, so a cast is transparent to autograd; to bf16 rounds to nearest even.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/elementwise.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;

void convert_into(const Tensor& out, const Tensor& input) {
    constexpr const char* op = "cast";
    check_same_device(op, out, input);
    ENGINE_CHECK(out.numel() == input.numel(),
                 op << ": " << input.describe() << " into " << out.describe() << ": sizes differ");
    if (out.dtype() == input.dtype()) {
        Tensor destination = out; // a handle: the copy writes out's storage
        destination.copy_from(input.reshape(out.shape()));
        return;
    }
    convert_elements(out.raw_data(), out.dtype(), input.raw_data(), input.dtype(), input.numel(), out.device());
}

void convert_elements(void* out, DType out_dtype, const void* input, DType input_dtype, int64_t count, Device device) {
    constexpr const char* op = "cast";
    ENGINE_CHECK(count >= 0, op << ": " << count << " elements");
    if (count == 0) return;
    if (out_dtype == input_dtype) return copy_bytes(out, device, input, device, static_cast<size_t>(count) * dtype_size(out_dtype));
    if (device == Device::cpu) {
        dispatch_cpu(op, out_dtype, [&]<typename To>() {
            dispatch_cpu(op, input_dtype, [&]<typename From>() {
                if constexpr (!std::is_same_v<To, From>)
                    kernels::cpu::convert<To, From>(static_cast<To*>(out), static_cast<const From*>(input), count);
            });
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, out_dtype, [&]<typename To>() {
            ENGINE_DISPATCH_CUDA(op, input_dtype, [&]<typename From>() {
                if constexpr (!std::is_same_v<To, From>)
                    kernels::cuda::convert<To, From>(static_cast<To*>(out), static_cast<const From*>(input), count,
                                                     cuda::compute_stream());
            });
        });
    }
}

Tensor cast(const Tensor& input, DType dtype) {
    constexpr const char* op = "cast";
    ENGINE_CHECK(is_floating(dtype) && is_floating(input.dtype()),
                 op << ": " << input.describe() << " to " << dtype_name(dtype) << ": only floating dtypes convert");
    Tensor out = Tensor::empty(input.shape(), dtype, input.device());
    convert_into(out, input);
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id);
        Tensor dinput = context.input_grad(input_target);
        accumulate_into(dinput, dout); // converts across dtypes, rounding once
    });
    return out;
}

} // namespace engine
