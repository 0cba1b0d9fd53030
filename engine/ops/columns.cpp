// first_columns: the first `count` columns of the last dimension, as a copy. The padded vocabulary's
// public logits are first_columns(padded logits, V). Saves nothing; backward adds dout into those columns.
#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;

Tensor first_columns(const Tensor& input, int64_t count) {
    constexpr const char* op = "first_columns";
    ENGINE_CHECK(input.dim() >= 1 && count >= 0 && count <= input.size(-1),
                 op << ": " << count << " columns of " << input.describe() << ", which has "
                    << (input.dim() >= 1 ? input.size(-1) : 0) << " in its last dimension");
    Shape shape = input.shape();
    const int columns = static_cast<int>(shape.back());
    shape.back() = count;
    const int64_t rows = columns == 0 ? 0 : input.numel() / columns;
    Tensor out = Tensor::empty(shape, input.dtype(), input.device()); // (...,count)
    if (input.device() == Device::cpu) {
        dispatch_cpu(op, input.dtype(), [&]<typename T>() {
            kernels::cpu::first_columns_forward<T>(out.data<T>(), input.data<T>(), rows, columns, static_cast<int>(count));
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, input.dtype(), [&]<typename T>() {
            kernels::cuda::first_columns_forward(out.data<T>(), input.data<T>(), rows, columns, static_cast<int>(count),
                                                 cuda::compute_stream());
        });
    }
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        const Tensor dout = context.output_grad(output_id);
        const Tensor dinput = context.input_grad(input_target); // zeroed: the other columns get no gradient
        if (dout.device() == Device::cpu) {
            dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                kernels::cpu::first_columns_backward<T>(dinput.data<T>(), dout.data<T>(), rows, columns,
                                                        static_cast<int>(count));
            });
        } else {
            ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                kernels::cuda::first_columns_backward(dinput.data<T>(), dout.data<T>(), rows, columns,
                                                      static_cast<int>(count), cuda::compute_stream());
            });
        }
    });
    return out;
}

} // namespace engine
