// The Highway loops behind kernels/cpu/vector_math.h: this file is compiled once per x86 target by
// hwy/foreach_target.h, and the exported entry points pick the best target the running CPU supports.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/vector_math.cpp"
#include "hwy/foreach_target.h" // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#include "kernels/common/philox.h"
#include "kernels/cpu/vector_math.h"

#include <algorithm>
#include <cstring>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace engine::kernels::cpu::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A whole vector's room in floats or doubles for any x86 target (AVX-512: 16 floats), so tails can run through
// the same vector code as the body: an element's result never depends on where it sits in the array.
constexpr size_t tail_room = 64;

constexpr float sqrt_2_over_pi = 0.7978845608028654f;
constexpr float cubic_coefficient = 0.044715f;

// tanh(s * (x + a x^3)) and x, the shared start of GELU's value and slope.
template <class D, class V>
HWY_INLINE V gelu_tanh(D d, V x) {
    const V inner = hn::MulAdd(hn::Mul(hn::Set(d, cubic_coefficient), hn::Mul(x, x)), x, x); // x + a x^3
    return hn::Tanh(d, hn::Mul(hn::Set(d, sqrt_2_over_pi), inner));
}

template <class D, class V>
HWY_INLINE V gelu_value(D d, V x) {
    const V half = hn::Set(d, 0.5f);
    return hn::Mul(hn::Mul(half, x), hn::Add(hn::Set(d, 1.0f), gelu_tanh(d, x)));
}

// 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 a x^2): d tanh(u)/du = 1 - tanh(u)^2 and du/dx = s (1 + 3 a x^2).
template <class D, class V>
HWY_INLINE V gelu_slope(D d, V x) {
    const V one = hn::Set(d, 1.0f), half = hn::Set(d, 0.5f);
    const V t = gelu_tanh(d, x);
    const V sech_squared = hn::NegMulAdd(t, t, one);
    const V inner_slope = hn::MulAdd(hn::Set(d, 3.0f * cubic_coefficient), hn::Mul(x, x), one);
    const V tail = hn::Mul(hn::Mul(hn::Mul(half, x), sech_squared), hn::Mul(hn::Set(d, sqrt_2_over_pi), inner_slope));
    return hn::MulAdd(half, hn::Add(one, t), tail);
}

void GeluForward(float* HWY_RESTRICT out, const float* HWY_RESTRICT inp, int64_t count) {
    const hn::ScalableTag<float> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) hn::StoreU(gelu_value(d, hn::LoadU(d, inp + i)), d, out + i);
    if (i < count) {
        HWY_ALIGN float buffer[tail_room] = {};
        std::memcpy(buffer, inp + i, size_t(count - i) * sizeof(float));
        hn::Store(gelu_value(d, hn::Load(d, buffer)), d, buffer);
        std::memcpy(out + i, buffer, size_t(count - i) * sizeof(float));
    }
}

void GeluBackward(float* HWY_RESTRICT dinp, const float* HWY_RESTRICT dout, const float* HWY_RESTRICT inp,
                  int64_t count, bool accumulate) {
    const hn::ScalableTag<float> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    auto step = [&](const float* x, const float* dy, float* dx) {
        const auto before = accumulate ? hn::LoadU(d, dx) : hn::Zero(d); // the write form adds into zeros
        hn::StoreU(hn::MulAdd(gelu_slope(d, hn::LoadU(d, x)), hn::LoadU(d, dy), before), d, dx);
    };
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) step(inp + i, dout + i, dinp + i);
    if (i < count) {
        const size_t bytes = size_t(count - i) * sizeof(float);
        HWY_ALIGN float x[tail_room] = {}, dy[tail_room] = {}, dx[tail_room] = {};
        std::memcpy(x, inp + i, bytes);
        std::memcpy(dy, dout + i, bytes);
        if (accumulate) std::memcpy(dx, dinp + i, bytes);
        step(x, dy, dx);
        std::memcpy(dinp + i, dx, bytes);
    }
}

