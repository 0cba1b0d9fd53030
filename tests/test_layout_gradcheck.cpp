// The layout ops (engine/ops/layout.h): values against independent index arithmetic, backward against central
// finite differences in float64 (max relative error 1e-6, as tests/test_ops_gradcheck.cpp), and bad input.
#include <algorithm>
#include <numeric>

#include "expect_error.h"
#include "gradcheck.h"

namespace engine::testing {
namespace {

class LayoutGradcheck : public TapeTest {};

// Row-major strides of a shape.
std::vector<int64_t> strides_of(const Shape& shape) {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int64_t axis = static_cast<int64_t>(shape.size()) - 2; axis >= 0; --axis)
        strides[size_t(axis)] = strides[size_t(axis + 1)] * shape[size_t(axis + 1)];
    return strides;
}

// The multi-index of flat position `flat` in `shape`.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
    std::vector<int64_t> index(shape.size());
    for (int64_t axis = static_cast<int64_t>(shape.size()) - 1; axis >= 0; --axis) {
        index[size_t(axis)] = flat % shape[size_t(axis)];
        flat /= shape[size_t(axis)];
    }
    return index;
}

Tensor weights_for(std::mt19937_64& generator, const Tensor& out) { return random_tensor(generator, {out.numel()}); }

// ---- permute / transpose ----

// Walks the input (not the output, as the kernels do) and places each element by out's strides.
std::vector<double> permuted_reference(const Tensor& input, const std::vector<int64_t>& dims) {
    const Shape& shape = input.shape();
    Shape out_shape(shape.size());
    for (size_t axis = 0; axis < dims.size(); ++axis) out_shape[axis] = shape[size_t(dims[axis])];
    const std::vector<int64_t> out_strides = strides_of(out_shape);
    const std::vector<double> values = input.to_vector<double>();
    std::vector<double> expected(values.size());
    for (int64_t flat = 0; flat < input.numel(); ++flat) {
        const std::vector<int64_t> index = unravel(flat, shape);
        int64_t out_flat = 0;
        for (size_t axis = 0; axis < dims.size(); ++axis) out_flat += index[size_t(dims[axis])] * out_strides[axis];
        expected[size_t(out_flat)] = values[size_t(flat)];
    }
    return expected;
}

TEST_F(LayoutGradcheck, PermuteEveryOrderOfA4DTensor) {
    Tensor input = random_leaf(generator, {2, 3, 4, 5});
    std::vector<int64_t> dims = {0, 1, 2, 3};
    int orders = 0;
    do {
        SCOPED_TRACE(::testing::Message() << "dims " << dims[0] << dims[1] << dims[2] << dims[3]);
        Tensor out = permute(input, dims);
        const Shape expected_shape = {input.size(dims[0]), input.size(dims[1]), input.size(dims[2]), input.size(dims[3])};
        EXPECT_EQ(out.shape(), expected_shape);
        EXPECT_EQ(out.to_vector<double>(), permuted_reference(input, dims));
        current_tape().clear();
        Tensor weights = weights_for(generator, out);
        auto result = gradcheck([&] { return weighted_sum(permute(input, dims), weights); }, {input});
        EXPECT_GRADCHECK(result);
        ++orders;
    } while (std::next_permutation(dims.begin(), dims.end()));
    EXPECT_EQ(orders, 24);
}

TEST_F(LayoutGradcheck, PermuteWithNegativeDimsAndSizeOneAxes) {
    Tensor input = random_leaf(generator, {3, 1, 4, 1, 2});
    const std::vector<int64_t> dims = {-1, 2, 0, -2, 1}, normalized = {4, 2, 0, 3, 1};
    EXPECT_EQ(permute(input, dims).to_vector<double>(), permuted_reference(input, normalized));
    current_tape().clear();
    Tensor weights = random_tensor(generator, {input.numel()});
    auto result = gradcheck([&] { return weighted_sum(permute(input, dims), weights); }, {input});
    EXPECT_GRADCHECK(result);
}

