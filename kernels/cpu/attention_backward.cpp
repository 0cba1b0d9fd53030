// Causal multi-head self-attention backward, recomputing the probabilities from q, k and the saved logsumexp:
// the reference for the CUDA twin kernels/cuda/attention_backward.cu.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <vector>

namespace engine::kernels::cpu {

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* dout, const Scalar* qkv, const Scalar* out,
                        const Scalar* logsumexp, int B, int T, int C, int NH) {
    const int head_size = C / NH;
    const int64_t qkv_row = 3 * static_cast<int64_t>(C);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
    std::vector<double> dquery(static_cast<size_t>(head_size));

    for (int b = 0; b < B; ++b) {
        const Scalar* batch_qkv = qkv + static_cast<int64_t>(b) * T * qkv_row;
        Scalar* batch_dqkv = dqkv + static_cast<int64_t>(b) * T * qkv_row;
        for (int h = 0; h < NH; ++h) {
            const int64_t head_offset = static_cast<int64_t>(h) * head_size;
            for (int t = 0; t < T; ++t) {
                const Scalar* query = batch_qkv + t * qkv_row + head_offset;
                const int64_t out_offset = (static_cast<int64_t>(b) * T + t) * C + head_offset;
                const Scalar* dout_head = dout + out_offset;
                const Scalar* out_head = out + out_offset;
                const double row_logsumexp =
                    static_cast<double>(logsumexp[(static_cast<int64_t>(b) * NH + h) * T + t]);

                // D_i = dout_i . out_i equals sum_j P_ij dP_ij, the softmax Jacobian's shared term, without
                // needing the whole probability row first.
                double row_delta = 0.0;
                for (int d = 0; d < head_size; ++d) row_delta += static_cast<double>(dout_head[d]) * out_head[d];

                for (int d = 0; d < head_size; ++d) dquery[d] = 0.0;
                for (int t2 = 0; t2 <= t; ++t2) {
                    const Scalar* key = batch_qkv + t2 * qkv_row + C + head_offset;
                    const Scalar* value = batch_qkv + t2 * qkv_row + 2 * static_cast<int64_t>(C) + head_offset;
                    Scalar* dkey = batch_dqkv + t2 * qkv_row + C + head_offset;
                    Scalar* dvalue = batch_dqkv + t2 * qkv_row + 2 * static_cast<int64_t>(C) + head_offset;

                    double dot = 0.0;
                    double dprobability = 0.0;
                    for (int d = 0; d < head_size; ++d) {
                        dot += static_cast<double>(query[d]) * key[d];
                        dprobability += static_cast<double>(dout_head[d]) * value[d];
                    }
                    const double probability = std::exp(dot * scale - row_logsumexp);
                    const double dscore = probability * (dprobability - row_delta);

                    for (int d = 0; d < head_size; ++d) {
                        dquery[d] += dscore * key[d];
                        dkey[d] += static_cast<Scalar>(scale * dscore * query[d]);
                        dvalue[d] += static_cast<Scalar>(probability * dout_head[d]);
                    }
                }

                Scalar* dquery_head = batch_dqkv + t * qkv_row + head_offset;
                for (int d = 0; d < head_size; ++d) dquery_head[d] += static_cast<Scalar>(scale * dquery[d]);
            }
        }
    }
}

template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int,
                                        int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*, int,
                                         int, int, int);

} // namespace engine::kernels::cpu
