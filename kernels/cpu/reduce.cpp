// Whole-tensor sums (scaled sum for a loss mean, sum of squares for gradient norms), the CPU references.
#include "kernels/common/sum_of_squares_order.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/parallel.h"

#include <vector>

namespace engine::kernels::cpu {

template <typename T>
void sum_forward(Compute<T>* out, const T* inp, int64_t N, Compute<T> scale) {
    // Double accumulation: a float running sum over millions of elements stops absorbing small terms.
    double sum = 0.0;
    for (int64_t i = 0; i < N; ++i) sum += static_cast<double>(widen(inp[i]));
    out[0] = static_cast<Compute<T>>(static_cast<double>(scale) * sum);
}

template <typename T>
void sum_backward(T* dinp, const Compute<T>* dout, int64_t N, Compute<T> scale) {
    const Compute<T> gradient = scale * dout[0];
    for (int64_t i = 0; i < N; ++i) dinp[i] = narrow<T>(widen(dinp[i]) + gradient);
}

// Fixed chunks of cheap_elements_per_chunk, each summed in lane_sum's eight chains (one chain made the gradient
// norm of GPT-2 124M take 0.11 s), and the chunk sums added in chunk order: the same association for any thread
// count (and any machine: no runtime dispatch here).
template <typename T>
void sum_of_squares(double* out, const T* inp, int64_t N) {
    // kernels/common/sum_of_squares_order.h's association, which the CUDA twin follows too.
    static_assert(sum_lanes == sum_of_squares_lanes);
    const int64_t chunk = sum_of_squares_chunk;
    std::vector<double> partial(static_cast<size_t>(chunk_count(N, chunk)), 0.0);
    parallel_for(N, chunk, [&](int64_t begin, int64_t end) {
        const T* values = inp + begin;
        partial[static_cast<size_t>(begin / chunk)] = lane_sum(end - begin, [&](int64_t i) {
            const double x = static_cast<double>(values[i]);
            return x * x;
        });
    });
    double sum = 0.0;
    for (const double value : partial) sum += value;
    out[0] = sum;
}

template <typename T>
void sum_of_squares_list(double* out, const T* const* tensors, const int64_t* counts, int tensor_count) {
    double total = 0.0;
    for (int tensor = 0; tensor < tensor_count; ++tensor) {
        double part = 0.0;
        sum_of_squares(&part, tensors[tensor], counts[tensor]);
        total += part;
    }
    out[0] = total;
}

template void sum_forward<float>(float*, const float*, int64_t, float);
template void sum_forward<double>(double*, const double*, int64_t, double);
template void sum_backward<float>(float*, const float*, int64_t, float);
template void sum_backward<double>(double*, const double*, int64_t, double);
template void sum_forward<bfloat16>(float*, const bfloat16*, int64_t, float);
template void sum_backward<bfloat16>(bfloat16*, const float*, int64_t, float);
template void sum_of_squares<float>(double*, const float*, int64_t);
template void sum_of_squares<double>(double*, const double*, int64_t);
template void sum_of_squares_list<float>(double*, const float* const*, const int64_t*, int);
template void sum_of_squares_list<double>(double*, const double* const*, const int64_t*, int);

} // namespace engine::kernels::cpu
