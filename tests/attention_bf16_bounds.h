// The per-element error bounds of bf16 attention, shared by the CPU test (bf16 against f32) and the CUDA test
// (CUDA bf16 against CPU bf16): double-precision sums of the terms that rounding P and dS to bf16 perturbs.
#pragma once

#include <cmath>
#include <vector>

namespace engine::test {

// KVH: kv heads of grouped-query attention, 0 for NH (multi-head); qkv rows are C + 2*KVH*C/NH wide.
struct AttentionShape {
    int B, T, C, NH, KVH = 0;
    constexpr int kv_heads() const { return KVH == 0 ? NH : KVH; }
    constexpr int qkv_width() const { return C + 2 * kv_heads() * (C / NH); }
};

// forward (B,T,C): sum_j p_ij |v_jd|, p from a double softmax of the widened q, k. A relative change of at most
// r in every p_ij moves o_id by at most r times it.
// backward (B,T,qkv_width): for dQ_id sum_j |dS_ij||k_jd|, for dK_jd sum_i |dS_ij||q_id|, for dV_jd
// sum_i p_ij |dout_id| (dK and dV also summed over the query heads sharing the kv head), with
// p_ij = exp(scale·s_ij - lse_i) and dS_ij = scale·p_ij (dP_ij - D_i) from the given out and lse.
struct AttentionBounds {
    std::vector<double> forward, backward;
};

inline AttentionBounds attention_bounds(const std::vector<float>& qkv, const std::vector<float>& dout,
                                        const std::vector<float>& out, const std::vector<float>& logsumexp,
                                        AttentionShape shape) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, hs = C / NH, group = NH / shape.kv_heads();
    const size_t width = size_t(shape.qkv_width());
    const double scale = 1.0 / std::sqrt(double(hs));
    AttentionBounds bounds{std::vector<double>(size_t(B) * T * C, 0.0), std::vector<double>(size_t(B) * T * width, 0.0)};
    // Column of element d of query head h (part 0) or of its kv head's key (1) or value (2) in a qkv row.
    auto place = [&](int part, int h, int d) {
        const size_t kv_head = size_t(h / group);
        return part == 0 ? size_t(h) * hs + d : C + (part - 1) * (width - C) / 2 + kv_head * hs + d;
    };
    auto x = [&](int b, int t, int part, int h, int d) { return double(qkv[(size_t(b) * T + t) * width + place(part, h, d)]); };
    auto g = [&](int b, int t, int column) { return double(dout[(size_t(b) * T + t) * C + column]); };
    std::vector<double> scores(static_cast<size_t>(T));
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            for (int i = 0; i < T; ++i) {
                double max_score = -INFINITY, sum = 0.0, row_dot = 0.0;
                for (int j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (int d = 0; d < hs; ++d) dot += x(b, i, 0, h, d) * x(b, j, 1, h, d);
                    scores[j] = dot * scale;
                    max_score = std::max(max_score, scores[j]);
                }
                for (int j = 0; j <= i; ++j) sum += std::exp(scores[j] - max_score);
                for (int j = 0; j <= i; ++j) {
                    const double p = std::exp(scores[j] - max_score) / sum;
                    for (int d = 0; d < hs; ++d)
                        bounds.forward[(size_t(b) * T + i) * C + h * hs + d] += p * std::fabs(x(b, j, 2, h, d));
                }
                if (dout.empty()) continue;
                for (int d = 0; d < hs; ++d) row_dot += g(b, i, h * hs + d) * out[(size_t(b) * T + i) * C + h * hs + d];
                for (int j = 0; j <= i; ++j) {
                    double dprobability = 0.0;
                    for (int d = 0; d < hs; ++d) dprobability += g(b, i, h * hs + d) * x(b, j, 2, h, d);
                    const double p = std::exp(scores[j] - logsumexp[(size_t(b) * NH + h) * T + i]);
                    const double dscore = std::fabs(scale * p * (dprobability - row_dot));
                    for (int d = 0; d < hs; ++d) {
                        const int column = h * hs + d;
                        bounds.backward[(size_t(b) * T + i) * width + place(0, h, d)] += dscore * std::fabs(x(b, j, 1, h, d));
                        bounds.backward[(size_t(b) * T + j) * width + place(1, h, d)] += dscore * std::fabs(x(b, i, 0, h, d));
                        bounds.backward[(size_t(b) * T + j) * width + place(2, h, d)] += p * std::fabs(g(b, i, column));
                    }
                }
            }
        }
    }
    return bounds;
}

} // namespace engine::test
