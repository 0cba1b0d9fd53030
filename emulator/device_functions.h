// Device-side built-ins of the emulated CUDA device: threadIdx and friends, barriers, warp shuffles and
// votes, atomics and the math intrinsics the kernels use. Barriers and warp collectives are where the
// emulator's scheduler switches between a block's threads (emulator/scheduler.cpp); everything else is
// plain host code, and atomics need no locking because a block's threads are fibers on one host thread.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace engine::emulator {

// The built-in variables of the thread the scheduler is running. uint3 rather than dim3 for blockDim and
// gridDim so that they need no constructor in thread-local storage; `.x` reads the same.
extern __thread uint3 current_thread_index __attribute__((tls_model("initial-exec")));
extern __thread uint3 current_block_index __attribute__((tls_model("initial-exec")));
extern __thread uint3 current_block_dim __attribute__((tls_model("initial-exec")));
extern __thread uint3 current_grid_dim __attribute__((tls_model("initial-exec")));

// One lane's part in a warp collective. The scheduler gathers the requests of every lane named in `mask`
// (each must make the same kind of call with the same mask), then `kind->combine` computes every lane's
// output at once.
struct CollectiveKind;
struct LaneRequest {
    const CollectiveKind* kind;
    unsigned mask;
    const void* input;
    void* output;
    unsigned size;    // bytes of input and output
    int operand;      // source lane, delta or lane mask of a shuffle
    int width;        // shuffle segment width
};
// The requests of one completed collective, for its combine function.
class WarpExchange {
public:
    virtual ~WarpExchange() = default;
    virtual unsigned mask() const = 0;
    virtual const LaneRequest& request(int lane) const = 0;
    // Reports undefined behaviour: the kernel is stopped and the launch fails with this message.
    [[noreturn]] virtual void fail(int lane, const char* message) = 0;
};
struct CollectiveKind {
    const char* name;
    void (*combine)(WarpExchange& exchange);
};

extern const CollectiveKind sync_warp_kind, shuffle_index_kind, shuffle_up_kind, shuffle_down_kind,
    shuffle_xor_kind, ballot_kind, any_kind, all_kind, reduce_add_kind, reduce_min_kind, reduce_max_kind;

void warp_collective(const LaneRequest& request);
enum class BarrierReduction { none, count, all, any };
int block_barrier(BarrierReduction reduction, int predicate);

template <typename T>
T shuffle(const CollectiveKind& kind, unsigned mask, T value, int operand, int width) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffles move scalars of up to 16 bytes");
    T result;
    warp_collective(LaneRequest{&kind, mask, &value, &result, sizeof(T), operand, width});
    return result;
}

inline unsigned vote(const CollectiveKind& kind, unsigned mask, int predicate) {
    unsigned result = 0;
    const int normalized = predicate != 0;
    warp_collective(LaneRequest{&kind, mask, &normalized, &result, sizeof(unsigned), 0, 32});
    return result;
}

template <typename T>
T warp_reduce(const CollectiveKind& kind, unsigned mask, T value) {
    static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned>, "__reduce_*_sync takes int or unsigned");
    T result;
    warp_collective(LaneRequest{&kind, mask, &value, &result, sizeof(T), std::is_signed_v<T> ? 1 : 0, 32});
    return result;
}

} // namespace engine::emulator

#define threadIdx (::engine::emulator::current_thread_index)
#define blockIdx (::engine::emulator::current_block_index)
#define blockDim (::engine::emulator::current_block_dim)
#define gridDim (::engine::emulator::current_grid_dim)
inline constexpr int warpSize = 32;