TEST_F(LayoutGradcheck, TransposeWithNegativeDims) {
    Tensor input = random_leaf(generator, {3, 4, 5});
    const std::pair<int64_t, int64_t> pairs[] = {{-1, -2}, {0, -1}, {-3, 1}, {1, 1}};
    for (const auto& [first, second] : pairs) {
        SCOPED_TRACE(::testing::Message() << "transpose(" << first << ", " << second << ")");
        std::vector<int64_t> dims = {0, 1, 2};
        std::swap(dims[size_t((first + 3) % 3)], dims[size_t((second + 3) % 3)]);
        EXPECT_EQ(transpose(input, first, second).to_vector<double>(), permuted_reference(input, dims));
        current_tape().clear();
        Tensor weights = random_tensor(generator, {input.numel()});
        auto result = gradcheck([&] { return weighted_sum(transpose(input, first, second), weights); }, {input});
        EXPECT_GRADCHECK(result);
    }
}

// ---- view / reshape ----

TEST_F(LayoutGradcheck, ReshapeInfersOneExtentAndSharesStorage) {
    Tensor input = random_leaf(generator, {2, 3, 4});
    Tensor out = reshape(input, {4, -1});
    EXPECT_EQ(out.shape(), (Shape{4, 6}));
    EXPECT_EQ(out.raw_data(), input.raw_data());
    EXPECT_NE(out.id(), input.id()); // its own autograd identity, unlike Tensor::reshape
    EXPECT_EQ(view(input, {-1}).shape(), (Shape{24}));
    EXPECT_EQ(view(Tensor::zeros({2, 0, 3}, DType::f64, Device::cpu), {0, 5}).shape(), (Shape{0, 5}));
}

// A reshape of an intermediate (gelu's output) consumed in its new shape by permute and slice, while the
// intermediate itself is consumed in its own shape: both gradients must reach the input.
TEST_F(LayoutGradcheck, ReshapeAndViewOfAnIntermediateUsedTwice) {
    Tensor input = random_leaf(generator, {2, 3, 4});
    Tensor first_weights = random_tensor(generator, {24}), second_weights = random_tensor(generator, {8});
    Tensor direct_weights = random_tensor(generator, {24});
    auto loss = [&] {
        Tensor hidden = gelu(input);                               // (2,3,4)
        Tensor reshaped = reshape(hidden, {4, -1, 2});             // (4,3,2)
        Tensor viewed = view(reshaped, {-1, 3});                   // (8,3)
        Tensor left = weighted_sum(permute(reshaped, {2, 0, 1}), first_weights);
        Tensor right = weighted_sum(slice(viewed, 1, 1, 2), second_weights);
        return add(add(left, right), weighted_sum(hidden, direct_weights));
    };
    auto result = gradcheck(loss, {input});
    EXPECT_GRADCHECK(result);
}

// Tensor::reshape (the member) keeps the input's autograd id, so the intermediate and its reshape share one
// gradient buffer, shaped as whichever consumer created it first. That is numerically right only because every
// backward reads gradients as flat buffers by element count; this pins that down for the layout ops' backwards.
TEST_F(LayoutGradcheck, MemberReshapeOfAnIntermediateStillRoutesGradients) {
    Tensor input = random_leaf(generator, {2, 3, 4});
    Tensor permuted_weights = random_tensor(generator, {24}), sliced_weights = random_tensor(generator, {12});
    auto loss = [&] {
        Tensor hidden = gelu(input);                                     // (2,3,4)
        Tensor shared_identity = hidden.reshape({6, 4});                 // the same id as hidden
        Tensor left = weighted_sum(permute(shared_identity, {1, 0}), permuted_weights);
        Tensor right = weighted_sum(slice(hidden, 2, 1, 3), sliced_weights);
        return add(left, right);
    };
    auto result = gradcheck(loss, {input});
    EXPECT_GRADCHECK(result);
}

// ---- slice / concat ----

