// bf16 foundations: the rounding rule against an exact oracle, the cast op, f32 gradient buffers for bf16
// leaves, the working copies over f32 masters, and BF16 safetensors out and back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/elementwise.h"
#include "engine/engine.h"
#include "expect_error.h"
#include "nn/gpt.h"
#include "nn/io/safetensors.h"

namespace engine::testing {
namespace {

// The oracle: among the two bf16 values around x (its truncation and the next one up in magnitude), the one
// nearer in exact double arithmetic, the one with an even last bit on a tie. Independent of the bit trick in
// base/bfloat16.h, which adds a rounding bias.
uint16_t nearest_even_bfloat16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint16_t truncated = static_cast<uint16_t>(bits >> 16);
    const uint16_t next = static_cast<uint16_t>(truncated + 1);
    auto value = [](uint16_t half) {
        const uint32_t widened = static_cast<uint32_t>(half) << 16;
        float result;
        std::memcpy(&result, &widened, 4);
        return static_cast<double>(result);
    };
    const double low = value(truncated);
    const double high = (next & 0x7f80) == 0x7f80 && (next & 0x7f) == 0 ? std::copysign(INFINITY, x) : value(next);
    const double below = std::fabs(static_cast<double>(x) - low);
    const double above = std::isinf(high) ? std::fabs(static_cast<double>(x)) * 2 : std::fabs(high - static_cast<double>(x));
    // Past the largest finite bf16 by half an ulp or more, IEEE rounds to infinity.
    if ((truncated & 0x7fff) == 0x7f7f) {
        const double half_ulp_above = value(truncated) + std::copysign(std::ldexp(1.0, 127 - 7 - 1), x);
        if (std::fabs(static_cast<double>(x)) >= std::fabs(half_ulp_above)) return static_cast<uint16_t>((x < 0 ? 0xff80 : 0x7f80));
        return truncated;
    }
    if (below < above) return truncated;
    if (above < below) return next;
    return (truncated & 1) == 0 ? truncated : next;
}

TEST(Bfloat16Rounding, MatchesTheNearestEvenOracleOnRandomAndEdgeValues) {
    std::mt19937 generator(7);
    std::uniform_int_distribution<uint32_t> bits_distribution;
    std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* 1 + 2^-8: a tie, rounds to 1 */,
                                 1.01171875f /* 1 + 3·2^-8: a tie, rounds up to even */, 3.0e38f, -3.0e38f,
                                 std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                                 1.0e-39f, 65504.0f};
    for (int index = 0; index < 200000; ++index) {
        uint32_t bits = bits_distribution(generator);
        float value;
        std::memcpy(&value, &bits, 4);
        if (!std::isnan(value)) values.push_back(value);
    }
    for (float value : values) {
        ASSERT_EQ(to_bfloat16(value).bits, nearest_even_bfloat16(value)) << "x = " << value;
        // Exact values round-trip.
        EXPECT_EQ(to_bfloat16(to_float(to_bfloat16(value))).bits, to_bfloat16(value).bits);
    }
    EXPECT_EQ(to_float(to_bfloat16(1.00390625f)), 1.0f);
    EXPECT_EQ(to_float(to_bfloat16(1.01171875f)), 1.015625f);
    EXPECT_TRUE(std::isinf(to_float(to_bfloat16(std::numeric_limits<float>::max()))));
}

TEST(Bfloat16Rounding, NanStaysNanAndInfinityStaysInfinity) {
    EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
    // A NaN whose payload lives only in the low bits must not round into infinity.
    uint32_t low_payload_nan_bits = 0x7f800001u;
    float low_payload_nan;
    std::memcpy(&low_payload_nan, &low_payload_nan_bits, 4);
    EXPECT_TRUE(std::isnan(to_float(to_bfloat16(low_payload_nan))));
    EXPECT_EQ(to_float(to_bfloat16(INFINITY)), INFINITY);
    EXPECT_EQ(to_float(to_bfloat16(-INFINITY)), -INFINITY);
}

TEST(Bfloat16Rounding, UlpIsTheSpacingOfNeighbours) {
    for (float value : {1.0f, 1.5f, 3.0f, 1e-3f, 1234.5f, -7.25f}) {
        const bfloat16 rounded = to_bfloat16(value);
        const bfloat16 next{static_cast<uint16_t>(rounded.bits + 1)};
        EXPECT_EQ(std::fabs(to_float(next) - to_float(rounded)), bfloat16_ulp(to_float(rounded))) << value;
    }
}

