// Attention of new queries over a key/value cache: the reference for kernels/cuda/attention_decode.cu and the
// CPU path of cached decoding (engine/ops/attention_decode.cpp). Inference only.
#include "kernels/cpu/decode_kernels.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace engine::kernels::cpu {

template <typename Scalar>
void attention_decode(Scalar* out, Scalar* key_cache, Scalar* value_cache, const Scalar* qkv, int B, int Tnew,
                      int past, int max_T, int C, int NH) {
    // f32/f64 accumulate in double, as attention_forward<double> does (so f64 decode at past 0 is the forward
    // bitwise; the f32 forward sums in float through sgemm, so f32 agrees to rounding); bf16 in its compute type.
    using Accumulator = std::conditional_t<std::is_same_v<Scalar, bfloat16>, float, double>;
    const int head_size = C / NH;
    const int64_t qkv_row = 3 * static_cast<int64_t>(C);
    auto cache_row = [&](int b, int h, int position) { // offset of one (batch, head, position) row of a cache
        return ((static_cast<int64_t>(b) * NH + h) * max_T + position) * head_size;
    };
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tnew; ++t)
            for (int h = 0; h < NH; ++h) {
                const Scalar* row = qkv + (static_cast<int64_t>(b) * Tnew + t) * qkv_row + int64_t(h) * head_size;
                for (int d = 0; d < head_size; ++d) {
                    key_cache[cache_row(b, h, past + t) + d] = row[C + d];
                    value_cache[cache_row(b, h, past + t) + d] = row[2 * static_cast<int64_t>(C) + d];
                }
            }

    const Accumulator scale = Accumulator(1) / std::sqrt(static_cast<Accumulator>(head_size));
    std::vector<Accumulator> scores(static_cast<size_t>(past + Tnew)), accumulator(static_cast<size_t>(head_size));
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            for (int t = 0; t < Tnew; ++t) {
                const int last_key = past + t; // causal: keys 0..past+t
                const Scalar* query = qkv + (static_cast<int64_t>(b) * Tnew + t) * qkv_row + int64_t(h) * head_size;
                Accumulator max_score = -std::numeric_limits<Accumulator>::infinity();
                for (int t2 = 0; t2 <= last_key; ++t2) {
                    const Scalar* key = key_cache + cache_row(b, h, t2);
                    Accumulator dot = 0;
                    for (int d = 0; d < head_size; ++d)
                        dot += static_cast<Accumulator>(widen(query[d])) * static_cast<Accumulator>(widen(key[d]));
                    scores[t2] = dot * scale;
                    if (scores[t2] > max_score) max_score = scores[t2];
                }
                Accumulator exp_sum = 0;
                for (int t2 = 0; t2 <= last_key; ++t2) {
                    scores[t2] = std::exp(scores[t2] - max_score);
                    exp_sum += scores[t2];
                }
                for (Accumulator& value : accumulator) value = 0;
                for (int t2 = 0; t2 <= last_key; ++t2) {
                    const Scalar* value = value_cache + cache_row(b, h, t2);
                    const Accumulator probability = scores[t2] / exp_sum;
                    for (int d = 0; d < head_size; ++d)
                        accumulator[d] += probability * static_cast<Accumulator>(widen(value[d]));
                }
                Scalar* out_head = out + (static_cast<int64_t>(b) * Tnew + t) * C + int64_t(h) * head_size;
                for (int d = 0; d < head_size; ++d)
                    out_head[d] = narrow<Scalar>(static_cast<Compute<Scalar>>(accumulator[d]));
            }
        }
    }
}

template void attention_decode<float>(float*, float*, float*, const float*, int, int, int, int, int, int);
template void attention_decode<double>(double*, double*, double*, const double*, int, int, int, int, int, int);
template void attention_decode<bfloat16>(bfloat16*, bfloat16*, bfloat16*, const bfloat16*, int, int, int, int, int,
                                         int);

} // namespace engine::kernels::cpu
