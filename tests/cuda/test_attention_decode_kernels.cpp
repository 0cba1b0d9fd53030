// The decode kernel (kernels/cuda/attention_decode.cu) against its CPU twin (odd sizes, several past lengths,
// every per-lane width, f32 and bf16), and cached decoding of a GPT on Device::cuda against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "engine/autograd.h"
#include "kernels/cpu/decode_kernels.h"
#include "kernels/cuda/decode_kernels.h"
#include "nn/generation.h"
#include "tests/cuda/compare.h"
#include "tests/cuda/cuda_test.h"

namespace engine::test {
namespace {

struct DecodeShape {
    int B, Tnew, past, max_T, C, NH;
};

class AttentionDecodeKernelTest : public CudaKernelTest {};

// f32 computes each score by per-lane sums and a shuffle tree, the CPU in double: with |q|,|k|,|v| <= 1 a
// score of HS terms is within (HS+2)·u·sqrt(HS) (scale 1/sqrt(HS) applied), which moves every probability by
// at most twice that, relatively, and the output (a convex combination of v) by as much; the sums over keys
// and the online rescaling add 4(keys+2)·u.
double decode_bound(const DecodeShape& shape) {
    const double u = 0x1.0p-24, head_size = shape.C / shape.NH, keys = shape.past + shape.Tnew;
    return 2.0 * (head_size + 2.0) * u * std::sqrt(head_size) + 4.0 * (keys + 2.0) * u;
}

// Caches hold random keys and values before `past`, NaN from past+Tnew on (never to be read: causal).
template <typename T>
void check_against_cpu(AttentionDecodeKernelTest& test, const DecodeShape& shape) {
    const int head_size = shape.C / shape.NH;
    const size_t cache_count = size_t(shape.B) * shape.NH * shape.max_T * head_size;
    std::vector<float> qkv = test.random_floats(size_t(shape.B) * shape.Tnew * 3 * shape.C);
    std::vector<float> keys = test.random_floats(cache_count), values = test.random_floats(cache_count);
    for (size_t index = 0; index < cache_count; ++index)
        if (static_cast<int>((index / head_size) % shape.max_T) >= shape.past + shape.Tnew)
            keys[index] = values[index] = std::nanf("");
    auto as_storage = [](const std::vector<float>& floats) {
        std::vector<T> stored(floats.size());
        for (size_t index = 0; index < floats.size(); ++index) stored[index] = narrow<T>(floats[index]);
        return stored;
    };
    std::vector<T> host_qkv = as_storage(qkv), host_keys = as_storage(keys), host_values = as_storage(values);
    std::vector<T> host_out = as_storage(nan_filled(size_t(shape.B) * shape.Tnew * shape.C));

    DeviceBuffer<T> device_qkv(host_qkv), device_keys(host_keys), device_values(host_values), device_out(host_out);
    kernels::cuda::attention_decode(device_out.get(), device_keys.get(), device_values.get(), device_qkv.get(), shape.B,
                                    shape.Tnew, shape.past, shape.max_T, shape.C, shape.NH, test.stream);
    kernels::cpu::attention_decode<T>(host_out.data(), host_keys.data(), host_values.data(), host_qkv.data(), shape.B,
                                      shape.Tnew, shape.past, shape.max_T, shape.C, shape.NH);

    auto widened = [](const std::vector<T>& stored) {
        std::vector<float> floats(stored.size());
        for (size_t index = 0; index < stored.size(); ++index) floats[index] = widen(stored[index]);
        return floats;
    };
    // The appended caches are copies: bitwise (NaN where untouched on both sides, compared as bits).
    auto bits_equal = [&](const std::vector<T>& a, const std::vector<T>& b) {
        return std::equal(a.begin(), a.end(), b.begin(),
                          [](T x, T y) { return std::memcmp(&x, &y, sizeof(T)) == 0; });
    };
    EXPECT_TRUE(bits_equal(device_keys.to_host(), host_keys)) << "key cache";
    EXPECT_TRUE(bits_equal(device_values.to_host(), host_values)) << "value cache";
    // bf16: both round once on store, so they may differ by one bf16 step (2^-7 relative at most).
    const Tolerance tolerance{decode_bound(shape), std::is_same_v<T, bfloat16> ? 0x1.0p-7 : 0.0};
    const ::testing::AssertionResult close =
        all_close(widened(device_out.to_host()), widened(host_out), tolerance, "attention_decode out");
    std::cout << close.message() << "\n";
    EXPECT_TRUE(close);
}

const std::vector<DecodeShape> shapes = {
    {1, 1, 0, 5, 8, 1},     // one key, head size 8
    {2, 1, 7, 13, 24, 3},   // a decode step after 7, HS 8
    {3, 4, 5, 17, 66, 2},   // four new positions over 5, HS 33: two dimensions per lane, the second partial
    {2, 2, 9, 12, 96, 1},   // HS 96: four per lane
    {1, 3, 40, 50, 200, 1}, // HS 200: eight per lane, the last partial
    {2, 5, 0, 5, 20, 4},    // prefill filling the cache exactly, HS 5
};

TEST_F(AttentionDecodeKernelTest, Float32MatchesCpu) {
    for (const DecodeShape& shape : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << shape.B << " Tnew " << shape.Tnew << " past " << shape.past
                                          << " max_T " << shape.max_T << " C " << shape.C << " NH " << shape.NH);
        check_against_cpu<float>(*this, shape);
    }
}

TEST_F(AttentionDecodeKernelTest, Bfloat16MatchesCpu) {
    for (const DecodeShape& shape : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << shape.B << " Tnew " << shape.Tnew << " past " << shape.past);
        check_against_cpu<bfloat16>(*this, shape);
    }
}

