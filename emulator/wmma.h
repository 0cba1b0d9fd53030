// Tensor cores on the emulated device: the nvcuda::wmma API (fragments, fill, load, store, mma) computed
// on the CPU. Which matrix element a lane holds in fragment.x[] is the emulator's own choice, deliberately
// scrambled, so a kernel that depends on the hardware's unspecified layout breaks here; elementwise work on
// x[] and the load/mma/store calls behave as the API specifies. Load, store and mma are warp collectives:
// every lane must take part with the same arguments. Products accumulate in fp32, k ascending; tf32 and
// bf16 inputs are used at their own precision, but the hardware's rounding inside the mma is not modelled.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
} // namespace precision

namespace detail {
template <typename Use, int M, int N, int K>
struct shape; // rows and columns of the operand
template <int M, int N, int K>
struct shape<matrix_a, M, N, K> { static constexpr int rows = M, columns = K; };
template <int M, int N, int K>
struct shape<matrix_b, M, N, K> { static constexpr int rows = K, columns = N; };
template <int M, int N, int K>
struct shape<accumulator, M, N, K> { static constexpr int rows = M, columns = N; };

template <typename T>
struct storage { using type = T; };
template <>
struct storage<precision::tf32> { using type = float; };

// The emulator's layout: element j of lane `lane` is matrix element j * 32 + (7 * lane + 3 * j) % 32, in
// row-major order of the operand; a bijection, since 7 is odd.
inline int element_index(int lane, int j) { return j * 32 + (7 * lane + 3 * j) % 32; }

inline float to_float(float value) { return value; }
inline float to_float(__half value) { return __half2float(value); }
inline float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
template <typename Storage>
Storage from_float(float value) {
    if constexpr (std::is_same_v<Storage, __half>) return __float2half(value);
    else if constexpr (std::is_same_v<Storage, __nv_bfloat16>) return __float2bfloat16(value);
    else return static_cast<Storage>(value);
}
inline float tf32_round(float value) {
    if (!std::isfinite(value)) return value;
    uint32_t bits = std::bit_cast<uint32_t>(value);
    bits += 0xFFFu + ((bits >> 13) & 1u);
    return std::bit_cast<float>(bits & ~0x1FFFu);
}
} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
public:
    using element_type = typename detail::storage<T>::type;
    static constexpr int rows = detail::shape<Use, M, N, K>::rows;
    static constexpr int columns = detail::shape<Use, M, N, K>::columns;
    static_assert(rows * columns % 32 == 0, "a wmma fragment spreads its elements evenly over 32 lanes");
    static constexpr int num_elements = rows * columns / 32;
    element_type x[num_elements];
};

inline float __float_to_tf32(float value) { return detail::tf32_round(value); }

template <typename Use, int M, int N, int K, typename T, typename Layout, typename Value>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& target, const Value& value) {
    using Element = typename fragment<Use, M, N, K, T, Layout>::element_type;
    for (auto& element : target.x) element = static_cast<Element>(value);
}