TEST_F(LayoutGradcheck, SlicesWithNegativeBoundsOnEveryDim) {
    const Shape shape = {4, 5, 6};
    Tensor input = random_leaf(generator, shape);
    const std::vector<double> values = input.to_vector<double>();
    const std::vector<int64_t> strides = strides_of(shape);
    for (int64_t dim = -3; dim < 3; ++dim) {
        const int64_t axis = (dim + 3) % 3, size = shape[size_t(axis)];
        const std::pair<int64_t, int64_t> bounds[] = {{-3, -1}, {1, -1}, {-size, size}, {-100, 2}, {2, 100}};
        for (const auto& [start, end] : bounds) {
            SCOPED_TRACE(::testing::Message() << "slice(dim " << dim << ", " << start << ", " << end << ")");
            const int64_t first = std::clamp<int64_t>(start < 0 ? start + size : start, 0, size);
            const int64_t last = std::clamp<int64_t>(end < 0 ? end + size : end, 0, size);
            Tensor out = slice(input, dim, start, end);
            Shape expected_shape = shape;
            expected_shape[size_t(axis)] = last - first;
            ASSERT_EQ(out.shape(), expected_shape);
            std::vector<double> expected;
            for (int64_t flat = 0; flat < input.numel(); ++flat) {
                const int64_t coordinate = unravel(flat, shape)[size_t(axis)];
                if (coordinate >= first && coordinate < last) expected.push_back(values[size_t(flat)]);
            }
            EXPECT_EQ(out.to_vector<double>(), expected);
            current_tape().clear();
            Tensor weights = weights_for(generator, out);
            auto result = gradcheck([&] { return weighted_sum(slice(input, dim, start, end), weights); }, {input});
            EXPECT_GRADCHECK(result);
        }
    }
}

TEST_F(LayoutGradcheck, EmptySliceIsAnEmptyTensorWithZeroGradient) {
    Tensor input = random_leaf(generator, {3, 4});
    EXPECT_EQ(slice(input, 1, 3, 1).shape(), (Shape{3, 0}));
    EXPECT_EQ(slice(input, 0, -1, -1).shape(), (Shape{0, 4}));
    current_tape().clear();
    zero_grad({input});
    Tensor empty = slice(input, 1, 2, 2);
    Tensor other = random_tensor(generator, {input.numel()});
    // The empty slice joins a used path so the loss still depends on the input.
    backward(weighted_sum(concat({empty, input}, 1), other));
    EXPECT_EQ(input.grad().to_vector<double>(), other.to_vector<double>());
}

TEST_F(LayoutGradcheck, ConcatOfThreeSizesAlongAMiddleDimOneUsedTwice) {
    Tensor a = random_leaf(generator, {2, 1, 3}), b = random_leaf(generator, {2, 4, 3});
    Tensor c = random_leaf(generator, {2, 2, 3});
    Tensor out = concat({a, b, a, c}, -2);
    ASSERT_EQ(out.shape(), (Shape{2, 8, 3}));
    const std::vector<double> values = out.to_vector<double>();
    // Independent arithmetic: out[o, j, n] from the input whose range along dim 1 holds j.
    const std::vector<std::pair<Tensor, int64_t>> pieces = {{a, 0}, {b, 1}, {a, 5}, {c, 6}};
    for (const auto& [piece, offset] : pieces) {
        const std::vector<double> piece_values = piece.to_vector<double>();
        for (int64_t flat = 0; flat < piece.numel(); ++flat) {
            const std::vector<int64_t> index = unravel(flat, piece.shape());
            EXPECT_EQ(values[size_t((index[0] * 8 + offset + index[1]) * 3 + index[2])], piece_values[size_t(flat)]);
        }
    }
    current_tape().clear();
    Tensor weights = weights_for(generator, out);
    auto result = gradcheck([&] { return weighted_sum(concat({a, b, a, c}, 1), weights); }, {a, b, c});
    EXPECT_GRADCHECK(result);
    // Along the first and last dims, with an empty input among them.
    Tensor d = random_leaf(generator, {1, 4, 3}), empty = random_leaf(generator, {0, 4, 3});
    Tensor first_weights = random_tensor(generator, {3 * 4 * 3});
    auto along_first = gradcheck([&] { return weighted_sum(concat({b, empty, d}, 0), first_weights); }, {b, d});
    EXPECT_GRADCHECK(along_first);
    Tensor e = random_leaf(generator, {2, 4, 5});
    Tensor last_weights = random_tensor(generator, {2 * 4 * 8});
    auto along_last = gradcheck([&] { return weighted_sum(concat({b, e}, -1), last_weights); }, {b, e});
    EXPECT_GRADCHECK(along_last);
}

