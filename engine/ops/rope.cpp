// rope (rotary position embedding, Hugging Face's rotate-half layout) and rope_tables, its cos/sin tables as
// transformers' LlamaRotaryEmbedding computes them: checks, dispatch, and the inverse rotation in backward.
#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"

namespace engine {
using namespace detail;
namespace {

// The f32 recipe of transformers (default rope type): inv_freq = 1.0 / (base ** (arange(0, D, 2).float() / D))
// in f32 (exponent, power and reciprocal each rounded to f32), freqs = inv_freq ⊗ t in f32, then cos/sin in f32.
// cos/sin are evaluated in double from the f32 angle and rounded once: correctly rounded (torch's f32 cos and
// sin are within 1 ulp of that).
void fill_float_tables(std::vector<float>& cos, std::vector<float>& sin, int positions, int head_size,
                       double theta) {
    const int half = head_size / 2;
    const float base = static_cast<float>(theta);
    std::vector<float> inverse_frequency(static_cast<size_t>(half)); // (D/2)
    for (int i = 0; i < half; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_size);
        inverse_frequency[static_cast<size_t>(i)] = 1.0f / ::powf(base, exponent);
    }
    for (int t = 0; t < positions; ++t) {
        for (int i = 0; i < half; ++i) {
            const float angle = static_cast<float>(t) * inverse_frequency[static_cast<size_t>(i)];
            const size_t index = static_cast<size_t>(t) * half + i;
            cos[index] = static_cast<float>(std::cos(static_cast<double>(angle)));
            sin[index] = static_cast<float>(std::sin(static_cast<double>(angle)));
        }
    }
}

// The same in double throughout (the float64 gradient checks' tables).
void fill_double_tables(std::vector<double>& cos, std::vector<double>& sin, int positions, int head_size,
                        double theta) {
    const int half = head_size / 2;
    for (int t = 0; t < positions; ++t) {
        for (int i = 0; i < half; ++i) {
            const double angle = static_cast<double>(t) / std::pow(theta, static_cast<double>(2 * i) / head_size);
            const size_t index = static_cast<size_t>(t) * half + i;
            cos[index] = std::cos(angle);
            sin[index] = std::sin(angle);
        }
    }
}

void check_table(const char* op, const char* name, const Tensor& table, const Tensor& x, int head_size) {
    ENGINE_CHECK(table.defined(), op << ": the " << name << " table is undefined (x " << x.describe() << ")");
    ENGINE_CHECK(table.dim() == 2 && table.size(1) == head_size / 2,
                 op << ": " << name << " table " << table.describe() << " must be (positions," << head_size / 2
                    << ") for head_size " << head_size << " (x " << x.describe() << ")");
    const DType expected = compute_dtype(x.dtype());
    ENGINE_CHECK(table.dtype() == expected, op << ": " << name << " table " << table.describe() << " must be "
                                               << dtype_name(expected) << " for x " << x.describe());
    check_same_device(op, x, table);
}

} // namespace