TEST(Bfloat16Tensor, FullItemAndVectorsRoundOnce) {
    Tensor tensor = Tensor::full({3}, 1.00390625, DType::bf16, Device::cpu);
    EXPECT_EQ(tensor.nbytes(), 6u);
    EXPECT_EQ(tensor.reshape({3}).to_vector<bfloat16>()[2].bits, to_bfloat16(1.0f).bits) << "1 + 2^-8 ties to the even 1";
    EXPECT_EQ(Tensor::full({1}, 1.01171875, DType::bf16, Device::cpu).item(), 1.015625) << "1 + 3·2^-8 ties up to even";
    EXPECT_EQ(tensor.describe(), "(3) bf16 cpu");
}

TEST(Bfloat16Cast, RoundsToNearestEvenAndItsGradientConvertsBack) {
    const std::vector<float> values = {1.0f, 1.00390625f, 1.01171875f, -2.5f, 3.14159265f, 1e-20f};
    Tensor input = Tensor::from_vector<float>(values, {6}, Device::cpu);
    input.set_requires_grad(true);
    Tensor rounded = cast(input, DType::bf16);
    ASSERT_EQ(rounded.dtype(), DType::bf16);
    const std::vector<bfloat16> halves = rounded.to_vector<bfloat16>();
    for (size_t index = 0; index < values.size(); ++index) EXPECT_EQ(halves[index].bits, nearest_even_bfloat16(values[index]));
    // d sum(2 · f32(bf16(x))) / dx = 2 through both casts (exact in bf16).
    Tensor loss = multiply(sum(cast(rounded, DType::f32)), 2.0);
    backward(loss);
    for (float gradient : input.grad().to_vector<float>()) EXPECT_EQ(gradient, 2.0f);
    expect_error([&] { cast(Tensor::zeros({2}, DType::i32, Device::cpu), DType::bf16); }, {"cast", "i32", "floating"});
}

TEST(Bfloat16Autograd, ABf16LeafAccumulatesItsGradientInF32) {
    Tensor leaf = cast(Tensor::full({4}, 1.0, DType::f32, Device::cpu), DType::bf16).detach();
    leaf.set_requires_grad(true);
    ASSERT_EQ(leaf.grad().dtype(), DType::f32) << "a bf16 leaf's gradient buffer is compute_dtype(bf16)";
    // 300 backward passes of a gradient 2^-9 each: in bf16, 1 + 2^-9 rounds back to 1 once the sum reaches 1
    // (the spacing there is 2^-7); in the f32 buffer every one counts.
    for (int pass = 0; pass < 300; ++pass) {
        backward(multiply(sum(cast(leaf, DType::f32)), std::ldexp(1.0, -9)));
    }
    for (float gradient : leaf.grad().to_vector<float>()) EXPECT_EQ(gradient, 300 * std::ldexp(1.0f, -9));
}

TEST(Bfloat16Autograd, MixedAccumulateRoundsOnceIntoBf16) {
    Tensor destination = Tensor::full({2}, 1.0, DType::bf16, Device::cpu);
    Tensor source = Tensor::from_vector<float>({std::ldexp(1.0f, -9), 3 * std::ldexp(1.0f, -9)}, {2}, Device::cpu);
    accumulate_into(destination, source);
    const std::vector<bfloat16> result = destination.to_vector<bfloat16>();
    EXPECT_EQ(to_float(result[0]), 1.0f);        // 1 + 2^-9: below half the spacing (2^-7) at 1
    EXPECT_EQ(to_float(result[1]), 1.0078125f);  // 1 + 3·2^-9: above half of it, so up to 1 + 2^-7
    Tensor wide = Tensor::full({1}, 1.0, DType::f32, Device::cpu);
    accumulate_into(wide, Tensor::full({1}, 0.5, DType::bf16, Device::cpu), 3.0);
    EXPECT_EQ(wide.item(), 2.5);
    expect_error([&] { accumulate_into(Tensor::zeros({2}, DType::f64, Device::cpu), source); }, {"accumulate", "dtype"});
}

nn::GPTConfig tiny_config() { return {32, 8, 2, 2, 16, 0.0f}; }