// ---- batched matmul ----

// c[batch, i, j] = Σ_p op(a)[i, p] op(b)[p, j] by explicit indices; b_batched false: one b for every entry.
std::vector<double> matmul_reference(const Tensor& a, const Tensor& b, MatmulOptions options) {
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    const int64_t a_rows = a.size(-2), a_columns = a.size(-1), b_rows = b.size(-2), b_columns = b.size(-1);
    const int64_t M = options.transpose_a ? a_columns : a_rows, K = options.transpose_a ? a_rows : a_columns;
    const int64_t N = options.transpose_b ? b_rows : b_columns;
    const int64_t batch = a.numel() / (a_rows * a_columns);
    const bool b_batched = b.dim() > 2;
    std::vector<double> c(size_t(batch * M * N), 0.0);
    for (int64_t entry = 0; entry < batch; ++entry)
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                double sum = 0.0;
                for (int64_t p = 0; p < K; ++p) {
                    const int64_t a_index = options.transpose_a ? p * a_columns + i : i * a_columns + p;
                    const int64_t b_index = options.transpose_b ? j * b_columns + p : p * b_columns + j;
                    sum += av[size_t(entry * a_rows * a_columns + a_index)] *
                           bv[size_t((b_batched ? entry * b_rows * b_columns : 0) + b_index)];
                }
                c[size_t((entry * M + i) * N + j)] = sum;
            }
    return c;
}

void expect_near_all(const std::vector<double>& actual, const std::vector<double>& expected) {
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-12) << "element " << i;
}

TEST_F(LayoutGradcheck, BatchedMatmulEveryTransposeAndBroadcastB) {
    const int64_t M = 3, K = 5, N = 4;
    for (int flags = 0; flags < 4; ++flags) {
        const MatmulOptions options{(flags & 1) != 0, (flags & 2) != 0};
        SCOPED_TRACE(::testing::Message() << "transpose_a " << options.transpose_a << " transpose_b "
                                          << options.transpose_b);
        Tensor a = random_leaf(generator, options.transpose_a ? Shape{2, 3, K, M} : Shape{2, 3, M, K});
        Tensor b = random_leaf(generator, options.transpose_b ? Shape{2, 3, N, K} : Shape{2, 3, K, N});
        Tensor b_shared = random_leaf(generator, options.transpose_b ? Shape{N, K} : Shape{K, N});
        Tensor out = matmul(a, b, options);
        ASSERT_EQ(out.shape(), (Shape{2, 3, M, N}));
        expect_near_all(out.to_vector<double>(), matmul_reference(a, b, options));
        expect_near_all(matmul(a, b_shared, options).to_vector<double>(), matmul_reference(a, b_shared, options));
        current_tape().clear();
        Tensor weights = weights_for(generator, out);
        auto batched = gradcheck([&] { return weighted_sum(matmul(a, b, options), weights); }, {a, b});
        EXPECT_GRADCHECK(batched);
        auto broadcast = gradcheck([&] { return weighted_sum(matmul(a, b_shared, options), weights); }, {a, b_shared});
        EXPECT_GRADCHECK(broadcast);
    }
}

// The existing matmul(a, b, transpose_b) and the new form with a 2-D b run the same GEMM: bitwise equal in f32.
TEST_F(LayoutGradcheck, BatchedMatmulWithA2DBMatchesTheExistingMatmulBitwise) {
    Tensor a = random_tensor(generator, {3, 7, 16}, DType::f32), b = random_tensor(generator, {16, 9}, DType::f32);
    Tensor b_transposed = random_tensor(generator, {9, 16}, DType::f32);
    EXPECT_EQ(matmul(a, b, MatmulOptions{}).to_vector<float>(), matmul(a, b).to_vector<float>());
    EXPECT_EQ(matmul(a, b_transposed, MatmulOptions{.transpose_b = true}).to_vector<float>(),
              matmul(a, b_transposed, true).to_vector<float>());
}