float RowMax(const float* HWY_RESTRICT row, int64_t count) {
    const hn::ScalableTag<float> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    // The vector max drops NaN (x86 max returns its second operand when either is NaN), so NaN is tracked on the
    // side and returned: a NaN logit must give a NaN loss, as the scalar loop and the CUDA kernel give.
    auto maximum = hn::Set(d, row[0]);
    auto has_nan = hn::IsNaN(maximum);
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) {
        const auto values = hn::LoadU(d, row + i);
        has_nan = hn::Or(has_nan, hn::IsNaN(values));
        maximum = hn::Max(maximum, values);
    }
    bool nan_seen = !hn::AllFalse(d, has_nan);
    float result = hn::GetLane(hn::MaxOfLanes(d, maximum));
    for (; i < count; ++i) { // max is exact: any order gives the same value
        nan_seen = nan_seen || row[i] != row[i];
        result = std::max(result, row[i]);
    }
    return nan_seen ? std::numeric_limits<float>::quiet_NaN() : result;
}

// Doubles and the floats that widen into them, half as many lanes as a float vector.
using Doubles = hn::ScalableTag<double>;
using HalfFloats = hn::Rebind<float, Doubles>;

double ExpSum(const float* HWY_RESTRICT row, double shift, int64_t count) {
    const Doubles d;
    const HalfFloats f;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto shift_vector = hn::Set(d, shift);
    auto sum = hn::Zero(d);
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) {
        const auto x = hn::PromoteTo(d, hn::LoadU(f, row + i));
        sum = hn::Add(sum, hn::Exp(d, hn::Sub(x, shift_vector)));
    }
    if (i < count) {
        HWY_ALIGN float buffer[tail_room] = {};
        std::memcpy(buffer, row + i, size_t(count - i) * sizeof(float));
        const auto x = hn::PromoteTo(d, hn::Load(f, buffer));
        const auto terms = hn::Exp(d, hn::Sub(x, shift_vector));
        sum = hn::Add(sum, hn::IfThenElseZero(hn::FirstN(d, size_t(count - i)), terms));
    }
    return hn::GetLane(hn::SumOfLanes(d, sum));
}

void SoftmaxCrossEntropyGradient(float* out, const float* row, double logsumexp, int64_t target, double dloss,
                                 int64_t count, bool accumulate) {
    const Doubles d;
    const HalfFloats f;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto shift = hn::Set(d, logsumexp), scale = hn::Set(d, dloss);
    // out may alias row, so the target's logit and starting gradient are read before the pass writes over them.
    const bool has_target = target >= 0 && target < count;
    const float target_logit = has_target ? row[target] : 0.0f, target_start = has_target ? out[target] : 0.0f;
    auto probability = [&](const float* x) { return hn::Exp(d, hn::Sub(hn::PromoteTo(d, hn::LoadU(f, x)), shift)); };
    // p * dloss in f64, rounded once. The target's -dloss is applied after the pass rather than through a lane
    // mask: GCC 12 at -O3 miscompiled the masked form for AVX-512 (Iota/Eq on f64 lanes gave wrong lanes).
    auto gradient = [&](const float* x, float* destination) {
        auto rounded = hn::DemoteTo(f, hn::Mul(probability(x), scale));
        if (accumulate) rounded = hn::Add(hn::LoadU(f, destination), rounded);
        hn::StoreU(rounded, f, destination);
    };
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes) gradient(row + i, out + i);
    if (i < count) {
        const size_t bytes = size_t(count - i) * sizeof(float);
        HWY_ALIGN float x[tail_room] = {}, destination[tail_room] = {};
        std::memcpy(x, row + i, bytes);
        std::memcpy(destination, out + i, bytes);
        gradient(x, destination);
        std::memcpy(out + i, destination, bytes);
    }
    if (has_target) {
        // The same vector exp as every other element, then (p - 1) * dloss in f64 and one rounding.
        HWY_ALIGN float x[tail_room] = {};
        x[0] = target_logit;
        const double target_probability = hn::GetLane(probability(x));
        const float value = static_cast<float>((target_probability - 1.0) * dloss);
        out[target] = accumulate ? target_start + value : value;
    }
}

