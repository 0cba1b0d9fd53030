// A fixed token stream cut into micro-batches, shared by the tests that train the same global batches under
// different plans (tests/test_planner.cpp, tests/test_memory_model_llama.cpp).
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

} // namespace engine::testing
