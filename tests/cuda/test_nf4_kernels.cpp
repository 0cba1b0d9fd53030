// The NF4 CUDA kernels (kernels/cuda/nf4.cu) against their CPU twins (kernels/cpu/nf4.cpp, themselves held to
// bitsandbytes' bits by tests/test_nf4.cpp): bitwise, since both sides round each product and sum once, in the same
// order (no FMA), with the same tables. Sizes with a partial last block and an odd count, an all-zero block, and
// outputs one element past an aligned address (the scalar path) as well as aligned (the 16-byte stores).
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/nf4_kernels.h"
#include "kernels/cuda/nf4_kernels.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

namespace cpu = engine::kernels::cpu;
namespace gpu = engine::kernels::cuda;

using Nf4KernelTest = CudaKernelTest;

template <typename T>
void expect_bits(const std::vector<T>& actual, const std::vector<T>& expected, const std::string& what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    size_t differing = 0;
    for (size_t i = 0; i < actual.size(); ++i) differing += std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0;
    EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << actual.size() << " differ";
}

// Values whose blocks span scales over five decades, with block 3 all zero.
std::vector<float> weight(Nf4KernelTest& test, int64_t n) {
    std::vector<float> values = test.random_floats(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] *= std::pow(10.0f, static_cast<float>((i / 64) % 5) - 2.0f);
    for (int64_t i = 3 * 64; i < std::min<int64_t>(n, 4 * 64); ++i) values[static_cast<size_t>(i)] = 0.0f;
    return values;
}

template <typename S>
void check_dequantize(Nf4KernelTest& test, int64_t n, size_t shift) {
    const std::vector<float> values = weight(test, n);
    const int64_t blocks = (n + cpu::nf4_block - 1) / cpu::nf4_block;
    std::vector<uint8_t> codes(static_cast<size_t>((n + 1) / 2));
    std::vector<float> absmax(static_cast<size_t>(blocks));
    cpu::nf4_quantize(codes.data(), absmax.data(), values.data(), n);
    std::vector<S> expected(static_cast<size_t>(n));
    cpu::nf4_dequantize(expected.data(), codes.data(), absmax.data(), n);
    // `shift` elements in: the output pointer is off the 16-byte alignment for shift 1.
    DeviceBuffer<S> out(std::vector<S>(static_cast<size_t>(n) + shift));
    DeviceBuffer<uint8_t> codes_device(codes);
    DeviceBuffer<float> absmax_device(absmax);
    gpu::nf4_dequantize(out.get() + shift, codes_device.get(), absmax_device.get(), n, test.stream);
    std::vector<S> actual = out.to_host();
    actual.erase(actual.begin(), actual.begin() + static_cast<std::ptrdiff_t>(shift));
    expect_bits(actual, expected, "nf4_dequantize n=" + std::to_string(n) + " shift=" + std::to_string(shift));
}

TEST_F(Nf4KernelTest, QuantiseMatchesTheCpuBitwise) {
    for (const int64_t n : {int64_t(1), int64_t(63), int64_t(64 * 37 + 19), int64_t(64 * 300)}) {
        const std::vector<float> values = weight(*this, n);
        const int64_t blocks = (n + cpu::nf4_block - 1) / cpu::nf4_block;
        std::vector<uint8_t> codes(static_cast<size_t>((n + 1) / 2));
        std::vector<float> absmax(static_cast<size_t>(blocks));
        cpu::nf4_quantize(codes.data(), absmax.data(), values.data(), n);
        DeviceBuffer<uint8_t> codes_device(std::vector<uint8_t>(codes.size(), 0xAB));
        DeviceBuffer<float> absmax_device(nan_filled(absmax.size()));
        DeviceBuffer<float> values_device(values);
        gpu::nf4_quantize(codes_device.get(), absmax_device.get(), values_device.get(), n, stream);
        expect_bits(codes_device.to_host(), codes, "codes n=" + std::to_string(n));
        expect_bits(absmax_device.to_host(), absmax, "absmax n=" + std::to_string(n));
    }
}

TEST_F(Nf4KernelTest, DequantiseMatchesTheCpuBitwise) {
    for (const int64_t n : {int64_t(1), int64_t(7), int64_t(64 * 37 + 19), int64_t(64 * 300)})
        for (const size_t shift : {size_t(0), size_t(1)}) {
            check_dequantize<float>(*this, n, shift);
            check_dequantize<bfloat16>(*this, n, shift);
        }
}

TEST_F(Nf4KernelTest, DequantiseScalesMatchesTheCpuBitwise) {
    const int64_t blocks = 256 * 2 + 77;
    std::vector<float> absmax = random_floats(static_cast<size_t>(blocks), 1e-3f, 2.0f);
    std::vector<uint8_t> scale_codes(absmax.size());
    std::vector<float> scale_absmax(3);
    float offset = 0.0f;
    cpu::nf4_quantize_scales(scale_codes.data(), scale_absmax.data(), &offset, absmax.data(), blocks);
    std::vector<float> expected(absmax.size());
    cpu::nf4_dequantize_scales(expected.data(), scale_codes.data(), scale_absmax.data(), offset, blocks);
    DeviceBuffer<float> restored(nan_filled(absmax.size()));
    DeviceBuffer<uint8_t> codes_device(scale_codes);
    DeviceBuffer<float> scale_absmax_device(scale_absmax);
    gpu::nf4_dequantize_scales(restored.get(), codes_device.get(), scale_absmax_device.get(), offset, blocks, stream);
    expect_bits(restored.to_host(), expected, "nf4_dequantize_scales");
}

} // namespace
} // namespace engine::test
