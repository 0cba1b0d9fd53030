// Causal grouped-query self-attention backward, recomputing the probabilities from q, k and the saved logsumexp:
// the reference for the CUDA twin kernels/cuda/attention_backward.cu. f64 is the specification (plain loops in
// double, used by the gradchecks). f32 computes in float through the BLAS: per (batch, kv head) block and query
// head, S and dP by sgemm, dS elementwise, and dV, dQ, dK added into dqkv by sgemm with beta = 1. bf16 has a
// file of its own, as on CUDA (attention_bf16_backward.cpp). With positions (packed documents) a query's keys start
// at its document's first token (cpu_kernels.h).
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/attention_heads.h"
#include "kernels/cpu/attention_panels.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace engine::kernels::cpu {

namespace {

// Query head h of one batch in the f32 backward, panel by panel of queries r0..r1-1 (attention_panels.h) against
// keys k0..r1-1 (k0 the panel's first document start, as the forward's), with `probabilities` and `dscores`
// (rows, T) scratch:
//   S = scale·Q K^T, P = exp(S - logsumexp) for keys start(t)..t, 0 for the others (the forward's P, recomputed);
//   dP = dO V^T; D_t = dO_t·O_t (= sum_t2 P dP, the softmax Jacobian's shared term); dS = P∘(dP - D);
//   dQ += scale·dS K, dV += P^T dO, dK += scale·dS^T Q, straight into dqkv (beta = 1: dqkv is +=).
// Every product is an sgemm reading q, k, v, out and dout in place (leading dimensions: the packed qkv row, C). dV
// and dK of a key thus receive one rounded term per (query head, panel), heads and panels ascending.
void attention_head_backward_f32(float* batch_dqkv, const float* batch_dout, const float* batch_qkv,
                                 const float* batch_out, const float* head_logsumexp, const int32_t* row_positions,
                                 int h, int T, int panel_rows, const PackedQkv& packed,
                                 std::vector<float>& probabilities, std::vector<float>& dscores) {
    const int head_size = packed.head_size, C = packed.C, ld = int(packed.row());
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_size));
    const float* query = batch_qkv + packed.query(h); // (T, head_size), ld qkv row; dquery etc. likewise
    const float* key = batch_qkv + packed.key(h);
    const float* value = batch_qkv + packed.value(h);
    const float* dout = batch_dout + packed.query(h); // (T, head_size), ld C
    const float* out = batch_out + packed.query(h);   // (T, head_size), ld C
    float* dquery = batch_dqkv + packed.query(h);
    float* dkey = batch_dqkv + packed.key(h);
    float* dvalue = batch_dqkv + packed.value(h);
    for (int r0 = 0; r0 < T; r0 += panel_rows) {
        const int r1 = std::min(T, r0 + panel_rows), rows = r1 - r0;      // queries r0..r1-1
        const int k0 = document_start(row_positions, r0), keys = r1 - k0; // keys k0..r1-1
        float* P = probabilities.data();                                  // (rows, keys), ld keys
        float* dS = dscores.data();                                       // (rows, keys), ld keys: dP, then dS in place
        const float* panel_query = query + int64_t(r0) * ld;
        const float* panel_dout = dout + int64_t(r0) * C;
        const float* panel_key = key + int64_t(k0) * ld;
        sgemm_in_pieces(CblasNoTrans, CblasTrans, rows, keys, head_size, scale, panel_query, ld, panel_key, ld, 0.0f, P,
                        keys);
        sgemm_in_pieces(CblasNoTrans, CblasTrans, rows, keys, head_size, 1.0f, panel_dout, C, value + int64_t(k0) * ld,
                        ld, 0.0f, dS, keys);
        for (int t = r0; t < r1; ++t) {
            float row_delta = 0.0f; // D_t
            for (int d = 0; d < head_size; ++d) row_delta += dout[int64_t(t) * C + d] * out[int64_t(t) * C + d];
            const int first = document_start(row_positions, t) - k0, last = t - k0; // live panel columns
            float* p_row = P + int64_t(t - r0) * keys;
            float* ds_row = dS + int64_t(t - r0) * keys;
            const float row_logsumexp = head_logsumexp[t];
            for (int t2 = first; t2 <= last; ++t2) {
                p_row[t2] = std::exp(p_row[t2] - row_logsumexp);
                ds_row[t2] = p_row[t2] * (ds_row[t2] - row_delta);
            }
            std::fill(p_row, p_row + first, 0.0f); // the mask: other documents' keys, and later keys
            std::fill(ds_row, ds_row + first, 0.0f);
            std::fill(p_row + last + 1, p_row + keys, 0.0f);
            std::fill(ds_row + last + 1, ds_row + keys, 0.0f);
        }
        sgemm_in_pieces(CblasNoTrans, CblasNoTrans, rows, head_size, keys, scale, dS, keys, panel_key, ld, 1.0f,
                        dquery + int64_t(r0) * ld, ld);
        sgemm_in_pieces(CblasTrans, CblasNoTrans, keys, head_size, rows, 1.0f, P, keys, panel_dout, C, 1.0f,
                        dvalue + int64_t(k0) * ld, ld);
        sgemm_in_pieces(CblasTrans, CblasNoTrans, keys, head_size, rows, scale, dS, keys, panel_query, ld, 1.0f,
                        dkey + int64_t(k0) * ld, ld);
    }
}

} // namespace

