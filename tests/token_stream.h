// A fixed token stream cut into micro-batches, shared by the tests that train the same global batches under
// different plans (tests/test_planner.cpp, tests/test_memory_model_llama.cpp), and the same with padded labels
// (tests/test_streaming_head.cpp, tests/test_tiled_mlp.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "nn/io/batch.h"

namespace engine::testing {

// Sequences of `length` tokens below `vocab_size`, `micro_batch` at a time, labels equal to the inputs (the
// trainer shifts them). Sequence s is the same whatever the micro-batch, so every plan sees the same global
// batches; `cursor` counts the sequences handed out.
inline nn::BatchSource token_stream_batches(int vocab_size, int micro_batch, int length, int& cursor) {
    return [vocab_size, micro_batch, length, &cursor]() -> std::optional<nn::Batch> {
        std::vector<int32_t> tokens(static_cast<size_t>(micro_batch) * length);
        for (size_t index = 0; index < tokens.size(); ++index) {
            const uint64_t position = static_cast<uint64_t>(cursor) * length + index;
            tokens[index] = static_cast<int32_t>((position * 2654435761u + position / 7) % vocab_size);
        }
        cursor += micro_batch;
        nn::Batch batch;
        batch.inputs = Tensor::from_vector(tokens, {micro_batch, length}, Device::cpu);
        batch.labels = Tensor::from_vector(tokens, {micro_batch, length}, Device::cpu);
        return batch;
    };
}

// token_stream_batches of two sequences at a time with every third label of the second sequence padded out
// (ignore_index -100), as a padded batch's.
inline nn::BatchSource padded_label_batches(int vocab_size, int length, int& cursor) {
    return [tokens = token_stream_batches(vocab_size, 2, length, cursor), length]() -> std::optional<nn::Batch> {
        std::optional<nn::Batch> next = tokens();
        if (!next) return next;
        std::vector<int32_t> labels = next->labels.to_vector<int32_t>();
        for (int t = 0; t < length; t += 3) labels[static_cast<size_t>(length + t)] = -100;
        next->labels = Tensor::from_vector<int32_t>(labels, {2, length}, Device::cpu);
        return next;
    };
}

} // namespace engine::testing
