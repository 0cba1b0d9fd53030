// Sampling from a GPT with a key/value cache: the prompt runs once (prefill), then each new token costs one
// position, attending to the cached keys and values. Inference only: everything runs under NoGradGuard.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "nn/gpt.h"

namespace engine::nn {

// Which positions forward_cached makes logits for.
enum class CachedLogits { all, last };

// Per block, the keys and values of every position decoded so far, on the model's device in its compute
// dtype: keys[l], values[l] (B,NH,capacity,HS), category activations.
class KVCache {
public:
    // capacity: the positions it holds, at most the model's max_seq_len (0: exactly that).
    KVCache(const GPT& model, int batch, int capacity = 0);
    int batch() const { return batch_; }
    int capacity() const { return capacity_; }
    int length() const { return length_; } // positions filled: the next token's position
    void clear() { length_ = 0; }          // forgets the positions (the memory is kept and overwritten)

    std::vector<Tensor> keys, values;

private:
    friend Tensor forward_cached(const GPT& model, const Tensor& tokens, KVCache& cache, CachedLogits logits);
    int batch_ = 0, capacity_ = 0, length_ = 0;
};

// tokens (B,Tnew) i32 at positions [cache.length(), cache.length()+Tnew) -> logits (B,Tnew,V), equal (up to
// the GEMMs' summation order) to the full forward's at those positions; appends their keys and values. Dropout
// is identity (inference). Throws naming max_seq_len when the positions pass the cache. CachedLogits::last:
// the newest position's logits alone (B,1,V), the only ones a sampler reads: the head runs over one row per
// sequence, so a prefill of T tokens never makes (B,T,V).
Tensor forward_cached(const GPT& model, const Tensor& tokens, KVCache& cache, CachedLogits logits = CachedLogits::all);

struct SamplingOptions {
    double temperature = 1.0; // 0: greedy (argmax); else softmax(logits / temperature)
    int top_k = 0;            // 0: the whole vocabulary; else the k most likely tokens (ties: lower id first)
    uint64_t seed = 0;        // of the std::mt19937_64 that draws each token
};
// Throws naming temperature (negative or not finite) or top_k (negative, or above vocabulary).
void validate(const SamplingOptions& options, int vocabulary);

// One token from a row of logits: argmax at temperature 0 (the lowest id among equal maxima), else a draw
// from the tempered softmax over the top_k candidates with one 53-bit uniform of `generator`.
int sample_token(const std::vector<double>& logits, const SamplingOptions& options, std::mt19937_64& generator);

// The prompt followed by max_new_tokens sampled tokens (batch 1). The prompt is non-empty, its ids inside the
// vocabulary, and prompt + new tokens fit max_seq_len; each is checked, with an error naming it, before
// anything runs.
std::vector<int32_t> generate(const GPT& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const SamplingOptions& options);
// The same for any causal LM: a GPT through its key/value cache (above); another (Llama) without one, each new token
// running forward_hidden over the whole sequence so far and the head over its newest position only (the (1,T,V)
// logits are never made). Quadratic in the length: for the short samples of a fine-tuned model's check.
std::vector<int32_t> generate(const CausalLM& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                              const SamplingOptions& options);

} // namespace engine::nn
