// Causal multi-head self-attention forward that keeps only the per-row logsumexp: the reference for the CUDA
// twin kernels/cuda/attention_forward.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <limits>
#include <vector>

namespace engine::kernels::cpu {

template <typename Scalar>
void attention_forward(Scalar* out, Scalar* logsumexp, const Scalar* qkv, int B, int T, int C, int NH) {
    const int head_size = C / NH;
    const int64_t qkv_row = 3 * static_cast<int64_t>(C);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
    std::vector<double> scores(static_cast<size_t>(T));
    std::vector<double> accumulator(static_cast<size_t>(head_size));

    for (int b = 0; b < B; ++b) {
        const Scalar* batch_qkv = qkv + static_cast<int64_t>(b) * T * qkv_row;
        for (int h = 0; h < NH; ++h) {
            const int64_t head_offset = static_cast<int64_t>(h) * head_size;
            for (int t = 0; t < T; ++t) {
                const Scalar* query = batch_qkv + t * qkv_row + head_offset;

                // Scaled scores against keys 0..t only (the causal mask), tracking the maximum so the
                // exponentials below never overflow.
                double max_score = -std::numeric_limits<double>::infinity();
                for (int t2 = 0; t2 <= t; ++t2) {
                    const Scalar* key = batch_qkv + t2 * qkv_row + C + head_offset;
                    double dot = 0.0;
                    for (int d = 0; d < head_size; ++d) dot += static_cast<double>(query[d]) * key[d];
                    scores[t2] = dot * scale;
                    if (scores[t2] > max_score) max_score = scores[t2];
                }

                double exp_sum = 0.0;
                for (int t2 = 0; t2 <= t; ++t2) {
                    scores[t2] = std::exp(scores[t2] - max_score);
                    exp_sum += scores[t2];
                }

                for (int d = 0; d < head_size; ++d) accumulator[d] = 0.0;
                for (int t2 = 0; t2 <= t; ++t2) {
                    const Scalar* value = batch_qkv + t2 * qkv_row + 2 * static_cast<int64_t>(C) + head_offset;
                    const double probability = scores[t2] / exp_sum;
                    for (int d = 0; d < head_size; ++d) accumulator[d] += probability * value[d];
                }

                Scalar* out_head = out + (static_cast<int64_t>(b) * T + t) * C + head_offset;
                for (int d = 0; d < head_size; ++d) out_head[d] = static_cast<Scalar>(accumulator[d]);
                logsumexp[(static_cast<int64_t>(b) * NH + h) * T + t] =
                    static_cast<Scalar>(max_score + std::log(exp_sum));
            }
        }
    }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int);

} // namespace engine::kernels::cpu
