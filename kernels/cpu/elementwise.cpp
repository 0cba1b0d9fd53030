// Small in-place vector helpers (fill, scale, axpy) used by the engine and the optimizers; element chunks on threads.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename T>
void fill(T* x, T value, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) x[i] = value;
    });
}

template <typename T>
void scale(T* x, T alpha, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) x[i] *= alpha;
    });
}

template <typename T, typename Source>
void axpy(T* y, const Source* x, Compute<T> alpha, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) y[i] = narrow<T>(widen(y[i]) + alpha * static_cast<Compute<T>>(widen(x[i])));
    });
}

template void fill<float>(float*, float, int64_t);
template void fill<double>(double*, double, int64_t);
template void scale<float>(float*, float, int64_t);
template void scale<double>(double*, double, int64_t);
template void axpy<float>(float*, const float*, float, int64_t);
template void axpy<double>(double*, const double*, double, int64_t);
template void axpy<bfloat16>(bfloat16*, const bfloat16*, float, int64_t);
template void axpy<float, bfloat16>(float*, const bfloat16*, float, int64_t);
template void axpy<bfloat16, float>(bfloat16*, const float*, float, int64_t);

} // namespace engine::kernels::cpu
