// NF4 (kernels/cpu/nf4.cpp) against bitsandbytes bit for bit: the code table and thresholds, the dynamic 8-bit map,
// the codes and absmax scales of a weight, its double-quantised scales and both dequantisations, from
// tests/data/nf4_golden.safetensors (tests/golden/make_nf4_golden.py); then the error bound the layout promises.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/nf4_kernels.h"
#include "nn/io/safetensors.h"

namespace engine::testing {
namespace {

namespace cpu = engine::kernels::cpu;

// One tensor of the golden file as raw little-endian elements (U8, F32 and BF16 alike).
template <typename T>
std::vector<T> golden(const std::string& name) {
    static const std::string path = std::string(ENGINE_TEST_DATA_DIR) + "/nf4_golden.safetensors";
    static const nn::SafetensorsHeader header = nn::read_safetensors_header(path);
    const nn::SafetensorsEntry* entry = header.find(name);
    EXPECT_NE(entry, nullptr) << name;
    if (entry == nullptr) return {};
    std::vector<T> values(static_cast<size_t>(entry->end - entry->begin) / sizeof(T));
    std::ifstream file(path, std::ios::binary);
    file.seekg(header.data_start + entry->begin);
    file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
    return values;
}

// Bitwise, so that -0 and 0 differ and NaN would fail.
template <typename T>
void expect_bits(const std::vector<T>& actual, const std::vector<T>& expected, const std::string& what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    size_t differing = 0, first = 0;
    for (size_t i = 0; i < actual.size(); ++i)
        if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0 && differing++ == 0) first = i;
    EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << actual.size() << " differ, the first at " << first;
}

TEST(Nf4, TablesAreBitsandbytes) {
    expect_bits(std::vector<float>(cpu::nf4_values.begin(), cpu::nf4_values.end()), golden<float>("nf4_code"), "NF4 values");
    expect_bits(std::vector<float>(cpu::nf4_thresholds().begin(), cpu::nf4_thresholds().end()), golden<float>("thresholds"),
                "dQuantizeNF4's thresholds");
    expect_bits(std::vector<float>(cpu::dynamic_map().begin(), cpu::dynamic_map().end()), golden<float>("dynamic_map"),
                "create_dynamic_map(signed=True) as the CPU quantiser holds it");
}

// The weight's codes and scales, the double quantisation and both dequantisations: every bit bitsandbytes'.
TEST(Nf4, QuantisationAndDequantisationAreBitsandbytesBitForBit) {
    const std::vector<float> input = golden<float>("input");
    const int64_t n = static_cast<int64_t>(input.size()), blocks = (n + cpu::nf4_block - 1) / cpu::nf4_block;
    ASSERT_EQ(n % cpu::nf4_block, 37) << "the golden weight ends with a partial block";
    std::vector<uint8_t> codes(static_cast<size_t>((n + 1) / 2));
    std::vector<float> absmax(static_cast<size_t>(blocks));
    cpu::nf4_quantize(codes.data(), absmax.data(), input.data(), n);
    expect_bits(codes, golden<uint8_t>("codes"), "codes");
    expect_bits(absmax, golden<float>("absmax"), "absmax");

    const int64_t groups = (blocks + cpu::nf4_scale_block - 1) / cpu::nf4_scale_block;
    std::vector<uint8_t> scale_codes(static_cast<size_t>(blocks));
    std::vector<float> scale_absmax(static_cast<size_t>(groups));
    float offset = 0.0f;
    cpu::nf4_quantize_scales(scale_codes.data(), scale_absmax.data(), &offset, absmax.data(), blocks);
    expect_bits(std::vector<float>{offset}, golden<float>("offset"), "offset (the scales' mean)");
    expect_bits(scale_codes, golden<uint8_t>("scale_codes"), "the scales' 8-bit codes");
    expect_bits(scale_absmax, golden<float>("scale_absmax"), "the scales' absmax");

    std::vector<float> restored(static_cast<size_t>(blocks));
    const std::vector<float> golden_offset = golden<float>("offset");
    cpu::nf4_dequantize_scales(restored.data(), golden<uint8_t>("scale_codes").data(), golden<float>("scale_absmax").data(),
                               golden_offset.front(), blocks);
    expect_bits(restored, golden<float>("absmax_dequantized"), "dequantised scales");

    std::vector<float> dequantized(input.size());
    cpu::nf4_dequantize(dequantized.data(), codes.data(), restored.data(), n);
    expect_bits(dequantized, golden<float>("dequantized"), "dequantised f32");
    std::vector<bfloat16> dequantized_bf16(input.size());
    cpu::nf4_dequantize(dequantized_bf16.data(), codes.data(), restored.data(), n);
    expect_bits(dequantized_bf16, golden<bfloat16>("dequantized_bf16"), "dequantised bf16");
}

// The error NF4 promises: a value's normalised error is at most half the widest gap between neighbouring codes
// (between -1 and -0.6961928: 0.1519), times its block's absmax; the double-quantised absmax adds its own error
// times |code| <= 1. Every element of the golden weight keeps within that (and an f32 rounding).
TEST(Nf4, ErrorIsWithinHalfTheWidestGapOfItsBlock) {
    const std::vector<float> input = golden<float>("input"), dequantized = golden<float>("dequantized");
    const std::vector<float> absmax = golden<float>("absmax"), restored = golden<float>("absmax_dequantized");
    double half_gap = 0.0;
    for (size_t i = 0; i + 1 < cpu::nf4_values.size(); ++i)
        half_gap = std::max(half_gap, (double(cpu::nf4_values[i + 1]) - cpu::nf4_values[i]) / 2.0);
    EXPECT_NEAR(half_gap, 0.15190, 1e-5);
    double worst = 0.0; // the largest error as a share of its bound
    for (size_t i = 0; i < input.size(); ++i) {
        const size_t block = i / cpu::nf4_block;
        const double bound = half_gap * absmax[block] + std::fabs(double(restored[block]) - absmax[block]) +
                             1e-6 * std::fabs(double(restored[block]));
        const double error = std::fabs(double(dequantized[i]) - input[i]);
        EXPECT_LE(error, bound) << "element " << i;
        if (bound > 0) worst = std::max(worst, error / bound);
    }
    std::printf("  NF4 errors reach %.3f of their bound\n", worst);
}

} // namespace
} // namespace engine::testing
