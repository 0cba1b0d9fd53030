// Grouped-query attention (attention(qkv, NH, KVH)) on the CPU: float64 finite differences, an independent value
// oracle (multi-head attention on a qkv whose K/V heads are repeated explicitly, as Hugging Face's repeat_kv),
// and the bad-input errors.
#include <cstdio>

#include "expect_error.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

struct GqaShape {
    int batch, time, heads, kv_heads, head_size;
    int64_t width() const { return int64_t(heads + 2 * kv_heads) * head_size; } // of a packed qkv row
};

std::string describe(const GqaShape& shape) {
    return " B=" + std::to_string(shape.batch) + " T=" + std::to_string(shape.time) + " NH=" +
           std::to_string(shape.heads) + " KVH=" + std::to_string(shape.kv_heads) + " D=" +
           std::to_string(shape.head_size);
}

class GqaAttention : public TapeTest {};

// Finite differences (gradcheck.h's 1e-6 relative, the op gradchecks' tolerance) through the whole qkv:
// groups of 2 and 6 query heads, and KVH == NH (plain multi-head through the new overload).
TEST_F(GqaAttention, GradcheckFloat64) {
    for (const GqaShape shape : {GqaShape{2, 7, 4, 2, 3}, GqaShape{1, 6, 6, 1, 2}, GqaShape{2, 5, 3, 3, 4}}) {
        Tensor qkv = random_leaf(generator, {shape.batch, shape.time, shape.width()});
        Tensor weights = random_tensor(generator, {int64_t(shape.batch) * shape.time * shape.heads * shape.head_size});
        auto result = gradcheck(
            [&] { return weighted_sum(attention(qkv, shape.heads, shape.kv_heads), weights); }, {qkv});
        EXPECT_LE(result.max_relative_error, 1e-6) << "worst: " << result.worst << describe(shape);
        std::printf("[ measured ] gradcheck%s: max relative error %.3g\n", describe(shape).c_str(),
                    result.max_relative_error);
    }
}

// qkv (B,T,(NH+2*KVH)*D) -> (B,T,3*NH*D) with kv head h / G copied into the place of query head h's key and value.
std::vector<double> repeat_kv(const std::vector<double>& packed, const GqaShape& shape) {
    const int group = shape.heads / shape.kv_heads, D = shape.head_size, C = shape.heads * D;
    const int64_t width = shape.width(), kv_width = int64_t(shape.kv_heads) * D;
    std::vector<double> repeated(size_t(shape.batch) * shape.time * 3 * C);
    for (int64_t token = 0; token < int64_t(shape.batch) * shape.time; ++token) {
        const double* from = packed.data() + token * width;
        double* to = repeated.data() + token * 3 * C;
        for (int h = 0; h < shape.heads; ++h) {
            for (int d = 0; d < D; ++d) {
                to[h * D + d] = from[h * D + d];
                to[C + h * D + d] = from[C + (h / group) * D + d];
                to[2 * C + h * D + d] = from[C + kv_width + (h / group) * D + d];
            }
        }
    }
    return repeated;
}

// dqkv of the repeated layout folded back: dQ as is, dK and dV of kv head j = the sum over its query heads
// j*G .. j*G+G-1 in ascending order (the chain rule through the copy).
std::vector<double> fold_repeated_gradient(const std::vector<double>& repeated, const GqaShape& shape) {
    const int group = shape.heads / shape.kv_heads, D = shape.head_size, C = shape.heads * D;
    const int64_t width = shape.width(), kv_width = int64_t(shape.kv_heads) * D;
    std::vector<double> folded(size_t(shape.batch) * shape.time * width, 0.0);
    for (int64_t token = 0; token < int64_t(shape.batch) * shape.time; ++token) {
        const double* from = repeated.data() + token * 3 * C;
        double* to = folded.data() + token * width;
        for (int h = 0; h < shape.heads; ++h) {
            for (int d = 0; d < D; ++d) {
                to[h * D + d] = from[h * D + d];
                to[C + (h / group) * D + d] += from[C + h * D + d];
                to[C + kv_width + (h / group) * D + d] += from[2 * C + h * D + d];
            }
        }
    }
    return folded;
}

// A tensor's elements widened to double, f32 or f64.
std::vector<double> widened(const Tensor& tensor) {
    if (tensor.dtype() == DType::f64) return tensor.to_vector<double>();
    const std::vector<float> values = tensor.to_vector<float>();
    return std::vector<double>(values.begin(), values.end());
}

struct Errors {
    double out = 0.0, dqkv = 0.0; // largest |a - b| / (1 + |b|)
};

