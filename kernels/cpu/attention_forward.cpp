// Causal grouped-query self-attention forward that keeps only the per-row logsumexp: the reference for the CUDA
// twin kernels/cuda/attention_forward.cu. f64 is the specification (plain loops in double, used by the
// gradchecks); f32 computes in float through the BLAS, per (batch, head) block S = Q K^T and O = P V by sgemm
// around a causal row softmax. bf16 has a file of its own, as on CUDA (attention_bf16_forward.cpp). With positions
// (packed documents) a query's keys start at its document's first token (cpu_kernels.h).
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/attention_heads.h"
#include "kernels/cpu/attention_panels.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace engine::kernels::cpu {

namespace {

// f32 through sgemm, per (batch, head) block on OpenMP threads and per panel of queries r0..r1-1
// (attention_panels.h: the products are cut so that OpenBLAS does not start threads of its own): scores
// S = scale·Q K^T against keys k0..r1-1 (the causal triangle, squared off per panel; k0 the panel's first query's
// document start, 0 without positions: no query of the panel sees a key before it), then per query t the softmax
// over keys start(t)..t in float with the maximum subtracted, zeros for the panel's other keys, and O = P V written
// straight into out. Q, K and V are read in place (leading dimension: the packed qkv row), O written in place (leading
// dimension C). The panel cut and the products depend on the shape only, so each output element is one fixed
// sequence of float operations whichever thread runs its block.
void attention_forward_f32(float* out, float* logsumexp, const float* qkv, const int32_t* positions, int B, int T,
                           int C, int NH, int KVH) {
    const PackedQkv packed{C, NH, KVH, C / NH};
    const int head_size = packed.head_size;
    const int ld = int(packed.row());
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
    const int panel_rows = attention_panel_rows(T);
    parallel_for(int64_t(B) * NH, attention_blocks_per_chunk(T, head_size, 1), [&](int64_t first, int64_t end) {
        std::vector<float> probabilities(size_t(panel_rows) * T); // (panel_rows, T): scores, then P in place
        for (int64_t block = first; block < end; ++block) {
            const int b = int(block / NH), h = int(block % NH);
            const float* batch_qkv = qkv + static_cast<int64_t>(b) * T * ld;
            const int32_t* row_positions = batch_positions(positions, b, T);
            float* block_logsumexp = logsumexp + (static_cast<int64_t>(b) * NH + h) * T;       // (T)
            float* block_out = out + static_cast<int64_t>(b) * T * C + int64_t(h) * head_size; // (T, head_size), ld C
            for (int r0 = 0; r0 < T; r0 += panel_rows) {
                const int r1 = std::min(T, r0 + panel_rows), rows = r1 - r0;      // queries r0..r1-1
                const int k0 = document_start(row_positions, r0), keys = r1 - k0; // keys k0..r1-1
                float* P = probabilities.data();                                  // (rows, keys), ld keys
                sgemm_in_pieces(CblasNoTrans, CblasTrans, rows, keys, head_size, scale,
                                batch_qkv + int64_t(r0) * ld + packed.query(h), ld,
                                batch_qkv + int64_t(k0) * ld + packed.key(h), ld, 0.0f, P, keys);
                for (int t = r0; t < r1; ++t) {
                    // Keys first..last live (panel columns), the panel's others masked.
                    const int first = document_start(row_positions, t) - k0, last = t - k0;
                    float* row = P + int64_t(t - r0) * keys;
                    // The maximum is exact in any order: a vector reduction (the scalar chain took a third of
                    // the softmax's time).
                    float max_score = row[first];
#pragma omp simd reduction(max : max_score)
                    for (int t2 = first + 1; t2 <= last; ++t2) max_score = row[t2] > max_score ? row[t2] : max_score;
                    float exp_sum = 0.0f;
                    for (int t2 = first; t2 <= last; ++t2) {
                        row[t2] = std::exp(row[t2] - max_score);
                        exp_sum += row[t2];
                    }
                    for (int t2 = first; t2 <= last; ++t2) row[t2] /= exp_sum;
                    // The mask: P V sums keys start..t only. The product still multiplies the zeros by the
                    // panel's other values, so a non-finite V there makes other rows NaN too (0·inf), where the
                    // f64 loops never read it; that value's own query reads it anyway, so the loss is NaN either way.
                    std::fill(row, row + first, 0.0f);
                    std::fill(row + last + 1, row + keys, 0.0f);
                    block_logsumexp[t] = max_score + std::log(exp_sum);
                }
                sgemm_in_pieces(CblasNoTrans, CblasNoTrans, rows, head_size, keys, 1.0f, P, keys,
                                batch_qkv + int64_t(k0) * ld + packed.value(h), ld, 0.0f, block_out + int64_t(r0) * C,
                                C);
            }
        }
    });
}

} // namespace