template <typename Scalar>
void attention_backward(Scalar* dqkv, const Scalar* dout, const Scalar* qkv, const Scalar* out,
                        const Compute<Scalar>* logsumexp, const int32_t* positions, int B, int T, int C, int NH,
                        int KVH) {
    const PackedQkv packed{C, NH, KVH, C / NH};
    const int head_size = C / NH, group = NH / KVH;
    const int64_t qkv_row = packed.row();
    // dK and dV of a kv head gather from its whole group of query heads, so the unit of work is a (batch, kv head)
    // block with the group's query heads in ascending order inside, the order a serial loop over heads takes.
    // Blocks write disjoint columns of dqkv.
    const int64_t blocks_per_chunk = attention_blocks_per_chunk(T, head_size, group);
    if constexpr (std::is_same_v<Scalar, bfloat16>) {
        attention_backward_bf16(dqkv, dout, qkv, out, logsumexp, positions, B, T, C, NH, KVH);
        return;
    } else if constexpr (std::is_same_v<Scalar, float>) {
        const int panel_rows = attention_panel_rows(T);
        parallel_for(int64_t(B) * KVH, blocks_per_chunk, [&](int64_t first, int64_t end) {
            std::vector<float> probabilities(size_t(panel_rows) * T), dscores(size_t(panel_rows) * T); // (rows, T)
            for (int64_t block = first; block < end; ++block) {
                const int b = int(block / KVH), kv_head = int(block % KVH);
                // The group's query heads in ascending order: dK and dV of the kv head receive their products in
                // that order, whichever thread runs the block.
                for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
                    attention_head_backward_f32(dqkv + int64_t(b) * T * qkv_row, dout + int64_t(b) * T * C,
                                                qkv + int64_t(b) * T * qkv_row, out + int64_t(b) * T * C,
                                                logsumexp + (int64_t(b) * NH + h) * T, batch_positions(positions, b, T),
                                                h, T, panel_rows, packed, probabilities, dscores);
                }
            }
        });
        return;
    } else {
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
    parallel_for(int64_t(B) * KVH, blocks_per_chunk, [&](int64_t first, int64_t end) {
        std::vector<double> dquery(static_cast<size_t>(head_size));
        for (int64_t block = first; block < end; ++block) {
            const int b = int(block / KVH), kv_head = int(block % KVH);
            const Scalar* batch_qkv = qkv + static_cast<int64_t>(b) * T * qkv_row;
            Scalar* batch_dqkv = dqkv + static_cast<int64_t>(b) * T * qkv_row;
            const int32_t* row_positions = batch_positions(positions, b, T);
            for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
                const int64_t head_offset = packed.query(h), key_offset = packed.key(h), value_offset = packed.value(h);
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
                    for (int t2 = document_start(row_positions, t); t2 <= t; ++t2) {
                        // Query heads of a group share these rows: their terms add in ascending head order.
                        const Scalar* key = batch_qkv + t2 * qkv_row + key_offset;
                        const Scalar* value = batch_qkv + t2 * qkv_row + value_offset;
                        Scalar* dkey = batch_dqkv + t2 * qkv_row + key_offset;
                        Scalar* dvalue = batch_dqkv + t2 * qkv_row + value_offset;

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
    });
    }
}

template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, const int32_t*,
                                        int, int, int, int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*,
                                         const int32_t*, int, int, int, int, int);
template void attention_backward<bfloat16>(bfloat16*, const bfloat16*, const bfloat16*, const bfloat16*, const float*,
                                           const int32_t*, int, int, int, int, int);

} // namespace engine::kernels::cpu
