// The batch-invariant mode's fold and rounding behind tensors: checks first, then one dispatch per pass.
#include "engine/fixed_point.h"

#include <bit>

#include "engine/dispatch.h"

namespace engine {
using namespace detail;
namespace {

void check_pair(const char* op, const Tensor& sum, const Tensor& gradient) {
    ENGINE_CHECK(sum.defined() && gradient.defined(), op << ": sum and gradient must be defined");
    ENGINE_CHECK(sum.dtype() == DType::f64 && gradient.dtype() == DType::f32,
                 op << ": needs an f64 sum and an f32 gradient, got " << sum.describe() << " and " << gradient.describe());
    ENGINE_CHECK(sum.numel() == gradient.numel(),
                 op << ": sum " << sum.describe() << " and gradient " << gradient.describe() << " differ in size");
    check_same_device(op, sum, gradient);
}

} // namespace

void fixed_point_fold(const Tensor& sum, const Tensor& largest, int64_t slot, const Tensor& gradient, int exponent) {
    constexpr const char* op = "fixed_point_fold";
    check_pair(op, sum, gradient);
    ENGINE_CHECK(largest.defined() && largest.dtype() == DType::i32 && slot >= 0 && slot < largest.numel(),
                 op << ": slot " << slot << " is outside largest "
                    << (largest.defined() ? largest.describe() : std::string("none")) << " (i32)");
    check_same_device(op, sum, largest);
    // 2^±exponent must be normal doubles, and a term's grid must hold an f32's integer part.
    ENGINE_CHECK(exponent > -900 && exponent < 900, op << ": exponent " << exponent << " is outside (-900, 900)");
    auto* const slot_bits = reinterpret_cast<uint32_t*>(largest.data<int32_t>() + slot);
    if (sum.device() == Device::cpu) {
        kernels::cpu::fixed_point_fold(sum.data<double>(), slot_bits, gradient.data<float>(), exponent, sum.numel());
    } else {
        ENGINE_CUDA_ONLY(op, kernels::cuda::fixed_point_fold(sum.data<double>(), slot_bits, gradient.data<float>(),
                                                             exponent, sum.numel(), cuda::compute_stream()));
    }
}

void fixed_point_round(const Tensor& gradient, const Tensor& sum) {
    constexpr const char* op = "fixed_point_round";
    check_pair(op, sum, gradient);
    if (sum.device() == Device::cpu) {
        kernels::cpu::fixed_point_round(gradient.data<float>(), sum.data<double>(), sum.numel());
    } else {
        ENGINE_CUDA_ONLY(op, kernels::cuda::fixed_point_round(gradient.data<float>(), sum.data<double>(), sum.numel(),
                                                              cuda::compute_stream()));
    }
}

float fixed_point_largest_value(int32_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits)); }

} // namespace engine