// ---- barriers, shuffles, votes ----
inline void __syncthreads() { (void)::engine::emulator::block_barrier(::engine::emulator::BarrierReduction::none, 0); }
inline int __syncthreads_count(int predicate) {
    return ::engine::emulator::block_barrier(::engine::emulator::BarrierReduction::count, predicate);
}
inline int __syncthreads_and(int predicate) {
    return ::engine::emulator::block_barrier(::engine::emulator::BarrierReduction::all, predicate);
}
inline int __syncthreads_or(int predicate) {
    return ::engine::emulator::block_barrier(::engine::emulator::BarrierReduction::any, predicate);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    ::engine::emulator::warp_collective({&::engine::emulator::sync_warp_kind, mask, nullptr, nullptr, 0, 0, 32});
}
template <typename T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = warpSize) {
    return ::engine::emulator::shuffle(::engine::emulator::shuffle_index_kind, mask, value, source_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
    return ::engine::emulator::shuffle(::engine::emulator::shuffle_up_kind, mask, value, static_cast<int>(delta & 31u), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
    return ::engine::emulator::shuffle(::engine::emulator::shuffle_down_kind, mask, value,
                                       static_cast<int>(delta & 31u), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
    return ::engine::emulator::shuffle(::engine::emulator::shuffle_xor_kind, mask, value, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return ::engine::emulator::vote(::engine::emulator::ballot_kind, mask, predicate);
}
inline int __any_sync(unsigned mask, int predicate) {
    return static_cast<int>(::engine::emulator::vote(::engine::emulator::any_kind, mask, predicate));
}
inline int __all_sync(unsigned mask, int predicate) {
    return static_cast<int>(::engine::emulator::vote(::engine::emulator::all_kind, mask, predicate));
}
template <typename T>
T __reduce_add_sync(unsigned mask, T value) {
    return ::engine::emulator::warp_reduce(::engine::emulator::reduce_add_kind, mask, value);
}
template <typename T>
T __reduce_min_sync(unsigned mask, T value) {
    return ::engine::emulator::warp_reduce(::engine::emulator::reduce_min_kind, mask, value);
}
template <typename T>
T __reduce_max_sync(unsigned mask, T value) {
    return ::engine::emulator::warp_reduce(::engine::emulator::reduce_max_kind, mask, value);
}
// A block's threads run one at a time on one host thread, so memory is always coherent between them.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

// ---- atomics: plain read-modify-write, since no two emulated threads ever run at the same moment ----
namespace engine::emulator {
template <typename T, typename Update>
T read_modify_write(T* address, Update update) {
    const T old = *address;
    *address = update(old);
    return old;
}
} // namespace engine::emulator

template <typename T>
T atomicAdd(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T old) { return T(old + value); }); }
template <typename T>
T atomicSub(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T old) { return T(old - value); }); }
template <typename T>
T atomicExch(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T) { return value; }); }
template <typename T>
T atomicMax(T* address, T value) {
    return ::engine::emulator::read_modify_write(address, [&](T old) { return old < value ? value : old; });
}
template <typename T>
T atomicMin(T* address, T value) {
    return ::engine::emulator::read_modify_write(address, [&](T old) { return value < old ? value : old; });
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
    return ::engine::emulator::read_modify_write(address, [&](T old) { return old == compare ? value : old; });
}
template <typename T>
T atomicAnd(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T old) { return T(old & value); }); }
template <typename T>
T atomicOr(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T old) { return T(old | value); }); }
template <typename T>
T atomicXor(T* address, T value) { return ::engine::emulator::read_modify_write(address, [&](T old) { return T(old ^ value); }); }

// ---- loads ----
template <typename T>
T __ldg(const T* address) { return *address; }
template <typename T>
T __ldcs(const T* address) { return *address; }
template <typename T>
void __stcs(T* address, T value) { *address = value; }

// ---- math intrinsics (the fast variants compute the accurate functions) ----
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
    unsigned reversed = 0;
    for (int bit = 0; bit < 32; ++bit) reversed |= ((x >> bit) & 1u) << (31 - bit);
    return reversed;
}

// CUDA's integer and floating min/max overloads, which host C++ lacks.
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
