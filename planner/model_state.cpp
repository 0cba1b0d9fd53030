// The model state a run holds (planner/memory_model.h, predict_model_state): for a full fine-tune the parameters'
// masters, copies, gradients and optimizer state; for LoRA and QLoRA the frozen base, dense or in NF4, beside the
// adapters, which train. docs/MEMORY.md ("LoRA and QLoRA") derives each term.
#include <algorithm>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "planner/memory_model.h"

#include "engine/distributed/zero_partition.h"
#include "planner/step_terms.h"

namespace engine::planner {
namespace {

// One decoder layer's adaptable linear layers, as named_modules() names them in layer `index`.
struct LinearLayer {
    std::string name;
    size_t in = 0, out = 0;
};

std::vector<LinearLayer> layer_linears(const nn::ModelConfig& model_config, int index) {
    if (model_config.is_llama()) {
        const nn::LlamaConfig& config = model_config.llama();
        const size_t width = static_cast<size_t>(config.hidden_size);
        const size_t key_value = static_cast<size_t>(config.key_value_width());
        const size_t intermediate = static_cast<size_t>(config.intermediate_size);
        const std::string layer = "model.layers." + std::to_string(index) + ".";
        return {{layer + "self_attn.q_proj", width, width},       {layer + "self_attn.k_proj", width, key_value},
                {layer + "self_attn.v_proj", width, key_value},   {layer + "self_attn.o_proj", width, width},
                {layer + "mlp.gate_proj", width, intermediate},    {layer + "mlp.up_proj", width, intermediate},
                {layer + "mlp.down_proj", intermediate, width}};
    }
    const size_t width = static_cast<size_t>(model_config.gpt().n_embd);
    const std::string layer = "h." + std::to_string(index) + ".";
    return {{layer + "attn.c_attn", width, 3 * width},
            {layer + "attn.c_proj", width, width},
            {layer + "mlp.c_fc", width, 4 * width},
            {layer + "mlp.c_proj", 4 * width, width}};
}

// The bytes of an NF4 weight of n elements (engine/ops/nf4.h): codes, scale codes and second-level scales.
size_t nf4_bytes(size_t n) {
    const size_t blocks = (n + 63) / 64;
    return (n + 1) / 2 + blocks + 4 * ((blocks + 255) / 256);
}

// LoRA's parameters: the frozen base's bytes, dense (in the step's dtype) and in NF4, and the adapters' elements.
struct AdapterTerms {
    size_t frozen_dense_bytes = 0;
    size_t nf4_bytes = 0;
    size_t trainable = 0;
};

AdapterTerms adapter_terms(const nn::ModelConfig& config, const FineTuning& tuning, DType dtype) {
    const nn::LoraConfig& lora = *tuning.lora;
    if (const std::optional<std::string> problem = lora.problem()) ENGINE_FAIL("predict_model_state: LoRA: " << *problem);
    AdapterTerms terms;
    size_t linear_elements = 0; // every decoder layer's linear weights
    const size_t rank = static_cast<size_t>(lora.r);
    for (int index = 0; index < config.layers(); ++index) {
        for (const LinearLayer& linear : layer_linears(config, index)) {
            linear_elements += linear.in * linear.out;
            if (tuning.nf4) terms.nf4_bytes += nf4_bytes(linear.in * linear.out);
            if (!nn::lora_target_matches(lora, linear.name)) continue;
            ENGINE_CHECK(rank <= std::min(linear.in, linear.out),
                         "predict_model_state: LoRA r " << lora.r << " exceeds layer '" << linear.name << "' (" << linear.in
                                                   << " -> " << linear.out << ")");
            terms.trainable += rank * (linear.in + linear.out);
        }
    }
    // Each target must name a layer, as apply_lora requires (the LM head is never adapted).
    for (const std::string& target : lora.target_modules) {
        nn::LoraConfig one = lora;
        one.target_modules = {target};
        bool used = false;
        for (int index = 0; index < config.layers() && !used; ++index)
            for (const LinearLayer& linear : layer_linears(config, index)) used = used || nn::lora_target_matches(one, linear.name);
        ENGINE_CHECK(used, "predict_model_state: LoRA target module '" << target << "' matches no adaptable linear layer of "
                                                                   << config.to_string());
    }
    // The base: every parameter but the adapters, frozen and stored in the step's dtype; NF4 layers' weights as codes.
    const size_t base = parameter_count(config, config.is_llama() ? config.vocab_size() : config.padded_vocab_size());
    terms.frozen_dense_bytes = (base - (tuning.nf4 ? linear_elements : 0)) * dtype_size(dtype);
    return terms;
}

} // namespace

ModelState predict_model_state(const nn::ModelConfig& config, DType dtype, OptimizerKind optimizer, int optimizer_shards,
                               const FineTuning& tuning) {
    config.validate();
    ENGINE_CHECK(optimizer_shards >= 1, "predict_model_state: optimizer_shards " << optimizer_shards << " must be >= 1");
    ENGINE_CHECK(tuning.lora || !tuning.nf4, "predict_model_state: NF4 without LoRA adapters: nothing would train");
    const size_t element = dtype_size(dtype);
    const size_t wide = dtype_size(compute_dtype(dtype));
    ModelState state;
    // What trains: every parameter over its storage (GPT-2's padded token rows too), or the adapters.
    size_t stored = parameter_count(config, config.is_llama() ? config.vocab_size() : config.padded_vocab_size());
    size_t real = parameter_count(config, config.vocab_size());
    if (tuning.lora) {
        const AdapterTerms adapters = adapter_terms(config, tuning, dtype);
        state.frozen_parameters = adapters.frozen_dense_bytes + adapters.nf4_bytes;
        stored = real = adapters.trainable;
    }
    state.trainable = stored;
    state.master_parameters = stored * wide;
    state.working_copies = element == wide ? 0 : stored * element;
    state.constant_buffers = config.is_llama() ? llama_rope_table_bytes(config.llama(), dtype) : 0;
    state.parameters = state.master_parameters + state.working_copies + state.frozen_parameters + state.constant_buffers;
    state.gradients = stored * wide;
    // The optimizer keeps state for the real rows only; ZeRO-1 for rank 0's part (distributed::ZeroPartition: the parts
    // padded to equal size, a whole number of the collectives' pieces).
    const distributed::ZeroPartition partition =
        distributed::ZeroPartition::of(static_cast<int64_t>(real), optimizer_shards, wide);
    const size_t kept = optimizer_shards > 1 ? static_cast<size_t>(partition.end(0) - partition.begin(0)) : real;
    state.optimizer_state = static_cast<size_t>(optimizer_state_tensors(optimizer)) * kept * wide;
    return state;
}

std::string model_state_report(const nn::ModelConfig& config, DType dtype, OptimizerKind optimizer, int optimizer_shards,
                               const FineTuning& tuning) {
    const ModelState state = predict_model_state(config, dtype, optimizer, optimizer_shards, tuning);
    const ModelState full = predict_model_state(config, dtype, optimizer, optimizer_shards);
    const std::string precision = dtype == DType::bf16 ? "bf16 mixed precision" : dtype_name(dtype);
    std::ostringstream text;
    text << "model: " << config.to_string() << "\n";
    if (tuning.lora) {
        const nn::LoraConfig& lora = *tuning.lora;
        text << "LoRA: r " << lora.r << ", alpha " << lora.lora_alpha << ", dropout " << lora.lora_dropout << " on";
        for (const std::string& target : lora.target_modules) text << " " << target;
        text << (tuning.nf4 ? "; the base's linear weights in NF4 (--load-in-4bit)" : "") << "; " << state.trainable
             << " parameters train\n";
    }
    text << precision << ", optimizer " << optimizer_kind_name(optimizer)
         << (optimizer_shards > 1 ? ", ZeRO-1 over " + std::to_string(optimizer_shards) + " ranks" : "") << "\n";
    text << "model state, exact to the byte (a full fine-tune's in brackets):\n";
    const auto row = [&](const char* name, size_t bytes, size_t full_bytes) {
        text << "  " << std::left << std::setw(16) << name << std::right << std::setw(14) << mebibytes(bytes) << "  ["
             << mebibytes(full_bytes) << "]\n";
    };
    row("parameters", state.parameters, full.parameters);
    row("gradients", state.gradients, full.gradients);
    row("optimizer_state", state.optimizer_state, full.optimizer_state);
    row("total", state.total(), full.total());
    if (tuning.lora)
        text << "  of the parameters: the frozen base " << mebibytes(state.frozen_parameters)
             << (tuning.nf4 ? " (NF4 linear weights, the rest in the step's dtype)" : " (in the step's dtype)")
             << ", the adapters' masters " << mebibytes(state.master_parameters)
             << (state.working_copies > 0 ? " and bf16 copies " + mebibytes(state.working_copies) : std::string())
             << (state.constant_buffers > 0 ? ", the RoPE tables " + mebibytes(state.constant_buffers) : std::string())
             << "\n";
    return text.str();
}

} // namespace engine::planner
