// view and reshape: the input's storage under a new shape, as a new autograd tensor with its own node.
#include "engine/autograd.h"
#include "engine/elementwise.h"
#include "engine/ops.h"

namespace engine {
namespace {

// The shape with its one -1 (if any) inferred; every error names the op and both shapes.
Shape resolved_shape(const char* op, const Tensor& input, const Shape& shape) {
    int inferred = -1;
    int64_t known = 1;
    for (size_t axis = 0; axis < shape.size(); ++axis) {
        const int64_t extent = shape[axis];
        if (extent == -1) {
            ENGINE_CHECK(inferred < 0, op << ": " << shape_string(input.shape()) << " to " << shape_string(shape)
                                          << ": more than one -1");
            inferred = static_cast<int>(axis);
            continue;
        }
        ENGINE_CHECK(extent >= 0 && !__builtin_mul_overflow(known, extent, &known),
                     op << ": " << shape_string(input.shape()) << " to " << shape_string(shape) << ": invalid extent "
                        << extent);
    }
    Shape resolved = shape;
    if (inferred >= 0) {
        ENGINE_CHECK(known != 0, op << ": " << shape_string(input.shape()) << " to " << shape_string(shape)
                                    << ": the -1 is ambiguous next to an extent of 0");
        ENGINE_CHECK(input.numel() % known == 0, op << ": " << shape_string(input.shape()) << " ("
                                                    << input.numel() << " elements) to " << shape_string(shape)
                                                    << ": no extent for the -1 makes the counts equal");
        resolved[static_cast<size_t>(inferred)] = input.numel() / known;
        known = input.numel();
    }
    ENGINE_CHECK(known == input.numel(), op << ": " << shape_string(input.shape()) << " (" << input.numel()
                                            << " elements) to " << shape_string(shape) << " (" << known
                                            << "): element counts differ");
    return resolved;
}

Tensor view_as(const char* op, const Tensor& input, const Shape& shape) {
    const Shape resolved = resolved_shape(op, input, shape);
    // A fresh identity: gradients route by id, and the output's gradient must have the output's shape and
    // reach the input through the node below, never by sharing the input's id (as Tensor::reshape does).
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = detail::impl_of(input).storage;
    impl->shape = resolved;
    impl->dtype = input.dtype();
    impl->id = next_tensor_id();
    Tensor out(std::move(impl));
    GradTarget input_target(input);
    record_node(op, {&input}, {&out}, [input_target, output_id = out.id()](BackwardContext& context) {
        Tensor dout = context.output_grad(output_id); // the view's shape
        // No copy when the input has no gradient yet: the view's gradient, seen in the input's shape, becomes
        // the input's (the walk owns it; the view's entry is erased after this node).
        Tensor dout_as_input = dout.reshape(input_target.shape);
        if (context.adopt_input_grad(input_target, dout_as_input)) return;
        accumulate_into(context.input_grad(input_target), dout_as_input);
    });
    return out;
}

} // namespace

Tensor view(const Tensor& input, const Shape& shape) { return view_as("view", input, shape); }
Tensor reshape(const Tensor& input, const Shape& shape) { return view_as("reshape", input, shape); }

} // namespace engine
