// The causal-LM trainer: batch validation, target counting and the fused classifier loss over ModuleTrainer.
#include "optim/trainer.h"

namespace engine::optim {

Trainer::Trainer(nn::CausalLM& model, const TrainerConfig& config, distributed::Communicator* communicator)
    : ModuleTrainer(model, config, communicator), model_(model) {
    model_.set_mlp_tile_tokens(config.shape.mlp_tile_tokens); // the shape's problem() was asked in the base
}

void Trainer::set_loss_function(LossFunction loss_function, TargetCounting counting) {
    ENGINE_CHECK(!loss_function || config().shape.loss_chunk_tokens == 0,
                 "trainer: a custom loss reads the whole logits, so it cannot run with loss_chunk_tokens "
                     << config().shape.loss_chunk_tokens << " (the streaming LM head); set it to 0");
    loss_function_ = std::move(loss_function);
    counting_ = counting;
}

Tensor Trainer::shift_targets(const nn::Batch& batch) {
    if (batch.shift_labels.defined()) return batch.shift_labels.to(Device::cpu);
    const int64_t rows = batch.labels.size(0);
    const int64_t time = batch.labels.size(1);
    const std::vector<int32_t> labels = batch.labels.to_vector<int32_t>();
    std::vector<int32_t> targets(labels.size(), default_ignore_index); // (B,T)
    for (int64_t row = 0; row < rows; ++row)
        for (int64_t t = 0; t + 1 < time; ++t) targets[row * time + t] = labels[row * time + t + 1];
    return Tensor::from_vector<int32_t>(targets, {rows, time}, Device::cpu);
}

int64_t Trainer::count_targets(const nn::Batch& batch) const {
    const Tensor counted = counting_ == TargetCounting::all_labels ? batch.labels : shift_targets(batch);
    int64_t count = 0;
    for (int32_t label : counted.to_vector<int32_t>()) count += label != default_ignore_index ? 1 : 0;
    return count;
}

void Trainer::validate_batch(const nn::Batch& batch, size_t index) const {
    const std::string where = "trainer: micro-batch " + std::to_string(index);
    ENGINE_CHECK(batch.inputs.defined() && batch.inputs.dim() == 2 && batch.inputs.dtype() == DType::i32,
                 where << ": inputs must be a (B,T) i32 tensor, got "
                       << (batch.inputs.defined() ? batch.inputs.describe() : std::string("none")));
    const int64_t rows = batch.inputs.size(0);
    const int64_t time = batch.inputs.size(1);
    ENGINE_CHECK(rows > 0 && time > 0, where << ": empty inputs " << batch.inputs.describe());
    ENGINE_CHECK(time <= model_.max_seq_len(),
                 where << ": sequence length " << time << " exceeds the model maximum " << model_.max_seq_len());
    for (int32_t token : batch.inputs.to_vector<int32_t>())
        ENGINE_CHECK(token >= 0 && token < model_.vocab_size(),
                     where << ": input token " << token << " is outside the vocabulary [0," << model_.vocab_size() << ")");
    const bool builtin_loss = !loss_function_;
    const bool need_labels = !batch.shift_labels.defined() || counting_ == TargetCounting::all_labels;
    ENGINE_CHECK(!need_labels || batch.labels.defined(), where << ": no labels (and no shift_labels)");
    for (const Tensor* labels : {&batch.labels, &batch.shift_labels}) {
        if (!labels->defined()) continue;
        ENGINE_CHECK(labels->dtype() == DType::i32, where << ": labels " << labels->describe() << " must be i32");
        if (!builtin_loss && counting_ == TargetCounting::all_labels) continue; // a custom loss owns their shape
        ENGINE_CHECK(labels->shape() == batch.inputs.shape(),
                     where << ": labels " << labels->describe() << " do not match inputs " << batch.inputs.describe());
        if (!builtin_loss) continue;
        for (int32_t label : labels->to_vector<int32_t>())
            ENGINE_CHECK(label == default_ignore_index || (label >= 0 && label < model_.vocab_size()),
                         where << ": label " << label << " is neither -100 nor in the vocabulary [0,"
                               << model_.vocab_size() << ")");
    }
    // Packed documents: checked here, before any forward, as the ids are.
    if (batch.positions.defined())
        check_document_positions(where.c_str(), batch.positions, rows, time, batch.positions.device(),
                                 model_.max_seq_len());
}

LossSum Trainer::micro_batch_loss(const nn::Batch& batch, const LossScale& scale) {
    // Uploaded with their host values, which validate_batch has checked: the ops' id checks read those
    // instead of the device, so no forward waits for the device.
    const Device device = model_.device();
    device_inputs_ = Tensor();
    device_targets_ = Tensor();
    device_positions_ = Tensor();
    device_inputs_ = batch.inputs.to_keeping_host_copy(device, MemoryCategory::activations);
    const Tensor& inputs = device_inputs_;
    // Packed documents: the positions go with the ids (their host copy serves the ops' layout checks).
    if (batch.positions.defined())
        device_positions_ = batch.positions.to_keeping_host_copy(device, MemoryCategory::activations);
    const Tensor& positions = device_positions_;
    // The logits die when this returns, before backward, so that the loss node's backward frees them (B·T·V
    // bytes: the largest activation of a language model step).
    // The head hooks (ZeRO-2 and 3 may shard the head) run inside logits and padded_logits; the streaming head reads
    // head_weight() itself, between head_input and head_done.
    if (loss_function_) return loss_function_(model_.logits(model_.forward_hidden(inputs, positions)), batch); // (B,T,V)
    device_targets_ = shift_targets(batch).to_keeping_host_copy(device, MemoryCategory::activations);
    const Tensor& targets = device_targets_;
    // The fused classifier: the logits' storage becomes their gradient, written now with the factor the
    // trainer multiplies the sum by, which is exactly the upstream gradient backward will bring, so no
    // rescale pass runs. The logits are the padded (B,T,Vp) ones; the loss sees only the first V columns.
    if (const int chunk = config().shape.loss_chunk_tokens; chunk > 0) {
        // The streaming LM head: the same loss and gradients a chunk of tokens at a time, never the logits.
        // (The head's handle sees the gathered storage whichever argument is evaluated first.)
        LossSum result{linear_cross_entropy(model_.head_input(model_.forward_hidden(inputs, positions)),
                                            model_.head_weight(), targets, Reduction::sum, chunk, scale.factor,
                                            default_ignore_index, model_.vocab_size()),
                       scale.items};
        model_.head_done();
        return result;
    }
    const Tensor logits = model_.padded_logits(model_.forward_hidden(inputs, positions));
    return {cross_entropy_in_place(logits, targets, Reduction::sum, scale.factor, default_ignore_index,
                                   model_.vocab_size()),
            scale.items};
}

namespace {

// Rows [first, first + count) of a (B, ...) tensor, copied where it is (the loader's device) in the memory category of
// the scope, as the loader made the batch; an undefined tensor stays undefined.
Tensor rows_of(const Tensor& tensor, int64_t first, int64_t count) {
    if (!tensor.defined()) return tensor;
    Shape shape = tensor.shape();
    const size_t row_bytes = tensor.nbytes() / static_cast<size_t>(shape[0]);
    shape[0] = count;
    Tensor rows = Tensor::empty(shape, tensor.dtype(), tensor.device());
    copy_bytes(rows.raw_data(), rows.device(), static_cast<const char*>(tensor.raw_data()) + static_cast<size_t>(first) * row_bytes,
               tensor.device(), static_cast<size_t>(count) * row_bytes);
    return rows;
}

} // namespace

std::vector<MicroBatch> Trainer::micro_batches_of(const std::vector<nn::Batch>& batches, bool chunked) {
    // Everything is checked and counted before the first forward: the normaliser must be known before the
    // first backward, and a bad batch must be found before any gradient moves.
    for (size_t index = 0; index < batches.size(); ++index) validate_batch(batches[index], index);
    const int64_t chunk = chunked ? config().batch_invariant_chunk : 0;
    const std::vector<nn::Batch>* units = &batches;
    if (chunk > 0) {
        // The batch-invariant mode: every chunk of `chunk` sequences is one forward and backward of its own.
        std::vector<nn::Batch> chunks;
        for (size_t index = 0; index < batches.size(); ++index) {
            const nn::Batch& batch = batches[index];
            const int64_t rows = batch.inputs.size(0);
            ENGINE_CHECK(rows % chunk == 0, "trainer: micro-batch " << index << " has " << rows
                                                << " sequences, which batch_invariant_chunk " << chunk
                                                << " does not divide");
            for (const Tensor* part : {&batch.labels, &batch.shift_labels, &batch.positions})
                ENGINE_CHECK(!part->defined() || (part->dim() >= 1 && part->size(0) == rows),
                             "trainer: micro-batch " << index << ": " << part->describe() << " has not the "
                                                     << rows << " rows of its inputs, so it cannot be split into chunks");
            for (int64_t first = 0; first < rows; first += chunk)
                chunks.push_back({rows_of(batch.inputs, first, chunk), rows_of(batch.labels, first, chunk),
                                  rows_of(batch.shift_labels, first, chunk), rows_of(batch.positions, first, chunk)});
        }
        chunk_batches_ = std::move(chunks); // the closures below keep references into it: not touched again
        units = &chunk_batches_;
    }
    std::vector<MicroBatch> micro_batches;
    micro_batches.reserve(units->size());
    for (const nn::Batch& batch : *units) {
        MicroBatch micro;
        micro.items = count_targets(batch);
        micro.tokens = batch.inputs.numel();
        micro.loss = [this, &batch](const LossScale& scale) { return micro_batch_loss(batch, scale); };
        micro_batches.push_back(std::move(micro));
    }
    return micro_batches;
}

namespace {
// Drops the last micro-batch's device copies once the window is over (or has thrown).
struct ReleaseOnExit {
    Tensor& inputs;
    Tensor& targets;
    Tensor& positions;
    std::vector<nn::Batch>& chunks;
    ~ReleaseOnExit() {
        inputs = targets = positions = Tensor();
        chunks.clear();
    }
};
} // namespace

Accumulation Trainer::accumulate_gradients(const std::vector<nn::Batch>& batches) {
    const ReleaseOnExit release{device_inputs_, device_targets_, device_positions_, chunk_batches_};
    return accumulate(micro_batches_of(batches, true));
}

ModuleTrainer::Evaluation Trainer::evaluate(const std::vector<nn::Batch>& batches) {
    const ReleaseOnExit release{device_inputs_, device_targets_, device_positions_, chunk_batches_};
    return ModuleTrainer::evaluate(micro_batches_of(batches));
}

std::optional<StepResult> Trainer::train_step(const nn::BatchSource& source) {
    const std::vector<nn::Batch> batches = pull_window(source, config().shape.gradient_accumulation_steps);
    if (batches.empty()) return std::nullopt;
    return apply_update(accumulate_gradients(batches));
}

} // namespace engine::optim
