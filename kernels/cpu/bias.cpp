// Bias broadcast over rows and its column-sum gradient, the reference for kernels/cuda/bias.cu.
#include "kernels/cpu/cpu_kernels.h"

namespace engine::kernels::cpu {

template <typename T>
void bias_add_forward(T* out, const T* bias, int N, int OC) {
    for (int n = 0; n < N; ++n) {
        T* out_row = out + static_cast<int64_t>(n) * OC;
        for (int o = 0; o < OC; ++o) out_row[o] = narrow<T>(widen(out_row[o]) + widen(bias[o]));
    }
}

template <typename T>
void bias_backward(Compute<T>* dbias, const T* dout, int N, int OC) {
    // Each column is summed in double before the single accumulate, so a long column does not lose the
    // small contributions to float rounding.
    for (int o = 0; o < OC; ++o) {
        double column_sum = 0.0;
        for (int n = 0; n < N; ++n) column_sum += static_cast<double>(widen(dout[static_cast<int64_t>(n) * OC + o]));
        dbias[o] += static_cast<Compute<T>>(column_sum);
    }
}

template void bias_add_forward<float>(float*, const float*, int, int);
template void bias_add_forward<double>(double*, const double*, int, int);
template void bias_backward<float>(float*, const float*, int, int);
template void bias_backward<double>(double*, const double*, int, int);
template void bias_add_forward<bfloat16>(bfloat16*, const bfloat16*, int, int);
template void bias_backward<bfloat16>(float*, const bfloat16*, int, int);

} // namespace engine::kernels::cpu
