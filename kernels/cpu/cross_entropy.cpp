// Softmax cross-entropy over the last dimension, the reference for kernels/cuda/cross_entropy.cu. bf16 logits:
// the row statistics and the losses in full precision (losses f32), the gradient rounded once on store. f32 logits
// take the SIMD loops of vector_math.h: the same f64 arithmetic with Highway's f64 exp and a lane-wise sum.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

#include <cmath>
#include <type_traits>

namespace engine::kernels::cpu {

namespace {

template <typename T>
double logit(T value) {
    return static_cast<double>(widen(value));
}

// A full-precision value stored in T: rounded once (to f32 first, then to bf16 for bf16 storage).
template <typename T>
T store(double value) {
    return narrow<T>(static_cast<Compute<T>>(value));
}

// Subtracting the row maximum first keeps every exponential in (0, 1], so large logits cannot overflow.
template <typename T>
double row_logsumexp(const T* row, int V) {
    if constexpr (std::is_same_v<T, float>) {
        // A finite maximum means every logit is finite or -inf, the vector exp's domain; NaN or +inf anywhere (the
        // maximum is then NaN or +inf) takes the scalar loop below, whose NaN the loss must carry.
        const double max_logit = simd::row_max(row, V);
        if (std::isfinite(max_logit)) return max_logit + std::log(simd::exp_sum(row, max_logit, V));
    }
    double max_logit = logit(row[0]);
    for (int v = 1; v < V; ++v) {
        if (logit(row[v]) > max_logit) max_logit = logit(row[v]);
    }
    double exp_sum = 0.0;
    for (int v = 0; v < V; ++v) exp_sum += std::exp(logit(row[v]) - max_logit);
    return max_logit + std::log(exp_sum);
}

} // namespace

template <typename T>
void cross_entropy_forward(Compute<T>* losses, const T* logits, const int32_t* targets, int N, int V, int ignore_index) {
    // Rows are independent (one loss each; the op layer sums them, in row order, afterwards): chunks of rows on
    // threads. Likewise in the three kernels below.
    parallel_for(N, items_per_chunk(V, costly_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            if (targets[n] == ignore_index) {
                losses[n] = Compute<T>(0);
                continue;
            }
            // (N,V) logits can pass 2^31 elements for a large vocabulary, hence the 64-bit row offset.
            const T* row = logits + n * V;
            losses[n] = static_cast<Compute<T>>(row_logsumexp(row, V) - logit(row[targets[n]]));
        }
    });
}

template <typename T>
void cross_entropy_backward(T* dlogits, const Compute<T>* dlosses, const T* logits, const int32_t* targets, int N, int V,
                            int ignore_index) {
    parallel_for(N, items_per_chunk(V, costly_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            if (targets[n] == ignore_index) continue;
            const T* row = logits + n * V;
            T* drow = dlogits + n * V;
            const double logsumexp = row_logsumexp(row, V);
            const double dloss = static_cast<double>(dlosses[n]);
            if constexpr (std::is_same_v<T, float>) {
                if (std::isfinite(logsumexp)) { // else the scalar loop: its NaN or inf is the answer to carry
                    simd::softmax_cross_entropy_gradient(drow, row, logsumexp, targets[n], dloss, V, /*accumulate=*/true);
                    continue;
                }
            }
            for (int v = 0; v < V; ++v) {
                const double probability = std::exp(logit(row[v]) - logsumexp);
                const double indicator = (v == targets[n]) ? 1.0 : 0.0;
                drow[v] = narrow<T>(widen(drow[v]) + static_cast<Compute<T>>((probability - indicator) * dloss));
            }
        }
    });
}

template <typename T>
void cross_entropy_fused_forward(Compute<T>* losses, T* logits, const int32_t* targets, Compute<T> dloss, int N, int V,
                                 int padded_V, int ignore_index) {
    parallel_for(N, items_per_chunk(V, costly_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            T* row = logits + n * padded_V;
            const int target = targets[n];
            if (target == ignore_index) {
                losses[n] = Compute<T>(0);
                for (int v = 0; v < padded_V; ++v) row[v] = narrow<T>(0);
                continue;
            }
            // Everything this row's gradient needs is read before the first write over it.
            const double logsumexp = row_logsumexp(row, V);
            losses[n] = static_cast<Compute<T>>(logsumexp - logit(row[target]));
            // The same expression as cross_entropy_backward's, so with dloss equal to its dlosses[n] and a zeroed
            // dlogits the two paths agree bitwise.
            bool vector_done = false;
            if constexpr (std::is_same_v<T, float>) {
                if (std::isfinite(logsumexp)) { // else the scalar loop: its NaN or inf is the answer to carry
                    simd::softmax_cross_entropy_gradient(row, row, logsumexp, target, static_cast<double>(dloss), V,
                                                         /*accumulate=*/false);
                    vector_done = true;
                }
            }
            if (!vector_done) {
                for (int v = 0; v < V; ++v) {
                    const double probability = std::exp(logit(row[v]) - logsumexp);
                    const double indicator = (v == target) ? 1.0 : 0.0;
                    row[v] = store<T>((probability - indicator) * static_cast<double>(dloss));
                }
            }
            for (int v = V; v < padded_V; ++v) row[v] = narrow<T>(0);
        }
    });
}

template <typename T>
void cross_entropy_fused_rescale(T* dlogits, const Compute<T>* dout, Compute<T> expected_dout, int64_t count) {
    const Compute<T> ratio = dout[0] / expected_dout;
    if (ratio == Compute<T>(1)) return;
    parallel_for(count, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dlogits[i] = narrow<T>(widen(dlogits[i]) * ratio);
    });
}

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int, int, int);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int, int, int);
template void cross_entropy_backward<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void cross_entropy_backward<double>(double*, const double*, const double*, const int32_t*, int, int, int);

template void cross_entropy_fused_forward<float>(float*, float*, const int32_t*, float, int, int, int, int);
template void cross_entropy_fused_forward<double>(double*, double*, const int32_t*, double, int, int, int, int);
template void cross_entropy_fused_rescale<float>(float*, const float*, float, int64_t);
template void cross_entropy_fused_rescale<double>(double*, const double*, double, int64_t);
template void cross_entropy_forward<bfloat16>(float*, const bfloat16*, const int32_t*, int, int, int);
template void cross_entropy_backward<bfloat16>(bfloat16*, const float*, const bfloat16*, const int32_t*, int, int, int);
template void cross_entropy_fused_forward<bfloat16>(float*, bfloat16*, const int32_t*, float, int, int, int, int);
template void cross_entropy_fused_rescale<bfloat16>(bfloat16*, const float*, float, int64_t);

} // namespace engine::kernels::cpu
