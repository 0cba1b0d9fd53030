// Bias broadcast over rows and its column-sum gradient, the reference for kernels/cuda/bias.cu.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#include <vector>

namespace engine::kernels::cpu {

template <typename T>
void bias_add_forward(T* out, const T* bias, int N, int OC) {
    parallel_for(N, items_per_chunk(OC, cheap_elements_per_chunk), [&](int64_t first_row, int64_t end_row) {
        for (int64_t n = first_row; n < end_row; ++n) {
            T* out_row = out + n * OC;
            for (int o = 0; o < OC; ++o) out_row[o] = narrow<T>(widen(out_row[o]) + widen(bias[o]));
        }
    });
}

template <typename T>
void bias_backward(Compute<T>* dbias, const T* dout, int N, int OC) {
    // Each column is summed in double before the single accumulate, so a long column does not lose the
    // small contributions to float rounding. A chunk of columns keeps one double per column and walks the rows in
    // order, reading each row's segment contiguously: the same per-column sum, in the same order, as a walk down
    // each column, without its stride of OC elements.
    parallel_for(OC, columns_per_chunk(N), [&](int64_t first_column, int64_t end_column) {
        const int64_t width = end_column - first_column;
        std::vector<double> sums(static_cast<size_t>(width), 0.0);
        for (int64_t n = 0; n < N; ++n) {
            const T* row = dout + n * OC + first_column;
            for (int64_t o = 0; o < width; ++o) sums[o] += static_cast<double>(widen(row[o]));
        }
        for (int64_t o = 0; o < width; ++o) dbias[first_column + o] += static_cast<Compute<T>>(sums[o]);
    });
}

template void bias_add_forward<float>(float*, const float*, int, int);
template void bias_add_forward<double>(double*, const double*, int, int);
template void bias_backward<float>(float*, const float*, int, int);
template void bias_backward<double>(double*, const double*, int, int);
template void bias_add_forward<bfloat16>(bfloat16*, const bfloat16*, int, int);
template void bias_backward<bfloat16>(float*, const bfloat16*, int, int);

} // namespace engine::kernels::cpu