TEST_F(AttentionDecodeKernelTest, RejectsOversizedHeadsAndPositions) {
    DeviceBuffer<float> buffer(16);
    float* any = buffer.get(); // never written: the launcher throws first
    EXPECT_THROW(kernels::cuda::attention_decode(any, any, any, any, 1, 1, 0, 1, 514, 2, stream), EngineError); // HS 257
    EXPECT_THROW(kernels::cuda::attention_decode(any, any, any, any, 1, 2, 3, 4, 8, 1, stream), EngineError); // [3,5) > 4
}

std::vector<double> host_doubles(const Tensor& tensor) {
    return cast(tensor.to(Device::cpu), DType::f64).to_vector<double>();
}

// Cached decoding on the device against the CPU, same weights (the initialisation is drawn on the host): the
// GEMMs and the attention sum in other orders, each dot of at most 4C terms within 4C·u of Σ|a·b|, over
// L + 1 GEMM stages with a gain of at most 100 after each (LayerNorm's 1/σ at GPT-2's init), relative to the
// logits' scale.
TEST_F(AttentionDecodeKernelTest, CachedGptOnCudaMatchesCpu) {
    const nn::GPTConfig config{70, 20, 2, 2, 48, 0.0f}; // 70 -> 128 padded rows; HS 24
    const nn::GPT cpu_model(config, 21, Device::cpu), cuda_model(config, 21, Device::cuda);
    const std::vector<int32_t> ids = random_ints(2 * 12, 0, 69);
    nn::KVCache cpu_cache(cpu_model, 2), cuda_cache(cuda_model, 2);
    double max_error = 0.0;
    for (int start = 0; start < 12;) {
        const int count = start == 0 ? 5 : 1; // prefill 5, then one position at a time
        std::vector<int32_t> step;
        for (int b = 0; b < 2; ++b)
            for (int t = start; t < start + count; ++t) step.push_back(ids[size_t(b * 12 + t)]);
        const Tensor tokens = Tensor::from_vector<int32_t>(step, {2, count}, Device::cpu);
        const std::vector<double> expected = host_doubles(nn::forward_cached(cpu_model, tokens, cpu_cache));
        const std::vector<double> actual = host_doubles(nn::forward_cached(cuda_model, tokens, cuda_cache));
        double logit_scale = 0.0;
        for (double value : expected) logit_scale = std::max(logit_scale, std::fabs(value));
        const double bound = (config.n_layer + 1) * 4.0 * config.n_embd * 0x1.0p-24 * 100.0 * logit_scale;
        const std::string what = "logits from position " + std::to_string(start);
        ASSERT_TRUE(all_close(actual, expected, Tolerance{bound, 0.0}, what));
        for (size_t index = 0; index < actual.size(); ++index)
            max_error = std::max(max_error, std::fabs(actual[index] - expected[index]));
        start += count;
    }
    std::cout << "cuda vs cpu cached logits: max |error| " << max_error << "\n";

    nn::SamplingOptions sampling;
    sampling.temperature = 0.9;
    sampling.top_k = 10;
    sampling.seed = 5;
    const std::vector<int32_t> prompt{3, 14, 15};
    EXPECT_EQ(nn::generate(cuda_model, prompt, 15, sampling), nn::generate(cpu_model, prompt, 15, sampling));
}

} // namespace
} // namespace engine::test