template <typename Scalar>
void attention_forward(Scalar* out, Compute<Scalar>* logsumexp, const Scalar* qkv, const int32_t* positions, int B,
                       int T, int C, int NH, int KVH) {
    if constexpr (std::is_same_v<Scalar, bfloat16>) {
        attention_forward_bf16(out, logsumexp, qkv, positions, B, T, C, NH, KVH);
        return;
    } else if constexpr (std::is_same_v<Scalar, float>) {
        attention_forward_f32(out, logsumexp, qkv, positions, B, T, C, NH, KVH);
        return;
    } else {
    const PackedQkv packed{C, NH, KVH, C / NH};
    const int head_size = packed.head_size;
    const int64_t qkv_row = packed.row();
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
    parallel_for(int64_t(B) * NH, attention_blocks_per_chunk(T, head_size, 1), [&](int64_t first, int64_t end) {
        std::vector<double> scores(static_cast<size_t>(T));
        std::vector<double> accumulator(static_cast<size_t>(head_size));
        for (int64_t block = first; block < end; ++block) {
            const int b = int(block / NH), h = int(block % NH);
            const Scalar* batch_qkv = qkv + static_cast<int64_t>(b) * T * qkv_row;
            const int32_t* row_positions = batch_positions(positions, b, T);
            const int64_t head_offset = packed.query(h), key_offset = packed.key(h), value_offset = packed.value(h);
            for (int t = 0; t < T; ++t) {
                const Scalar* query = batch_qkv + t * qkv_row + head_offset;
                const int start = document_start(row_positions, t);

                // Scaled scores against keys start..t only (the causal mask within the document), tracking the
                // maximum so the exponentials below never overflow.
                double max_score = -std::numeric_limits<double>::infinity();
                for (int t2 = start; t2 <= t; ++t2) {
                    const Scalar* key = batch_qkv + t2 * qkv_row + key_offset;
                    double dot = 0.0;
                    for (int d = 0; d < head_size; ++d) dot += static_cast<double>(query[d]) * key[d];
                    scores[t2] = dot * scale;
                    if (scores[t2] > max_score) max_score = scores[t2];
                }

                double exp_sum = 0.0;
                for (int t2 = start; t2 <= t; ++t2) {
                    scores[t2] = std::exp(scores[t2] - max_score);
                    exp_sum += scores[t2];
                }

                for (int d = 0; d < head_size; ++d) accumulator[d] = 0.0;
                for (int t2 = start; t2 <= t; ++t2) {
                    const Scalar* value = batch_qkv + t2 * qkv_row + value_offset;
                    const double probability = scores[t2] / exp_sum;
                    for (int d = 0; d < head_size; ++d) accumulator[d] += probability * value[d];
                }

                Scalar* out_head = out + (static_cast<int64_t>(b) * T + t) * C + head_offset;
                for (int d = 0; d < head_size; ++d) out_head[d] = static_cast<Scalar>(accumulator[d]);
                logsumexp[(static_cast<int64_t>(b) * NH + h) * T + t] =
                    static_cast<Scalar>(max_score + std::log(exp_sum));
            }
        }
    });
    }
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int, int, int, int);
template void attention_forward<bfloat16>(bfloat16*, float*, const bfloat16*, const int32_t*, int, int, int, int, int);

} // namespace engine::kernels::cpu