RopeTables rope_tables(int positions, int head_size, double theta, DType dtype, Device device) {
    constexpr const char* op = "rope_tables";
    ENGINE_CHECK(positions >= 0, op << ": positions " << positions << " must be >= 0");
    ENGINE_CHECK(head_size > 0 && head_size % 2 == 0,
                 op << ": head_size " << head_size << " must be positive and even (rotation pairs (i, i + D/2))");
    ENGINE_CHECK(std::isfinite(theta) && theta > 0.0, op << ": theta " << theta << " must be finite and > 0");
    ENGINE_CHECK(is_floating(dtype), op << ": dtype " << dtype_name(dtype) << " is not floating-point");
    const Shape shape = {positions, head_size / 2};
    const size_t count = static_cast<size_t>(positions) * static_cast<size_t>(head_size / 2);
    // A constant buffer that lives with the model: `parameters` (engine/ops/llama.h says why).
    if (compute_dtype(dtype) == DType::f64) {
        std::vector<double> cos(count), sin(count);
        fill_double_tables(cos, sin, positions, head_size, theta);
        return {Tensor::from_vector<double>(cos, shape, device, MemoryCategory::parameters),
                Tensor::from_vector<double>(sin, shape, device, MemoryCategory::parameters)};
    }
    std::vector<float> cos(count), sin(count);
    fill_float_tables(cos, sin, positions, head_size, theta);
    return {Tensor::from_vector<float>(cos, shape, device, MemoryCategory::parameters),
            Tensor::from_vector<float>(sin, shape, device, MemoryCategory::parameters)};
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int head_size, const Tensor& positions) {
    constexpr const char* op = "rope";
    ENGINE_CHECK(x.dim() == 3, op << ": x " << x.describe() << " must be (B,T,heads*head_size)");
    ENGINE_CHECK(is_floating(x.dtype()), op << ": x " << x.describe() << " must be f32, f64 or bf16");
    ENGINE_CHECK(head_size > 0 && head_size % 2 == 0,
                 op << ": head_size " << head_size << " must be positive and even (x " << x.describe() << ")");
    ENGINE_CHECK(x.size(2) % head_size == 0, op << ": x " << x.describe() << " has width " << x.size(2)
                                                << ", not a multiple of head_size " << head_size);
    check_table(op, "cos", cos, x, head_size);
    check_table(op, "sin", sin, x, head_size);
    ENGINE_CHECK(cos.shape() == sin.shape(), op << ": cos table " << shape_string(cos.shape()) << " and sin table "
                                                << shape_string(sin.shape()) << " differ");
    ENGINE_CHECK(x.size(1) <= cos.size(0), op << ": sequence length " << x.size(1) << " of x " << x.describe()
                                              << " exceeds the tables' " << cos.size(0) << " positions "
                                              << shape_string(cos.shape()));
    leading_rows(op, x); // B*T and the width fit the kernels' int dimensions
    if (positions.defined()) check_document_positions(op, positions, x.size(0), x.size(1), x.device(), cos.size(0));
    const int32_t* position_rows = positions.defined() ? positions.data<int32_t>() : nullptr; // (B,T) or null
    const int batch = static_cast<int>(x.size(0)), time = static_cast<int>(x.size(1));
    const int heads = static_cast<int>(x.size(2) / head_size);

    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device()); // (B,T,H*D)
    if (x.device() == Device::cpu) {
        dispatch_cpu(op, x.dtype(), [&]<typename T>() {
            kernels::cpu::rope_forward<T>(out.data<T>(), x.data<T>(), cos.data<Compute<T>>(), sin.data<Compute<T>>(),
                                          position_rows, batch, time, heads, head_size);
        });
    } else {
        ENGINE_DISPATCH_CUDA(op, x.dtype(), [&]<typename T>() {
            kernels::cuda::rope_forward(out.data<T>(), x.data<T>(), cos.data<float>(), sin.data<float>(), position_rows,
                                        batch, time, heads, head_size, cuda::compute_stream());
        });
    }

    // The rotation is linear in x, so backward needs only the tables (constants: they get no gradient).
    GradTarget x_target(x);
    record_node(op, {&x}, {&out},
                [=, saved_cos = cos.detach(), saved_sin = sin.detach(), saved_positions = positions,
                 output_id = out.id()](BackwardContext& context) {
                    Tensor dx = context.input_grad(x_target);
                    if (!dx.defined()) return;
                    Tensor dout = context.output_grad(output_id);
                    const int32_t* rows = saved_positions.defined() ? saved_positions.data<int32_t>() : nullptr;
                    if (dout.device() == Device::cpu) {
                        dispatch_cpu(op, dout.dtype(), [&]<typename T>() {
                            kernels::cpu::rope_backward<T>(dx.data<T>(), dout.data<T>(), saved_cos.data<Compute<T>>(),
                                                           saved_sin.data<Compute<T>>(), rows, batch, time, heads,
                                                           head_size);
                        });
                    } else {
                        ENGINE_DISPATCH_CUDA(op, dout.dtype(), [&]<typename T>() {
                            kernels::cuda::rope_backward(dx.data<T>(), dout.data<T>(), saved_cos.data<float>(),
                                                         saved_sin.data<float>(), rows, batch, time, heads, head_size,
                                                         cuda::compute_stream());
                        });
                    }
                });
    return out;
}

} // namespace engine
