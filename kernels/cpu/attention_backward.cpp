// Causal multi-head self-attention backward, recomputing the probabilities from q, k and the saved logsumexp:
// the reference for the CUDA twin kernels/cuda/attention_backward.cu. bf16: f32 arithmetic, P and dS rounded to
// bf16 before their products (as the tensor-core kernel's operands), gradients summed per head in f32 and
// added into dqkv with one rounding each.
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace engine::kernels::cpu {

namespace {

// One (batch, head) of the bf16 backward; dquery, dkey, dvalue: (T, head_size) f32 sums, zeroed here.
void attention_head_backward_bf16(bfloat16* batch_dqkv, const bfloat16* dout, const bfloat16* batch_qkv,
                                  const bfloat16* out, const float* logsumexp, int b, int h, int T, int C, int NH,
                                  std::vector<float>& dquery, std::vector<float>& dkey, std::vector<float>& dvalue) {
    const int head_size = C / NH;
    const int64_t qkv_row = 3 * static_cast<int64_t>(C), head_offset = static_cast<int64_t>(h) * head_size;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
    std::fill(dquery.begin(), dquery.end(), 0.0f);
    std::fill(dkey.begin(), dkey.end(), 0.0f);
    std::fill(dvalue.begin(), dvalue.end(), 0.0f);
    auto q = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + head_offset + d]); };
    auto k = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + C + head_offset + d]); };
    auto v = [&](int t, int d) { return to_float(batch_qkv[t * qkv_row + 2 * int64_t(C) + head_offset + d]); };
    for (int t = 0; t < T; ++t) {
        const int64_t out_offset = (static_cast<int64_t>(b) * T + t) * C + head_offset;
        const float row_logsumexp = logsumexp[(static_cast<int64_t>(b) * NH + h) * T + t];
        float row_delta = 0.0f; // D_t = dout_t . out_t
        for (int d = 0; d < head_size; ++d) row_delta += to_float(dout[out_offset + d]) * to_float(out[out_offset + d]);
        for (int t2 = 0; t2 <= t; ++t2) {
            float dot = 0.0f, dprobability = 0.0f;
            for (int d = 0; d < head_size; ++d) {
                dot += q(t, d) * k(t2, d);
                dprobability += to_float(dout[out_offset + d]) * v(t2, d);
            }
            const float probability = std::exp(dot * scale - row_logsumexp);
            const float dscore = scale * probability * (dprobability - row_delta);
            const float probability_bf16 = to_float(to_bfloat16(probability)), dscore_bf16 = to_float(to_bfloat16(dscore));
            for (int d = 0; d < head_size; ++d) {
                dquery[size_t(t) * head_size + d] += dscore_bf16 * k(t2, d);
                dkey[size_t(t2) * head_size + d] += dscore_bf16 * q(t, d);
                dvalue[size_t(t2) * head_size + d] += probability_bf16 * to_float(dout[out_offset + d]);
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        for (int part = 0; part < 3; ++part) {
            const std::vector<float>& sums = part == 0 ? dquery : part == 1 ? dkey : dvalue;
            bfloat16* destination = batch_dqkv + t * qkv_row + part * int64_t(C) + head_offset;
            for (int d = 0; d < head_size; ++d)
                destination[d] = to_bfloat16(to_float(destination[d]) + sums[size_t(t) * head_size + d]);
        }
    }
}

} // namespace

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* dout, const Scalar* qkv, const Scalar* out,
                        const Compute<Scalar>* logsumexp, int B, int T, int C, int NH) {
    if constexpr (std::is_same_v<Scalar, bfloat16>) {
        const size_t head_elements = size_t(T) * (C / NH);
        std::vector<float> dquery(head_elements), dkey(head_elements), dvalue(head_elements); // (T, head_size)
        for (int b = 0; b < B; ++b) {
            for (int h = 0; h < NH; ++h) {
                attention_head_backward_bf16(dqkv + int64_t(b) * T * 3 * C, dout, qkv + int64_t(b) * T * 3 * C, out,
                                             logsumexp, b, h, T, C, NH, dquery, dkey, dvalue);
            }
        }
        return;
    } else {
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
}

template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int,
                                        int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*, int,
                                         int, int, int);
template void attention_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, const bfloat16*, const float*,
                                           int, int, int, int);

} // namespace engine::kernels::cpu
