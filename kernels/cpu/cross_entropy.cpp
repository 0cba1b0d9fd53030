// Softmax cross-entropy over the last dimension, the reference for kernels/cuda/cross_entropy.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>

namespace engine::kernels::cpu {

namespace {

// Subtracting the row maximum first keeps every exponential in (0, 1], so large logits cannot overflow.
template <typename T>
double row_logsumexp(const T* row, int V) {
    double max_logit = static_cast<double>(row[0]);
    for (int v = 1; v < V; ++v) {
        if (static_cast<double>(row[v]) > max_logit) max_logit = static_cast<double>(row[v]);
    }
    double exp_sum = 0.0;
    for (int v = 0; v < V; ++v) exp_sum += std::exp(static_cast<double>(row[v]) - max_logit);
    return max_logit + std::log(exp_sum);
}

} // namespace

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V, int ignore_index) {
    for (int n = 0; n < N; ++n) {
        if (targets[n] == ignore_index) {
            losses[n] = T(0);
            continue;
        }
        // (N,V) logits can pass 2^31 elements for a large vocabulary, hence the 64-bit row offset.
        const T* row = logits + static_cast<int64_t>(n) * V;
        losses[n] = static_cast<T>(row_logsumexp(row, V) - static_cast<double>(row[targets[n]]));
    }
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* dlosses, const T* logits, const int32_t* targets, int N, int V,
                            int ignore_index) {
    for (int n = 0; n < N; ++n) {
        if (targets[n] == ignore_index) continue;
        const T* row = logits + static_cast<int64_t>(n) * V;
        T* drow = dlogits + static_cast<int64_t>(n) * V;
        const double logsumexp = row_logsumexp(row, V);
        const double dloss = static_cast<double>(dlosses[n]);
        for (int v = 0; v < V; ++v) {
            const double probability = std::exp(static_cast<double>(row[v]) - logsumexp);
            const double indicator = (v == targets[n]) ? 1.0 : 0.0;
            drow[v] += static_cast<T>((probability - indicator) * dloss);
        }
    }
}

template <typename T>
void cross_entropy_fused_forward(T* losses, T* logits, const int32_t* targets, T dloss, int N, int V, int padded_V,
                                 int ignore_index) {
    for (int n = 0; n < N; ++n) {
        T* row = logits + static_cast<int64_t>(n) * padded_V;
        const int target = targets[n];
        if (target == ignore_index) {
            losses[n] = T(0);
            for (int v = 0; v < padded_V; ++v) row[v] = T(0);
            continue;
        }
        // Everything this row's gradient needs is read before the first write over it.
        const double logsumexp = row_logsumexp(row, V);
        losses[n] = static_cast<T>(logsumexp - static_cast<double>(row[target]));
        // The same expression as cross_entropy_backward's, so with dloss equal to its dlosses[n] and a zeroed
        // dlogits the two paths agree bitwise.
        for (int v = 0; v < V; ++v) {
            const double probability = std::exp(static_cast<double>(row[v]) - logsumexp);
            const double indicator = (v == target) ? 1.0 : 0.0;
            row[v] = static_cast<T>((probability - indicator) * static_cast<double>(dloss));
        }
        for (int v = V; v < padded_V; ++v) row[v] = T(0);
    }
}

template <typename T>
void cross_entropy_fused_rescale(T* dlogits, const T* dout, T expected_dout, int64_t count) {
    const T ratio = dout[0] / expected_dout;
    if (ratio == T(1)) return;
    for (int64_t i = 0; i < count; ++i) dlogits[i] *= ratio;
}

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int, int, int);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int, int, int);
template void cross_entropy_backward<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void cross_entropy_backward<double>(double*, const double*, const double*, const int32_t*, int, int, int);

template void cross_entropy_fused_forward<float>(float*, float*, const int32_t*, float, int, int, int, int);
template void cross_entropy_fused_forward<double>(double*, double*, const int32_t*, double, int, int, int, int);
template void cross_entropy_fused_rescale<float>(float*, const float*, float, int64_t);
template void cross_entropy_fused_rescale<double>(double*, const double*, double, int64_t);

} // namespace engine::kernels::cpu