// ---- bad input: the op, the shapes, and nothing run ----

TEST_F(LayoutGradcheck, BadInputNamesTheOpAndTheShapes) {
    Tensor x = random_tensor(generator, {2, 3, 4});
    expect_error([&] { permute(x, {0, 1}); }, {"permute", "(2,3,4)", "(0,1)"});
    expect_error([&] { permute(x, {0, 1, 1}); }, {"permute", "twice", "(2,3,4)"});
    expect_error([&] { permute(x, {0, 1, 3}); }, {"permute", "dimension 3", "(2,3,4)"});
    expect_error([&] { transpose(x, 0, -4); }, {"transpose", "dimension -4", "(2,3,4)"});
    expect_error([&] { permute(Tensor::zeros(Shape(9, 1), DType::f64, Device::cpu), {0, 1, 2, 3, 4, 5, 6, 7, 8}); },
                 {"permute", "(1,1,1,1,1,1,1,1,1)", "at most 8"});
    expect_error([&] { reshape(x, {5, -1}); }, {"reshape", "(2,3,4)", "(5,-1)"});
    expect_error([&] { view(x, {2, 3, 5}); }, {"view", "(2,3,4)", "(2,3,5)", "element counts differ"});
    expect_error([&] { view(x, {-1, -1}); }, {"view", "(2,3,4)", "(-1,-1)", "more than one -1"});
    expect_error([&] { view(x, {-2, 12}); }, {"view", "(2,3,4)", "(-2,12)", "invalid extent"});
    expect_error([&] { view(Tensor::zeros({0, 3}, DType::f64, Device::cpu), {0, -1}); },
                 {"view", "(0,3)", "(0,-1)", "ambiguous"});
    expect_error([&] { slice(x, 3, 0, 1); }, {"slice", "dimension 3", "(2,3,4)"});
    expect_error([&] { slice(Tensor::from_vector<int32_t>({1, 2}, {2}, Device::cpu), 0, 0, 1); }, {"slice", "i32"});
    Tensor y = random_tensor(generator, {2, 5, 3});
    expect_error([&] { concat({x, y}, 1); }, {"concat", "input 1", "(2,5,3)", "(2,3,4)"});
    expect_error([&] { concat({x, random_tensor(generator, {2, 3, 4}, DType::f32)}, 0); }, {"concat", "dtype"});
    expect_error([&] { concat({x, random_tensor(generator, {2, 3})}, 0); }, {"concat", "input 1", "(2,3)"});
    expect_error([&] { concat({}, 0); }, {"concat", "no inputs"});
    expect_error([&] { concat({x}, -4); }, {"concat", "dimension -4", "(2,3,4)"});
    Tensor a = random_tensor(generator, {2, 3, 4}), b = random_tensor(generator, {2, 5, 6});
    expect_error([&] { matmul(a, b, MatmulOptions{}); }, {"matmul", "(2,3,4)", "(2,5,6)", "inner dimensions"});
    expect_error([&] { matmul(a, random_tensor(generator, {3, 4, 6}), MatmulOptions{}); },
                 {"matmul", "(2,3,4)", "(3,4,6)", "batch dimension 0"});
    expect_error([&] { matmul(a, random_tensor(generator, {4, 6}), MatmulOptions{.transpose_a = true}); },
                 {"matmul", "(2,3,4)ᵀ", "(4,6)", "inner dimensions"});
    expect_error([&] { matmul(random_tensor(generator, {4}), random_tensor(generator, {4, 6}), MatmulOptions{}); },
                 {"matmul", "(4)", "(4,6)", "at least 2"});
    expect_error([&] { matmul(a, random_tensor(generator, {1, 2, 4, 6}), MatmulOptions{}); },
                 {"matmul", "(2,3,4)", "(1,2,4,6)", "rank"});
}

} // namespace
} // namespace engine::testing
