// Residual-stream addition, the reference for kernels/cuda/residual.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace engine::kernels::cpu {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t N) {
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = narrow<T>(widen(a[i]) + widen(b[i]));
    });
}

template <typename T>
void residual_backward(T* da, T* db, const T* dout, int64_t N) {
    // A null gradient means that input does not require grad; the other still gets its share.
    parallel_for(N, cheap_elements_per_chunk, [&](int64_t begin, int64_t end) {
        if (da != nullptr) {
            for (int64_t i = begin; i < end; ++i) da[i] = narrow<T>(widen(da[i]) + widen(dout[i]));
        }
        if (db != nullptr) {
            for (int64_t i = begin; i < end; ++i) db[i] = narrow<T>(widen(db[i]) + widen(dout[i]));
        }
    });
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);
template void residual_backward<float>(float*, float*, const float*, int64_t);
template void residual_backward<double>(double*, double*, const double*, int64_t);
template void residual_forward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, int64_t);
template void residual_backward<bfloat16>(bfloat16*, bfloat16*, const bfloat16*, int64_t);

} // namespace engine::kernels::cpu
