// NF4 weights: quantisation, dequantisation and the linear op over them (engine/ops/nf4.h), forward, backward and
// checks, over the NF4 kernels and the ops' GEMM.
#include "engine/ops/nf4.h"

#include <vector>

#include "engine/autograd.h"
#include "engine/dispatch.h"
#include "engine/ops.h"
#include "engine/ops/gemm.h"
#include "kernels/cpu/nf4_kernels.h"

namespace engine {
using namespace detail;

namespace {

int64_t blocks_of(int64_t n) { return (n + kernels::cpu::nf4_block - 1) / kernels::cpu::nf4_block; }
int64_t groups_of(int64_t blocks) {
    return (blocks + kernels::cpu::nf4_scale_block - 1) / kernels::cpu::nf4_scale_block;
}

} // namespace

int64_t Nf4Weight::numel() const { return shape_numel(shape); }

size_t Nf4Weight::bytes() const { return codes.storage_bytes() + scale_codes.storage_bytes() + scale_absmax.storage_bytes(); }

Nf4Weight Nf4Weight::to(Device target) const {
    Nf4Weight moved = *this;
    moved.codes = codes.to(target, codes.category());
    moved.scale_codes = scale_codes.to(target, scale_codes.category());
    moved.scale_absmax = scale_absmax.to(target, scale_absmax.category());
    return moved;
}

Nf4Weight quantize_nf4(const Tensor& weight, MemoryCategory category) {
    constexpr const char* op = "quantize_nf4";
    ENGINE_CHECK(weight.defined() && (weight.dtype() == DType::f32 || weight.dtype() == DType::bf16),
                 op << ": the weight " << (weight.defined() ? weight.describe() : std::string("(undefined)"))
                    << " must be f32 or bf16");
    const int64_t n = weight.numel(), blocks = blocks_of(n), groups = groups_of(blocks);
    const Device device = weight.device();
    // Codes and absmax on the weight's device, from its f32 values.
    const Tensor values = weight.dtype() == DType::f32 ? weight : cast(weight, DType::f32);
    Nf4Weight out;
    out.shape = weight.shape();
    out.codes = Tensor::empty({(n + 1) / 2}, DType::u8, device, category);
    Tensor absmax = Tensor::empty({blocks}, DType::f32, device, MemoryCategory::workspace);
    if (device == Device::cpu) {
        kernels::cpu::nf4_quantize(out.codes.data<uint8_t>(), absmax.data<float>(), values.data<float>(), n);
    } else {
        ENGINE_CUDA_ONLY(op, kernels::cuda::nf4_quantize(out.codes.data<uint8_t>(), absmax.data<float>(),
                                                         values.data<float>(), n, cuda::compute_stream()));
    }
    // The scales' double quantisation on the host: n/64 values, and a mean that must be summed in one order.
    const Tensor host_absmax = absmax.to(Device::cpu, MemoryCategory::workspace);
    Tensor scale_codes = Tensor::empty({blocks}, DType::u8, Device::cpu, category);
    Tensor scale_absmax = Tensor::empty({groups}, DType::f32, Device::cpu, category);
    kernels::cpu::nf4_quantize_scales(scale_codes.data<uint8_t>(), scale_absmax.data<float>(), &out.offset,
                                      host_absmax.data<float>(), blocks);
    out.scale_codes = device == Device::cpu ? scale_codes : scale_codes.to(device, category);
    out.scale_absmax = device == Device::cpu ? scale_absmax : scale_absmax.to(device, category);
    return out;
}

Tensor dequantize_nf4(const Nf4Weight& weight, DType dtype, MemoryCategory category) {
    constexpr const char* op = "dequantize_nf4";
    ENGINE_CHECK(weight.defined(), op << ": no NF4 weight");
    ENGINE_CHECK(dtype == DType::f32 || dtype == DType::bf16, op << ": dequantises to f32 or bf16, not " << dtype_name(dtype));
    const int64_t n = weight.numel(), blocks = blocks_of(n);
    ENGINE_CHECK(weight.codes.numel() == (n + 1) / 2 && weight.scale_codes.numel() == blocks &&
                     weight.scale_absmax.numel() == groups_of(blocks) && weight.codes.dtype() == DType::u8 &&
                     weight.scale_codes.dtype() == DType::u8 && weight.scale_absmax.dtype() == DType::f32,
                 op << ": a weight of " << shape_string(weight.shape) << " needs " << (n + 1) / 2 << " u8 codes, "
                    << blocks << " u8 scale codes and " << groups_of(blocks) << " f32 scale absmax, not "
                    << weight.codes.describe() << ", " << weight.scale_codes.describe() << ", "
                    << weight.scale_absmax.describe());
    const Device device = weight.device();
    ENGINE_CHECK(weight.scale_codes.device() == device && weight.scale_absmax.device() == device,
                 op << ": the weight's tensors are on different devices");
    Tensor out = Tensor::empty(weight.shape, dtype, device, category);
    Tensor absmax = Tensor::empty({blocks}, DType::f32, device, MemoryCategory::workspace);
    if (device == Device::cpu) {
        kernels::cpu::nf4_dequantize_scales(absmax.data<float>(), weight.scale_codes.data<uint8_t>(),
                                            weight.scale_absmax.data<float>(), weight.offset, blocks);
        if (dtype == DType::f32)
            kernels::cpu::nf4_dequantize(out.data<float>(), weight.codes.data<uint8_t>(), absmax.data<float>(), n);
        else kernels::cpu::nf4_dequantize(out.data<bfloat16>(), weight.codes.data<uint8_t>(), absmax.data<float>(), n);
    } else {
        ENGINE_CUDA_ONLY(op, {
            const cudaStream_t stream = cuda::compute_stream();
            kernels::cuda::nf4_dequantize_scales(absmax.data<float>(), weight.scale_codes.data<uint8_t>(),
                                                 weight.scale_absmax.data<float>(), weight.offset, blocks, stream);
            if (dtype == DType::f32)
                kernels::cuda::nf4_dequantize(out.data<float>(), weight.codes.data<uint8_t>(), absmax.data<float>(), n,
                                              stream);
            else
                kernels::cuda::nf4_dequantize(out.data<bfloat16>(), weight.codes.data<uint8_t>(), absmax.data<float>(),
                                              n, stream);
        });
    }
    return out;
}

Tensor nf4_linear(const Tensor& input, const Nf4Weight& weight, bool transposed, const Tensor& bias) {
    constexpr const char* op = "nf4_linear";
    ENGINE_CHECK(weight.defined() && weight.shape.size() == 2 && input.defined() && input.dim() >= 1,
                 op << ": input " << (input.defined() ? input.describe() : std::string("(undefined)"))
                    << " and a 2-D NF4 weight needed, got " << shape_string(weight.shape));
    const int in_features = static_cast<int>(transposed ? weight.shape[1] : weight.shape[0]);
    const int out_features = static_cast<int>(transposed ? weight.shape[0] : weight.shape[1]);
    ENGINE_CHECK(input.size(-1) == in_features, op << ": input " << shape_string(input.shape()) << " and weight "
                                                   << shape_string(weight.shape) << (transposed ? "ᵀ" : "")
                                                   << ": inner dimensions differ");
    ENGINE_CHECK(input.dtype() == DType::f32 || input.dtype() == DType::bf16,
                 op << ": input " << input.describe() << " must be f32 or bf16");
    ENGINE_CHECK(input.device() == weight.device(), op << ": input " << input.describe() << " and the NF4 weight on "
                                                       << device_name(weight.device()) << " are on different devices");
    ENGINE_CHECK(!bias.defined() || !bias.requires_grad(),
                 op << ": the bias " << bias.describe() << " requires grad; a 4-bit layer's bias is frozen with it");
    Tensor out;
    {
        // The dense op's own GEMM (and bias epilogue) on the dequantised weight, recorded by nothing: this op's
        // node, below, keeps the 4-bit weight instead of the whole one.
        const NoGradGuard no_grad;
        const Tensor dense = dequantize_nf4(weight, input.dtype());
        out = transposed ? matmul(input, dense, true) : linear(input, dense, bias);
        if (transposed && bias.defined()) out = add(out, bias);
    }
    const int rows = static_cast<int>(input.numel() / in_features);
    GradTarget input_target(input);
    record_node(op, {&input}, {&out},
                [=, saved = weight, dtype = input.dtype(), output_id = out.id()](BackwardContext& context) {
                    Tensor dinput = context.input_grad(input_target);
                    if (!dinput.defined()) return;
                    const Tensor dout = context.output_grad(output_id); // (rows,out)
                    const Tensor dense = dequantize_nf4(saved, dtype);
                    gemm_tensors(op, dinput, dout, dense, rows, in_features, out_features, false, !transposed, 1.0);
                });
    return out;
}

} // namespace engine
