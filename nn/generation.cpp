// Cached decoding through GPT's own layers, and host-side sampling.
#include "nn/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/autograd.h"
#include "engine/ops/decode.h"
#include "engine/ops/layout.h"

namespace engine::nn {

KVCache::KVCache(const GPT& model, int batch, int capacity) : batch_(batch) {
    const GPTConfig& config = model.config();
    capacity_ = capacity == 0 ? config.max_seq_len : capacity;
    ENGINE_CHECK(batch > 0, "KVCache: batch " << batch << " must be positive");
    ENGINE_CHECK(capacity_ > 0 && capacity_ <= config.max_seq_len,
                 "KVCache: capacity " << capacity << " is outside [1, max_seq_len " << config.max_seq_len << "]");
    const Shape shape{batch, config.n_head, capacity_, config.n_embd / config.n_head};
    for (int layer = 0; layer < model.block_count(); ++layer) {
        keys.push_back(Tensor::zeros(shape, model.dtype(), model.device(), MemoryCategory::activations));
        values.push_back(Tensor::zeros(shape, model.dtype(), model.device(), MemoryCategory::activations));
    }
}

Tensor forward_cached(const GPT& model, const Tensor& tokens, KVCache& cache, CachedLogits logits_of) {
    ENGINE_CHECK(tokens.dim() == 2 && tokens.size(0) == cache.batch(),
                 "forward_cached: tokens " << tokens.describe() << " must be (B,T) with the cache's batch "
                                           << cache.batch());
    const int past = cache.length(), time = static_cast<int>(tokens.size(1));
    ENGINE_CHECK(past + time <= cache.capacity(),
                 "forward_cached: positions [" << past << "," << past + time << ") pass the cache's "
                                               << cache.capacity() << " (the model's max_seq_len is "
                                               << model.config().max_seq_len << ")");
    const NoGradGuard no_grad;
    // With their host values, so that embedding_at's id check reads those instead of waiting for the device.
    const Tensor device_tokens = tokens.to_keeping_host_copy(model.device());
    Tensor x = embedding_at(device_tokens, model.wte.working(model.wte.weight), model.wpe.working(model.wpe.weight),
                            past); // (B,T,C)
    for (int layer = 0; layer < model.block_count(); ++layer) {
        const Block& block = *model.h[static_cast<size_t>(layer)];
        const Tensor qkv = block.attn.c_attn.forward(block.ln_1.forward(x)); // (B,T,3C)
        const Tensor attended = attention_decode(qkv, cache.keys[static_cast<size_t>(layer)],
                                                 cache.values[static_cast<size_t>(layer)], past, block.attn.heads);
        x = add(x, block.attn.c_proj.forward(attended));
        // MLP::forward without its dropout, which would apply in training mode.
        x = add(x, block.mlp.c_proj.forward(gelu(block.mlp.c_fc.forward(block.ln_2.forward(x)))));
    }
    cache.length_ = past + time;
    Tensor hidden = model.ln_f.forward(x); // (B,T,C)
    if (logits_of == CachedLogits::last && time > 1) hidden = slice(hidden, 1, time - 1, time); // (B,1,C)
    const Tensor logits = matmul(hidden, model.wte.working(model.wte.padded_weight), /*transpose_b=*/true); // (B,T,Vp)
    const int vocabulary = model.config().vocab_size;
    return logits.size(2) == vocabulary ? logits : first_columns(logits, vocabulary); // (B,T,V)
}

void validate(const SamplingOptions& options, int vocabulary) {
    ENGINE_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0,
                 "sampling: temperature " << options.temperature << " must be finite and >= 0 (0: greedy)");
    ENGINE_CHECK(options.top_k >= 0 && options.top_k <= vocabulary,
                 "sampling: top_k " << options.top_k << " is outside [0, vocabulary " << vocabulary
                                    << "] (0: every token)");
}

