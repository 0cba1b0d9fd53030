// slice and concat along one dimension: contiguous block copies over (outer, size, inner); each one's
// backward is the other's block copy, added into the gradient.
#include <algorithm>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/dimensions.h"
#include "engine/ops/layout_checks.h"

namespace engine {
using namespace detail;
namespace {

// A Python slice bound: negative counts from the end, then clamped to [0, size].
int64_t slice_bound(int64_t bound, int64_t size) {
    if (bound < 0) bound += size;
    return std::clamp<int64_t>(bound, 0, size);
}

// The four block copies between a wide (outer, size, inner) buffer and a narrow (outer, length, inner) one.
enum class BlockCopy { slice_forward, slice_backward, concat_forward, concat_backward };

void copy_blocks(const char* op, BlockCopy kind, const Tensor& destination, const Tensor& source,
                 const AroundDimension& wide, int64_t start, int64_t length) {
    const int which = static_cast<int>(kind); // indexes the kernels in BlockCopy's order
    if (destination.device() == Device::cpu) {
        dispatch_cpu(op, destination.dtype(), [&]<typename T>() {
            using Kernel = void (*)(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t);
            const Kernel kernels[] = {kernels::cpu::slice_forward<T>, kernels::cpu::slice_backward<T>,
                                      kernels::cpu::concat_forward<T>, kernels::cpu::concat_backward<T>};
            kernels[which](destination.data<T>(), source.data<T>(), wide.outer, wide.size, wide.inner, start, length);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, destination.dtype(), [&]<typename T>() {
            using Kernel = void (*)(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
            const Kernel kernels[] = {kernels::cuda::slice_forward, kernels::cuda::slice_backward,
                                      kernels::cuda::concat_forward, kernels::cuda::concat_backward};
            kernels[which](destination.data<T>(), source.data<T>(), wide.outer, wide.size, wide.inner, start, length,
                           cuda::compute_stream());
        });
    }
}

} // namespace

Tensor slice(const Tensor& input, int64_t dim, int64_t start, int64_t end) {
    constexpr const char* op = "slice";
    check_layout_dtype(op, input);
    ENGINE_CHECK(input.dim() >= 1, op << ": a 0-d tensor " << shape_string(input.shape()) << " has no dimension");
    const int64_t axis = normalize_dimension(op, dim, input.shape());
    const AroundDimension wide = around_dimension(input.shape(), axis);
    const int64_t first = slice_bound(start, wide.size);
    const int64_t length = std::max<int64_t>(slice_bound(end, wide.size) - first, 0);
    Shape out_shape = input.shape();
    out_shape[static_cast<size_t>(axis)] = length;
    Tensor out = Tensor::empty(out_shape, input.dtype(), input.device()); // (outer, length, inner)
    copy_blocks(op, BlockCopy::slice_forward, out, input, wide, first, length);
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // (outer, length, inner)
        if (Tensor dinput = context.input_grad(input_target); dinput.defined())
            copy_blocks(op, BlockCopy::slice_backward, dinput, dout, wide, first, length);
    });
    return out;
}

Tensor concat(const std::vector<Tensor>& inputs, int64_t dim) {
    constexpr const char* op = "concat";
    ENGINE_CHECK(!inputs.empty(), op << ": no inputs");
    const Tensor& first = inputs.front();
    check_layout_dtype(op, first);
    ENGINE_CHECK(first.dim() >= 1, op << ": a 0-d tensor " << shape_string(first.shape()) << " has no dimension");
    const int64_t axis = normalize_dimension(op, dim, first.shape());
    Shape out_shape = first.shape();
    out_shape[static_cast<size_t>(axis)] = 0;
    for (size_t which = 0; which < inputs.size(); ++which) {
        const Tensor& input = inputs[which];
        check_same_device(op, first, input);
        check_same_dtype(op, first, input);
        Shape expected = first.shape();
        bool matches = input.dim() == first.dim();
        for (size_t other = 0; matches && other < expected.size(); ++other)
            matches = other == static_cast<size_t>(axis) || input.shape()[other] == expected[other];
        ENGINE_CHECK(matches, op << ": input " << which << " has shape " << shape_string(input.shape())
                                 << ", but input 0 has " << shape_string(first.shape()) << ": all but dimension "
                                 << axis << " must match");
        out_shape[static_cast<size_t>(axis)] += input.size(axis);
    }
    Tensor out = Tensor::empty(out_shape, first.dtype(), first.device()); // (outer, total, inner)
    const AroundDimension wide = around_dimension(out_shape, axis);
    std::vector<int64_t> starts, lengths;
    std::vector<GradTarget> targets;
    std::vector<const Tensor*> recorded;
    int64_t start = 0;
    for (const Tensor& input : inputs) {
        copy_blocks(op, BlockCopy::concat_forward, out, input, wide, start, input.size(axis));
        starts.push_back(start);
        lengths.push_back(input.size(axis));
        targets.emplace_back(input);
        recorded.push_back(&input);
        start += input.size(axis);
    }
    record_node(op, recorded, {&out}, [=, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // (outer, total, inner)
        // In input order; an input used twice gets the one buffer from input_grad, both slices added into it.
        for (size_t which = 0; which < targets.size(); ++which) {
            if (Tensor dinput = context.input_grad(targets[which]); dinput.defined())
                copy_blocks(op, BlockCopy::concat_backward, dinput, dout, wide, starts[which], lengths[which]);
        }
    });
    return out;
}

} // namespace engine
