// The model's parameters tensor by tensor, for the terms that go by tensors: the stage-0 all-reduce's staging bucket,
// the batch-invariant mode's sums and slots, the per-tensor collectives' count.
#include <algorithm>
#include <vector>

#include "engine/distributed/communicator.h"
#include "planner/memory_model.h"

namespace engine::planner {

namespace {

// Every trainable tensor's element count as its gradient shows it (GPT-2's wte: its V rows).
std::vector<size_t> parameter_tensor_elements(const nn::ModelConfig& model_config) {
    std::vector<size_t> elements;
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        const size_t width = static_cast<size_t>(config.hidden_size), vocabulary = static_cast<size_t>(config.vocab_size);
        const size_t key_value = static_cast<size_t>(config.key_value_width());
        const size_t intermediate = static_cast<size_t>(config.intermediate_size);
        elements.push_back(vocabulary * width);
        for (int layer = 0; layer < config.num_hidden_layers; ++layer)
            elements.insert(elements.end(), {width, width * width, key_value * width, key_value * width, width * width,
                                             width, intermediate * width, intermediate * width, width * intermediate});
        elements.push_back(width);
        if (!config.tie_word_embeddings) elements.push_back(vocabulary * width);
        return elements;
    }
    const nn::GPTConfig& config = model_config.gpt();
    const size_t width = static_cast<size_t>(config.n_embd);
    elements = {static_cast<size_t>(config.vocab_size) * width, static_cast<size_t>(config.max_seq_len) * width};
    for (int layer = 0; layer < config.n_layer; ++layer)
        elements.insert(elements.end(), {width, width, 3 * width * width, 3 * width, width * width, width, width, width,
                                         4 * width * width, 4 * width, 4 * width * width, width});
    elements.insert(elements.end(), {width, width});
    return elements;
}

} // namespace

size_t all_reduce_bucket_bytes(const nn::ModelConfig& config, size_t element_bytes) {
    const size_t bucket = distributed::Communicator::bucket_bytes / element_bytes;
    size_t small = 0;
    for (size_t count : parameter_tensor_elements(config))
        if (count < bucket) small += count;
    return std::min(bucket, small) * element_bytes;
}

void hold_all_reduce(MemoryPrediction& prediction, size_t beside, size_t bucket, const char* moment) {
    prediction.all_reduce_bucket_bytes = bucket;
    prediction.at(MemoryCategory::workspace) = std::max(prediction.of(MemoryCategory::workspace), bucket);
    if (beside + bucket > prediction.peak_bytes) {
        prediction.peak_bytes = beside + bucket;
        prediction.peak_moment = moment;
    }
    prediction.unified_peak_bytes = std::max(prediction.unified_peak_bytes, beside + bucket);
}

int parameter_tensor_count(const nn::ModelConfig& config) {
    if (config.is_llama()) return 2 + (config.llama().tie_word_embeddings ? 0 : 1) + 9 * config.layers();
    return 4 + 12 * config.layers(); // wte, wpe, ln_f's weight and bias; per layer 2 norms and 4 biased linears
}

size_t batch_invariant_sum_bytes(const nn::ModelConfig& config, DType) {
    // GPT-2's wte: its gradient's (V,C) view, not the padded Vp rows.
    return parameter_count(config, config.vocab_size()) * sizeof(double) +
           static_cast<size_t>(parameter_tensor_count(config)) * sizeof(int32_t);
}

} // namespace engine::planner