int sample_token(const std::vector<double>& logits, const SamplingOptions& options, std::mt19937_64& generator) {
    const int vocabulary = static_cast<int>(logits.size());
    ENGINE_CHECK(vocabulary > 0, "sample_token: no logits");
    validate(options, vocabulary);
    for (int id = 0; id < vocabulary; ++id)
        ENGINE_CHECK(std::isfinite(logits[static_cast<size_t>(id)]),
                     "sample_token: logit " << logits[static_cast<size_t>(id)] << " of token " << id
                                            << " is not finite (a diverged model?)");
    // Candidates by descending logit, ties by ascending id: candidate 0 is the argmax.
    std::vector<int> candidates(static_cast<size_t>(vocabulary));
    std::iota(candidates.begin(), candidates.end(), 0);
    const auto more_likely = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    const int count = options.top_k == 0 ? vocabulary : options.top_k;
    std::partial_sort(candidates.begin(), candidates.begin() + count, candidates.end(), more_likely);
    if (options.temperature == 0.0 || count == 1) return candidates[0];
    const double largest = logits[candidates[0]];
    std::vector<double> cumulative(static_cast<size_t>(count));
    double total = 0.0;
    for (int index = 0; index < count; ++index) {
        total += std::exp((logits[candidates[index]] - largest) / options.temperature);
        cumulative[index] = total;
    }
    // A 53-bit uniform in [0,1) straight from the engine's bits: std::uniform_real_distribution's algorithm
    // differs between standard libraries, and a seed must give the same text everywhere.
    const double uniform = static_cast<double>(generator() >> 11) * 0x1.0p-53;
    const auto chosen = std::upper_bound(cumulative.begin(), cumulative.end(), uniform * total);
    return candidates[static_cast<size_t>(std::min<std::ptrdiff_t>(chosen - cumulative.begin(), count - 1))];
}

namespace {

// The checks every generate makes before anything runs, each naming what is wrong.
void check_request(const CausalLM& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                   const SamplingOptions& options) {
    ENGINE_CHECK(!prompt.empty(), "generate: the prompt is empty; it needs at least one token");
    for (size_t index = 0; index < prompt.size(); ++index)
        ENGINE_CHECK(prompt[index] >= 0 && prompt[index] < model.vocab_size(),
                     "generate: prompt token " << prompt[index] << " at index " << index
                                               << " is outside the vocabulary [0," << model.vocab_size() << ")");
    ENGINE_CHECK(max_new_tokens >= 0, "generate: max_new_tokens " << max_new_tokens << " must be >= 0");
    ENGINE_CHECK(static_cast<int64_t>(prompt.size()) + max_new_tokens <= model.max_seq_len(),
                 "generate: the prompt's " << prompt.size() << " tokens plus max_new_tokens " << max_new_tokens
                                           << " exceed the model's max_seq_len " << model.max_seq_len());
    validate(options, model.vocab_size());
}

} // namespace

std::vector<int32_t> generate(const CausalLM& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const SamplingOptions& options) {
    if (const auto* gpt = dynamic_cast<const GPT*>(&model)) return generate(*gpt, prompt, max_new_tokens, options);
    check_request(model, prompt, max_new_tokens, options);
    NoGradGuard no_grad;
    std::vector<int32_t> sequence = prompt;
    std::mt19937_64 generator(options.seed);
    const Tensor head = model.head_weight(); // (Vp,C)
    for (int produced = 0; produced < max_new_tokens; ++produced) {
        const int64_t length = static_cast<int64_t>(sequence.size());
        const Device device = head.device();
        const Tensor hidden = model.forward_hidden(Tensor::from_vector<int32_t>(sequence, {1, length}, device)); // (1,T,C)
        const Tensor newest = slice(hidden, 1, length - 1, length);                                         // (1,1,C)
        const Tensor logits = matmul(newest, head, /*transpose_b=*/true);                                     // (1,1,Vp)
        std::vector<double> row = cast(logits.to(Device::cpu), DType::f64).to_vector<double>();
        row.resize(static_cast<size_t>(model.vocab_size())); // the padding columns are no tokens
        sequence.push_back(sample_token(row, options, generator));
    }
    return sequence;
}

std::vector<int32_t> generate(const GPT& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const SamplingOptions& options) {
    check_request(model, prompt, max_new_tokens, options);

    std::vector<int32_t> sequence = prompt;
    if (max_new_tokens == 0) return sequence;
    std::mt19937_64 generator(options.seed);
    KVCache cache(model, 1);
    Tensor step = Tensor::from_vector<int32_t>(prompt, {1, static_cast<int64_t>(prompt.size())}, Device::cpu);
    for (int produced = 0; produced < max_new_tokens; ++produced) {
        const Tensor logits = forward_cached(model, step, cache, CachedLogits::last); // (1,1,V): the newest position
        const int64_t vocabulary = logits.size(2);
        const std::vector<double> all = cast(logits.to(Device::cpu), DType::f64).to_vector<double>();
        const std::vector<double> last(all.end() - vocabulary, all.end()); // the newest position's row
        const int32_t token = sample_token(last, options, generator);
        sequence.push_back(token);
        step = Tensor::from_vector<int32_t>({token}, {1, 1}, Device::cpu);
    }
    return sequence;
}

} // namespace engine::nn
