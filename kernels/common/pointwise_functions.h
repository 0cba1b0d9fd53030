// The pointwise functions of the general ops, their derivatives and the broadcast layout, written once for
// the CPU kernels and their CUDA twins so that both compute the same formula at the same precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define ENGINE_POINTWISE_FUNCTION __host__ __device__ __forceinline__
#else
#define ENGINE_POINTWISE_FUNCTION inline
#endif

namespace engine::kernels {

enum class UnaryFunction : int { relu, silu, tanh, sigmoid, exp, log };
enum class BinaryFunction : int { add, subtract, multiply, divide };

// Whether the backward of `function` reads the forward's output (tanh, sigmoid, exp: the derivative is a
// function of it) or its input (relu, silu, log). The op saves only that one.
constexpr bool unary_backward_reads_output(UnaryFunction function) {
    return function == UnaryFunction::tanh || function == UnaryFunction::sigmoid || function == UnaryFunction::exp;
}

// libm on the host, the float intrinsics' full-precision forms on the device (expf, not __expf).
template <typename T>
ENGINE_POINTWISE_FUNCTION T exp_of(T x) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>) return expf(x);
    else return ::exp(x);
#else
    return std::exp(x);
#endif
}
template <typename T>
ENGINE_POINTWISE_FUNCTION T log_of(T x) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>) return logf(x);
    else return ::log(x);
#else
    return std::log(x);
#endif
}
template <typename T>
ENGINE_POINTWISE_FUNCTION T tanh_of(T x) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>) return tanhf(x);
    else return ::tanh(x);
#else
    return std::tanh(x);
#endif
}

// 1/(1+e^-x): e^-x overflows to inf for x < -88 (f32), giving exactly 0 rather than NaN.
template <typename T>
ENGINE_POINTWISE_FUNCTION T sigmoid_of(T x) {
    return T(1) / (T(1) + exp_of(-x));
}

template <typename T>
ENGINE_POINTWISE_FUNCTION T unary_value(UnaryFunction function, T x) {
    switch (function) {
    case UnaryFunction::relu: return x > T(0) ? x : T(0);
    case UnaryFunction::silu: return x * sigmoid_of(x);
    case UnaryFunction::tanh: return tanh_of(x);
    case UnaryFunction::sigmoid: return sigmoid_of(x);
    case UnaryFunction::exp: return exp_of(x);
    case UnaryFunction::log: return log_of(x);
    }
    return x;
}

// d f / d x from what the op saved: the input x, or the output y for unary_backward_reads_output functions.
template <typename T>
ENGINE_POINTWISE_FUNCTION T unary_derivative(UnaryFunction function, T saved) {
    switch (function) {
    case UnaryFunction::relu: return saved > T(0) ? T(1) : T(0); // 0 at 0, as PyTorch
    case UnaryFunction::silu: {
        const T s = sigmoid_of(saved);
        return s * (T(1) + saved * (T(1) - s));
    }
    case UnaryFunction::tanh: return T(1) - saved * saved;
    case UnaryFunction::sigmoid: return saved * (T(1) - saved);
    case UnaryFunction::exp: return saved;
    case UnaryFunction::log: return T(1) / saved;
    }
    return T(0);
}

template <typename T>
ENGINE_POINTWISE_FUNCTION T binary_value(BinaryFunction function, T a, T b) {
    switch (function) {
    case BinaryFunction::add: return a + b;
    case BinaryFunction::subtract: return a - b;
    case BinaryFunction::multiply: return a * b;
    case BinaryFunction::divide: return a / b;
    }
    return a;
}

// Which operands the partial derivative with respect to operand `which` (0: a, 1: b) reads.
constexpr bool binary_partial_reads_a(BinaryFunction function, int which) {
    return (function == BinaryFunction::multiply && which == 1) || (function == BinaryFunction::divide && which == 1);
}
constexpr bool binary_partial_reads_b(BinaryFunction function, int which) {
    return function == BinaryFunction::multiply ? which == 0 : function == BinaryFunction::divide;
}

// d f(a, b) / d a (which 0) or d b (which 1); a or b may be a dummy where binary_partial_reads_* says so.
template <typename T>
ENGINE_POINTWISE_FUNCTION T binary_partial(BinaryFunction function, int which, T a, T b) {
    switch (function) {
    case BinaryFunction::add: return T(1);
    case BinaryFunction::subtract: return which == 0 ? T(1) : T(-1);
    case BinaryFunction::multiply: return which == 0 ? b : a;
    case BinaryFunction::divide: return which == 0 ? T(1) / b : -a / (b * b);
    }
    return T(0);
}

// ---- broadcasting (NumPy rules) ----
inline constexpr int max_broadcast_rank = 8;

// How the output's elements map to a's and b's. Dimensions of extent 1 are dropped and neighbours that
// broadcast alike are merged, so the rank here is what the index arithmetic costs, usually 1 to 3.
struct BroadcastLayout {
    int rank = 0;
    int64_t count = 1;                         // output elements
    int64_t sizes[max_broadcast_rank] = {};    // the output's extents
    int64_t strides[2][max_broadcast_rank] = {}; // element strides of a (0) and b (1) per output dimension; 0: broadcast
};

// What one operand's gradient sums over: its own elements (kept dimensions, row-major, its contiguous order)
// and, for each, the output elements that read it (reduced dimensions, where its stride is 0). The output's
// and the other operand's strides come with both, so kernels walk them without dividing by the full shape.
struct GradientLayout {
    int which = 0;                   // 0: the gradient of a, 1: of b
    int kept_rank = 0, reduced_rank = 0;
    int64_t kept_count = 1;          // the operand's elements
    int64_t reduced_count = 1;       // output elements per operand element
    int64_t kept_sizes[max_broadcast_rank] = {};
    int64_t kept_output_strides[max_broadcast_rank] = {};
    int64_t kept_other_strides[max_broadcast_rank] = {};
    int64_t reduced_sizes[max_broadcast_rank] = {};
    int64_t reduced_output_strides[max_broadcast_rank] = {};
    int64_t reduced_other_strides[max_broadcast_rank] = {};
    bool innermost_reduced = false;  // the output's last dimension is summed over (a row sum), not kept
};

// The offsets that flat index `index` over `rank` extents reaches through two stride sets.
ENGINE_POINTWISE_FUNCTION void broadcast_offsets(int64_t index, int rank, const int64_t* sizes,
                                                 const int64_t* first_strides, const int64_t* second_strides,
                                                 int64_t& first, int64_t& second) {
    first = 0;
    second = 0;
    for (int axis = rank - 1; axis >= 0; --axis) {
        const int64_t position = index % sizes[axis];
        index /= sizes[axis];
        first += position * first_strides[axis];
        second += position * second_strides[axis];
    }
}

} // namespace engine::kernels