TEST(Bfloat16WorkingCopies, AreTheRoundedMastersAndShareTheirGradientBuffers) {
    nn::GPT reference(tiny_config(), 3, Device::cpu, DType::f32);
    nn::GPT model(tiny_config(), 3, Device::cpu, DType::bf16);
    EXPECT_EQ(model.dtype(), DType::bf16);
    const auto masters = model.named_parameters();
    const auto reference_parameters = reference.named_parameters();
    ASSERT_EQ(masters.size(), reference_parameters.size());
    for (size_t index = 0; index < masters.size(); ++index) {
        const Tensor& master = masters[index].second;
        ASSERT_EQ(master.dtype(), DType::f32) << masters[index].first << ": masters stay f32";
        EXPECT_EQ(master.to_vector<float>(), reference_parameters[index].second.to_vector<float>())
            << "masters initialise exactly as the f32 model's";
    }
    const Tensor& weight = model.h[0]->attn.c_attn.weight;
    const Tensor& working = model.h[0]->attn.c_attn.working(weight);
    ASSERT_EQ(working.dtype(), DType::bf16);
    ASSERT_EQ(working.shape(), weight.shape());
    EXPECT_EQ(working.grad().raw_data(), weight.grad().raw_data()) << "one f32 gradient buffer";
    const std::vector<float> master_values = weight.to_vector<float>();
    const std::vector<bfloat16> working_values = working.to_vector<bfloat16>();
    for (size_t index = 0; index < master_values.size(); ++index)
        ASSERT_EQ(working_values[index].bits, nearest_even_bfloat16(master_values[index]));

    // The padded token table: the LM head's (Vp,C) working view holds zero rows past the vocabulary.
    const Tensor& padded = model.wte.working(model.wte.padded_weight);
    ASSERT_EQ(padded.shape(), model.wte.padded_weight.shape());
    ASSERT_EQ(padded.dtype(), DType::bf16);
    const std::vector<bfloat16> padded_values = padded.to_vector<bfloat16>();
    for (size_t index = tiny_config().vocab_size * 16u; index < padded_values.size(); ++index)
        ASSERT_EQ(padded_values[index].bits, 0);

    // A write to the masters reaches the copies at refresh, not before.
    Tensor master = weight;
    master.copy_from(Tensor::full(weight.shape(), 0.1, DType::f32, Device::cpu));
    EXPECT_NE(to_float(working.to_vector<bfloat16>()[0]), to_float(to_bfloat16(0.1f)));
    model.refresh_working_copies();
    EXPECT_EQ(working.to_vector<bfloat16>()[0].bits, to_bfloat16(0.1f).bits);

    model.set_compute_dtype(DType::f32);
    EXPECT_EQ(model.dtype(), DType::f32);
    EXPECT_EQ(model.h[0]->attn.c_attn.working(weight).raw_data(), weight.raw_data()) << "f32: no copies";
}

TEST(Bfloat16WorkingCopies, NeedF32Masters) {
    nn::GPT model(tiny_config(), 3, Device::cpu, DType::f64);
    expect_error([&] { model.set_compute_dtype(DType::bf16); }, {"f64", "bf16 over f32 masters"});
    EXPECT_EQ(model.dtype(), DType::f64);
    expect_error([&] { model.set_compute_dtype(DType::i32); }, {"set_compute_dtype", "i32"});
}

TEST(Bfloat16Safetensors, SavesMastersExactlyOrRoundedToBf16OnRequest) {
    nn::GPT model(tiny_config(), 5, Device::cpu, DType::bf16);
    const std::string exact = ::testing::TempDir() + "bf16_masters.safetensors";
    const std::string rounded = ::testing::TempDir() + "bf16_rounded.safetensors";
    nn::save_safetensors(model, exact);
    nn::save_safetensors(model, rounded, DType::bf16);
    EXPECT_EQ(nn::read_safetensors_header(exact).entries.front().dtype, "F32");
    EXPECT_EQ(nn::read_safetensors_header(rounded).entries.front().dtype, "BF16");

    nn::GPT from_exact(tiny_config(), 9, Device::cpu, DType::f32);
    nn::GPT from_rounded(tiny_config(), 9, Device::cpu, DType::bf16);
    nn::load_safetensors_into(from_exact, exact);
    nn::load_safetensors_into(from_rounded, rounded);
    const auto original = model.named_parameters();
    const auto exact_parameters = from_exact.named_parameters();
    const auto rounded_parameters = from_rounded.named_parameters();
    for (size_t index = 0; index < original.size(); ++index) {
        const std::vector<float> values = original[index].second.to_vector<float>();
        EXPECT_EQ(exact_parameters[index].second.to_vector<float>(), values) << original[index].first;
        const std::vector<float> loaded = rounded_parameters[index].second.to_vector<float>();
        for (size_t element = 0; element < values.size(); ++element)
            ASSERT_EQ(to_bfloat16(loaded[element]).bits, nearest_even_bfloat16(values[element]));
    }
    // Loading refreshed the working copies of the bf16 model.
    const Tensor& weight = from_rounded.h[1]->mlp.c_fc.weight;
    EXPECT_EQ(from_rounded.h[1]->mlp.c_fc.working(weight).to_vector<bfloat16>()[3].bits,
              to_bfloat16(weight.to_vector<float>()[3]).bits);
}

} // namespace
} // namespace engine::testing