namespace detail {

// One lane's arguments to a load or store: the warp must agree on pointer, stride and layout.
struct Transfer {
    const void* memory;
    unsigned leading;
    bool row_major;
    void* elements;
};

template <typename Fragment, bool store>
void combine_transfer(engine::emulator::WarpExchange& exchange) {
    using Element = typename Fragment::element_type;
    const int first = std::countr_zero(exchange.mask());
    Transfer reference;
    std::memcpy(&reference, exchange.request(first).input, sizeof reference);
    for (int lane = 0; lane < 32; ++lane) {
        Transfer transfer;
        std::memcpy(&transfer, exchange.request(lane).input, sizeof transfer);
        if (transfer.memory != reference.memory || transfer.leading != reference.leading ||
            transfer.row_major != reference.row_major) {
            exchange.fail(lane, "lanes of one wmma load/store pass different pointers, strides or layouts");
        }
        auto* elements = static_cast<Element*>(transfer.elements);
        for (int j = 0; j < Fragment::num_elements; ++j) {
            const int index = element_index(lane, j), row = index / Fragment::columns, column = index % Fragment::columns;
            const size_t offset = transfer.row_major ? size_t(row) * transfer.leading + column
                                                     : size_t(column) * transfer.leading + row;
            if constexpr (store) {
                static_cast<Element*>(const_cast<void*>(transfer.memory))[offset] = elements[j];
            } else {
                elements[j] = static_cast<const Element*>(transfer.memory)[offset];
            }
        }
    }
}

template <typename Fragment, bool store>
inline const engine::emulator::CollectiveKind transfer_kind{store ? "wmma::store_matrix_sync" : "wmma::load_matrix_sync",
                                                            combine_transfer<Fragment, store>};

template <typename Fragment, bool store>
void transfer(const void* memory, unsigned leading, bool row_major, void* elements) {
    const Transfer arguments{memory, leading, row_major, elements};
    engine::emulator::warp_collective(
        engine::emulator::LaneRequest{&transfer_kind<Fragment, store>, 0xffffffffu, &arguments, nullptr, sizeof arguments, 0, 32});
}

struct MmaOperands {
    void* d;
    const void* a;
    const void* b;
    const void* c;
};

template <typename D, typename A, typename B, typename C, bool tf32>
void combine_mma(engine::emulator::WarpExchange& exchange) {
    constexpr int M = A::rows, K = A::columns, N = B::columns;
    float a[M * K], b[K * N], c[M * N];
    for (int lane = 0; lane < 32; ++lane) {
        MmaOperands operands;
        std::memcpy(&operands, exchange.request(lane).input, sizeof operands);
        for (int j = 0; j < A::num_elements; ++j) {
            const float value = to_float(static_cast<const A*>(operands.a)->x[j]);
            a[element_index(lane, j)] = tf32 ? tf32_round(value) : value;
        }
        for (int j = 0; j < B::num_elements; ++j) {
            const float value = to_float(static_cast<const B*>(operands.b)->x[j]);
            b[element_index(lane, j)] = tf32 ? tf32_round(value) : value;
        }
        for (int j = 0; j < C::num_elements; ++j) c[element_index(lane, j)] = to_float(static_cast<const C*>(operands.c)->x[j]);
    }
    for (int row = 0; row < M; ++row) {
        for (int column = 0; column < N; ++column) {
            float sum = c[row * N + column];
            for (int inner = 0; inner < K; ++inner) sum += a[row * K + inner] * b[inner * N + column];
            c[row * N + column] = sum;
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        MmaOperands operands;
        std::memcpy(&operands, exchange.request(lane).input, sizeof operands);
        auto* d = static_cast<D*>(operands.d);
        for (int j = 0; j < D::num_elements; ++j) {
            d->x[j] = from_float<typename D::element_type>(c[element_index(lane, j)]);
        }
    }
}

template <typename D, typename A, typename B, typename C, bool tf32>
inline const engine::emulator::CollectiveKind mma_kind{"wmma::mma_sync", combine_mma<D, A, B, C, tf32>};

} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& target, const typename detail::storage<T>::type* memory,
                      unsigned leading) {
    static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its layout");
    detail::transfer<fragment<Use, M, N, K, T, Layout>, false>(memory, leading, std::is_same_v<Layout, row_major>, target.x);
}

template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& target, const T* memory, unsigned leading, layout_t layout) {
    detail::transfer<fragment<accumulator, M, N, K, T>, false>(memory, leading, layout == mem_row_major, target.x);
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* memory, const fragment<accumulator, M, N, K, T>& source, unsigned leading, layout_t layout) {
    detail::transfer<fragment<accumulator, M, N, K, T>, true>(memory, leading, layout == mem_row_major,
                                                              const_cast<T*>(source.x));
}

template <int M, int N, int K, typename Input, typename LayoutA, typename LayoutB, typename Accumulator>
void mma_sync(fragment<accumulator, M, N, K, Accumulator>& d, const fragment<matrix_a, M, N, K, Input, LayoutA>& a,
              const fragment<matrix_b, M, N, K, Input, LayoutB>& b, const fragment<accumulator, M, N, K, Accumulator>& c) {
    using D = fragment<accumulator, M, N, K, Accumulator>;
    using A = fragment<matrix_a, M, N, K, Input, LayoutA>;
    using B = fragment<matrix_b, M, N, K, Input, LayoutB>;
    constexpr bool tf32 = std::is_same_v<Input, precision::tf32>;
    const detail::MmaOperands operands{&d, &a, &b, &c};
    engine::emulator::warp_collective(engine::emulator::LaneRequest{&detail::mma_kind<D, A, B, D, tf32>, 0xffffffffu,
                                                                    &operands, nullptr, sizeof operands, 0, 32});
}

} // namespace nvcuda::wmma