// Runs GQA and multi-head attention on the repeated qkv in `dtype`, both backward through the same weighted sum.
Errors compare_with_repeated(std::mt19937_64& generator, const GqaShape& shape, DType dtype) {
    const Shape packed_shape{shape.batch, shape.time, shape.width()};
    const std::vector<double> packed = random_tensor(generator, packed_shape).to_vector<double>();
    const int64_t outputs = int64_t(shape.batch) * shape.time * shape.heads * shape.head_size;
    const Tensor weights = random_tensor(generator, {outputs}, dtype);
    auto leaf = [&](const std::vector<double>& values, const Shape& tensor_shape) {
        Tensor tensor = Tensor::from_vector<double>(values, tensor_shape, Device::cpu);
        if (dtype != DType::f64) tensor = Tensor::from_vector<float>(std::vector<float>(values.begin(), values.end()),
                                                                       tensor_shape, Device::cpu);
        tensor.set_requires_grad(true);
        return tensor;
    };
    Tensor grouped = leaf(packed, packed_shape);
    Tensor repeated = leaf(repeat_kv(packed, shape), {shape.batch, shape.time, 3 * shape.heads * shape.head_size});
    // One graph at a time: backward releases the tape it walked.
    const Tensor grouped_out = attention(grouped, shape.heads, shape.kv_heads);
    backward(weighted_sum(grouped_out, weights));
    const Tensor repeated_out = attention(repeated, shape.heads);
    backward(weighted_sum(repeated_out, weights));

    Errors errors;
    const auto relative = [](double a, double b) { return std::fabs(a - b) / (1.0 + std::fabs(b)); };
    const std::vector<double> out_a = widened(grouped_out), out_b = widened(repeated_out);
    for (size_t i = 0; i < out_a.size(); ++i) errors.out = std::max(errors.out, relative(out_a[i], out_b[i]));
    const std::vector<double> dqkv = widened(grouped.grad());
    const std::vector<double> folded = fold_repeated_gradient(widened(repeated.grad()), shape);
    for (size_t i = 0; i < dqkv.size(); ++i) errors.dqkv = std::max(errors.dqkv, relative(dqkv[i], folded[i]));
    return errors;
}

const GqaShape oracle_shapes[] = {{2, 9, 4, 2, 5}, {1, 11, 6, 1, 4}, {2, 6, 6, 3, 3}, {1, 8, 3, 3, 4}};

// float64: the forward reads the same numbers in the same order as multi-head attention on the repeated qkv, so
// it is bitwise equal; dQ likewise. dK/dV differ only in association: the GQA kernel adds every query head's
// terms into one accumulator, the fold adds per-head sums. With at most G*T = 66 terms of size <= ~10 the
// difference is below 66 * 2^-53 * 10 ~ 1e-13: bound 1e-12 relative to 1 + |value|.
TEST_F(GqaAttention, EqualsMultiHeadOnRepeatedKeysAndValuesFloat64) {
    for (const GqaShape& shape : oracle_shapes) {
        const Errors errors = compare_with_repeated(generator, shape, DType::f64);
        EXPECT_EQ(errors.out, 0.0) << describe(shape);
        EXPECT_LE(errors.dqkv, 1e-12) << describe(shape);
        std::printf("[ measured ] f64%s: out %.3g, dqkv %.3g\n", describe(shape).c_str(), errors.out, errors.dqkv);
    }
}

// float32: the forward makes the same sgemm calls on the same numbers (only the leading dimensions differ), so it
// is again bitwise equal. The backward adds one product per (query head, panel) into dK/dV (cpu_kernels.h), where
// the repeated multi-head layout keeps per-head sums: G*T terms of size <= ~10, each sum off by at most (G*T)·2^-24 of the sum of magnitudes,
// 66 · 6e-8 · 10 ~ 4e-5 in the worst case; bound 1e-4 relative to 1 + |value|.
TEST_F(GqaAttention, EqualsMultiHeadOnRepeatedKeysAndValuesFloat32) {
    for (const GqaShape& shape : oracle_shapes) {
        const Errors errors = compare_with_repeated(generator, shape, DType::f32);
        EXPECT_EQ(errors.out, 0.0) << describe(shape);
        EXPECT_LE(errors.dqkv, 1e-4) << describe(shape);
        std::printf("[ measured ] f32%s: out %.3g, dqkv %.3g\n", describe(shape).c_str(), errors.out, errors.dqkv);
    }
}

// attention(qkv, NH) is attention(qkv, NH, NH), bit for bit.
TEST_F(GqaAttention, MultiHeadOverloadIsKvHeadsEqualHeads) {
    const Tensor qkv = random_tensor(generator, {2, 5, 3 * 12});
    EXPECT_EQ(attention(qkv, 3).to_vector<double>(), attention(qkv, 3, 3).to_vector<double>());
}

TEST_F(GqaAttention, RejectsKvHeadsNotDividingHeads) {
    const Tensor qkv = random_tensor(generator, {1, 3, 40}); // (4 + 2*3) heads of 4
    expect_error([&] { attention(qkv, 4, 3); }, {"attention", "(1,3,40)", "num_heads=4", "num_kv_heads=3"});
    expect_error([&] { attention(qkv, 4, 0); }, {"attention", "(1,3,40)", "num_heads=4", "num_kv_heads=0"});
    expect_error([&] { attention(qkv, 2, 4); }, {"attention", "(1,3,40)", "num_heads=2", "num_kv_heads=4"});
}

TEST_F(GqaAttention, RejectsAWidthThatIsNotWholeHeads) {
    const Tensor qkv = random_tensor(generator, {1, 3, 26}); // not a multiple of 4 + 2*2 = 8 heads
    expect_error([&] { attention(qkv, 4, 2); }, {"attention", "(1,3,26)", "num_heads=4", "num_kv_heads=2", "width 26"});
    const Tensor flat = random_tensor(generator, {3, 24});
    expect_error([&] { attention(flat, 4, 2); }, {"attention", "(3,24)"});
}

} // namespace
} // namespace engine::testing