// Philox4x32-10 with one counter per lane, each 32-bit word in a u64 lane (so that MulEven, the 32x32 -> 64
// multiply, reads it in place). The scalar target has no lanes to split a u64 into: it calls the scalar generator.
void PhiloxDraws(uint32_t* HWY_RESTRICT draws, uint64_t seed, uint64_t offset, uint64_t first_index, int64_t count) {
#if HWY_TARGET == HWY_SCALAR
    for (int64_t j = 0; j < count; ++j)
        draws[j] = philox4x32_10(offset + first_index + uint64_t(j), seed).value[0] >> 8;
#else
    const hn::ScalableTag<uint64_t> d;
    const hn::Repartition<uint32_t, decltype(d)> words;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto low_half = hn::Set(d, uint64_t(0xFFFFFFFFu));
    const auto multiplier0 = hn::BitCast(words, hn::Set(d, uint64_t(0xD2511F53u)));
    const auto multiplier1 = hn::BitCast(words, hn::Set(d, uint64_t(0xCD9E8D57u)));
    HWY_ALIGN uint64_t block[tail_room];
    for (int64_t j = 0; j < count; j += lanes) {
        // Counters wrap modulo 2^64 as the scalar offset + index does.
        const auto counter = hn::Add(hn::Iota(d, uint64_t(0)), hn::Set(d, offset + first_index + uint64_t(j)));
        auto c0 = hn::And(counter, low_half), c1 = hn::ShiftRight<32>(counter);
        auto c2 = hn::Zero(d), c3 = hn::Zero(d);
        uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
        for (int round = 0; round < 10; ++round) {
            const auto product0 = hn::MulEven(multiplier0, hn::BitCast(words, c0));
            const auto product1 = hn::MulEven(multiplier1, hn::BitCast(words, c2));
            const auto next0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(product1), c1), hn::Set(d, uint64_t(k0)));
            const auto next2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(product0), c3), hn::Set(d, uint64_t(k1)));
            c0 = next0;
            c1 = hn::And(product1, low_half);
            c2 = next2;
            c3 = hn::And(product0, low_half);
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        hn::Store(hn::ShiftRight<8>(c0), d, block);
        const int64_t filled = std::min(lanes, count - j);
        for (int64_t lane = 0; lane < filled; ++lane) draws[j + lane] = static_cast<uint32_t>(block[lane]);
    }
#endif
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

} // namespace engine::kernels::cpu::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace engine::kernels::cpu::simd {

HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(RowMax);
HWY_EXPORT(ExpSum);
HWY_EXPORT(SoftmaxCrossEntropyGradient);
HWY_EXPORT(PhiloxDraws);
HWY_EXPORT(TargetName);

void gelu_forward(float* out, const float* inp, int64_t count) {
    if (count > 0) HWY_DYNAMIC_DISPATCH(GeluForward)(out, inp, count);
}
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t count, bool accumulate) {
    if (count > 0) HWY_DYNAMIC_DISPATCH(GeluBackward)(dinp, dout, inp, count, accumulate);
}
float row_max(const float* row, int64_t count) { return HWY_DYNAMIC_DISPATCH(RowMax)(row, count); }
double exp_sum(const float* row, double shift, int64_t count) {
    return count > 0 ? HWY_DYNAMIC_DISPATCH(ExpSum)(row, shift, count) : 0.0;
}
void softmax_cross_entropy_gradient(float* out, const float* row, double logsumexp, int64_t target, double dloss,
                                    int64_t count, bool accumulate) {
    if (count > 0) HWY_DYNAMIC_DISPATCH(SoftmaxCrossEntropyGradient)(out, row, logsumexp, target, dloss, count,
                                                                     accumulate);
}

const char* dispatched_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

void philox_draws(uint32_t* draws, uint64_t seed, uint64_t offset, uint64_t first_index, int64_t count) {
    if (count > 0) HWY_DYNAMIC_DISPATCH(PhiloxDraws)(draws, seed, offset, first_index, count);
}

} // namespace engine::kernels::cpu::simd
#endif
