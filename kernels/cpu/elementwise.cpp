// Small in-place vector helpers (fill, scale, axpy) used by the engine and the optimizers.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

template <typename T>
void fill(T* x, T value, int64_t N) {
    for (int64_t i = 0; i < N; ++i) x[i] = value;
}

template <typename T>
void scale(T* x, T alpha, int64_t N) {
    for (int64_t i = 0; i < N; ++i) x[i] *= alpha;
}

template <typename T>
void axpy(T* y, const T* x, T alpha, int64_t N) {
    for (int64_t i = 0; i < N; ++i) y[i] += alpha * x[i];
}

template void fill<float>(float*, float, int64_t);
template void fill<double>(double*, double, int64_t);
template void scale<float>(float*, float, int64_t);
template void scale<double>(double*, double, int64_t);
template void axpy<float>(float*, const float*, float, int64_t);
template void axpy<double>(double*, const double*, double, int64_t);

} // namespace engine::kernels::cpu
