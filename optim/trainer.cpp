// The accumulation step: pull, validate and count, forward/backward per micro-batch, then one update.
#include "optim/trainer.h"

#include <cmath>

#include "engine/elementwise.h"
#include "optim/clip.h"
#if ENGINE_HAS_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace engine::optim {

LossNormalization parse_loss_normalization(const std::string& name) {
    if (name == "tokens") return LossNormalization::tokens;
    if (name == "mean") return LossNormalization::mean;
    ENGINE_FAIL("loss_normalization: unknown mode '" << name << "' (known: tokens, mean)");
}

OptimizerKind parse_optimizer_kind(const std::string& name) {
    if (name == "adamw") return OptimizerKind::adamw;
    if (name == "sgd") return OptimizerKind::sgd;
    ENGINE_FAIL("optimizer: unknown optimizer '" << name << "' (known: adamw, sgd)");
}

const char* loss_normalization_name(LossNormalization mode) { return mode == LossNormalization::mean ? "mean" : "tokens"; }
const char* optimizer_kind_name(OptimizerKind kind) { return kind == OptimizerKind::sgd ? "sgd" : "adamw"; }

void TrainerConfig::validate() const {
    ENGINE_CHECK(per_device_train_batch_size > 0,
                 "per_device_train_batch_size must be positive, got " << per_device_train_batch_size);
    ENGINE_CHECK(gradient_accumulation_steps > 0,
                 "gradient_accumulation_steps must be positive, got " << gradient_accumulation_steps);
    ENGINE_CHECK(std::isfinite(learning_rate) && learning_rate >= 0.0, "learning_rate must be >= 0, got " << learning_rate);
    ENGINE_CHECK(std::isfinite(weight_decay) && weight_decay >= 0.0, "weight_decay must be >= 0, got " << weight_decay);
    ENGINE_CHECK(adam_beta1 >= 0.0 && adam_beta1 < 1.0, "adam_beta1 must be in [0,1), got " << adam_beta1);
    ENGINE_CHECK(adam_beta2 >= 0.0 && adam_beta2 < 1.0, "adam_beta2 must be in [0,1), got " << adam_beta2);
    ENGINE_CHECK(std::isfinite(adam_epsilon) && adam_epsilon > 0.0, "adam_epsilon must be > 0, got " << adam_epsilon);
    ENGINE_CHECK(!std::isnan(max_grad_norm), "max_grad_norm is NaN");
    parse_schedule_type(lr_scheduler_type);
    ENGINE_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got " << warmup_steps);
    ENGINE_CHECK(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio must be in [0,1], got " << min_lr_ratio);
    ENGINE_CHECK(max_steps >= 0, "max_steps must be >= 0, got " << max_steps);
    ENGINE_CHECK(logging_steps > 0, "logging_steps must be positive, got " << logging_steps);
    ENGINE_CHECK(std::isfinite(sgd_momentum) && sgd_momentum >= 0.0, "sgd_momentum must be >= 0, got " << sgd_momentum);
    ENGINE_CHECK(every_n_layers >= 1, "every_n_layers must be >= 1, got " << every_n_layers);
    ENGINE_CHECK(segment_size >= 0, "segment_size must be >= 0 (0 = sqrt), got " << segment_size);
    ENGINE_CHECK(zero_stage == 0 || zero_stage == 1, "zero_stage must be 0 or 1, got " << zero_stage);
}

namespace {

ScheduleConfig schedule_config(const TrainerConfig& config) {
    config.validate();
    ScheduleConfig schedule;
    schedule.type = parse_schedule_type(config.lr_scheduler_type);
    schedule.learning_rate = config.learning_rate;
    schedule.warmup_steps = config.warmup_steps;
    schedule.total_steps = config.max_steps;
    schedule.min_lr_ratio = config.min_lr_ratio;
    return schedule;
}

std::unique_ptr<Optimizer> make_optimizer(const nn::GPT& model, const TrainerConfig& config, ShardRange shard) {
    if (config.optimizer == OptimizerKind::sgd)
        return std::make_unique<SGD>(model.named_parameters(),
                                     SGDOptions{config.learning_rate, config.sgd_momentum, config.weight_decay},
                                     decay_matrices_only, shard);
    return std::make_unique<AdamW>(model.named_parameters(),
                                   AdamWOptions{config.learning_rate, config.adam_beta1, config.adam_beta2,
                                                config.adam_epsilon, config.weight_decay},
                                   decay_matrices_only, shard);
}

void synchronize_device(Device device) {
#if ENGINE_HAS_CUDA
    if (device == Device::cuda) cuda::synchronize();
#else
    (void)device;
#endif
}

} // namespace

checkpoint::CheckpointPolicy TrainerConfig::checkpoint_policy() const {
    return checkpoint::CheckpointPolicy{gradient_checkpointing, every_n_layers, segment_size, offload, prefetch};
}

Trainer::Trainer(nn::GPT& model, const TrainerConfig& config, distributed::Communicator* communicator)
    : model_(model), config_(config), schedule_(schedule_config(config)), communicator_(communicator) {
    if (config_.bf16) model_.set_compute_dtype(DType::bf16); // before anything sizes itself on the activations
    model_.set_checkpointing(config.checkpoint_policy());
    parameters_ = model_.parameters();
    // Without a communicator there is one process, whose one part is the whole: zero_stage 1 changes nothing.
    if (config_.zero_stage == 1 && communicator_ != nullptr)
        zero_ = std::make_unique<ZeroShards>(parameters_, *communicator_);
    optimizer_ = make_optimizer(model_, config_, zero_ ? zero_->range() : ShardRange{});
    manual_seed(config_.seed);
}

void Trainer::set_communicator(distributed::Communicator* communicator) {
    ENGINE_CHECK(!zero_ || communicator == communicator_,
                 "trainer: with zero_stage 1 the optimizer state is sharded over the constructor's communicator; "
                 "it cannot change");
    // Sharding is decided at construction: a communicator given later would silently train unsharded.
    ENGINE_CHECK(zero_ || config_.zero_stage != 1 || communicator == nullptr || communicator->world_size() == 1,
                 "trainer: zero_stage 1 needs its communicator at construction (Trainer(model, config, communicator))");
    communicator_ = communicator;
}

void Trainer::set_loss_function(LossFunction loss_function, bool loss_is_scaled_for_ga, TargetCounting counting) {
    loss_function_ = std::move(loss_function);
    loss_is_scaled_for_ga_ = loss_is_scaled_for_ga;
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
    const nn::GPTConfig& model = model_.config();
    ENGINE_CHECK(batch.inputs.defined() && batch.inputs.dim() == 2 && batch.inputs.dtype() == DType::i32,
                 where << ": inputs must be a (B,T) i32 tensor, got "
                       << (batch.inputs.defined() ? batch.inputs.describe() : std::string("none")));
    const int64_t rows = batch.inputs.size(0);
    const int64_t time = batch.inputs.size(1);
    ENGINE_CHECK(rows > 0 && time > 0, where << ": empty inputs " << batch.inputs.describe());
    ENGINE_CHECK(time <= model.max_seq_len,
                 where << ": sequence length " << time << " exceeds the model maximum " << model.max_seq_len);
    for (int32_t token : batch.inputs.to_vector<int32_t>())
        ENGINE_CHECK(token >= 0 && token < model.vocab_size,
                     where << ": input token " << token << " is outside the vocabulary [0," << model.vocab_size << ")");
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
            ENGINE_CHECK(label == default_ignore_index || (label >= 0 && label < model.vocab_size),
                         where << ": label " << label << " is neither -100 nor in the vocabulary [0,"
                               << model.vocab_size << ")");
    }
}

double Accumulation::loss_sum() const {
    double sum = 0.0;
    for (const auto& [value, factor] : reported_losses) sum += value.item() * factor;
    return sum;
}

Tensor Trainer::micro_batch_loss(const Tensor& logits, const nn::Batch& batch, const Tensor& targets,
                                 Accumulation& window) {
    const double micro_batches = static_cast<double>(window.micro_batches);
    if (loss_function_) {
        Tensor loss = loss_function_(logits, batch, window.num_items_in_batch);
        ENGINE_CHECK(loss.defined() && loss.numel() == 1, "trainer: the custom loss must return one value");
        if (!loss_is_scaled_for_ga_) loss = multiply(loss, 1.0 / micro_batches);
        window.reported_losses.emplace_back(loss.detach(), 1.0);
        return loss;
    }
    // The built-in loss is the fused classifier: the logits die before backward (accumulate_gradients drops
    // them), so their storage can become their gradient, and the scale multiplied in next is exactly the
    // upstream gradient backward will bring, so no rescale pass runs. The logits are the padded (B,T,Vp) ones;
    // the loss sees only the first V columns.
    const int vocabulary = model_.config().vocab_size;
    if (config_.loss_normalization == LossNormalization::tokens) {
        const double inverse_items = 1.0 / static_cast<double>(window.num_items_in_batch);
        Tensor token_sum =
            cross_entropy_in_place(logits, targets, Reduction::sum, inverse_items, default_ignore_index, vocabulary);
        window.reported_losses.emplace_back(token_sum.detach(), 1.0);
        return multiply(token_sum, inverse_items);
    }
    Tensor batch_mean = cross_entropy_in_place(logits, targets, Reduction::mean, 1.0 / micro_batches,
                                               default_ignore_index, vocabulary);
    window.reported_losses.emplace_back(batch_mean.detach(), static_cast<double>(count_targets(batch))); // a token sum
    return multiply(batch_mean, 1.0 / micro_batches);
}

Accumulation Trainer::accumulate_gradients(const std::vector<nn::Batch>& batches) {
    ENGINE_CHECK(current_tape().empty(),
                 "trainer: the tape holds " << current_tape().size()
                     << " nodes of a forward that was never backpropagated; run evaluation under NoGradGuard");
    const Device device = model_.device();
    synchronize_device(device);
    reset_peak(device);
    if (device != Device::cpu) reset_peak(Device::cpu); // the pinned host tier is accounted on the host
    window_start_ = std::chrono::steady_clock::now();
    if (communicator_ != nullptr) window_counters_ = communicator_->counters();

    ENGINE_CHECK(!batches.empty(), "trainer: an accumulation window needs at least one micro-batch");
    ENGINE_CHECK(static_cast<int>(batches.size()) <= config_.gradient_accumulation_steps,
                 "trainer: " << batches.size() << " micro-batches exceed gradient_accumulation_steps "
                             << config_.gradient_accumulation_steps);
    // Everything is checked and counted before the first forward: the normaliser must be known before the
    // first backward, and a bad batch must be found before any gradient moves.
    Accumulation window;
    window.micro_batches = static_cast<int>(batches.size());
    for (size_t index = 0; index < batches.size(); ++index) {
        validate_batch(batches[index], index);
        window.num_items_in_batch += count_targets(batches[index]);
        window.tokens += batches[index].inputs.numel();
    }
    // The window's one count reduction, before its first backward: every rank divides by the global count,
    // so a rank with more padding does not weigh more (Hugging Face's average_tokens_across_devices).
    window.rank_num_items_in_batch = window.num_items_in_batch;
    if (communicator_ != nullptr) window.num_items_in_batch = communicator_->all_reduce_count(window.num_items_in_batch);
    ENGINE_CHECK(loss_function_ || window.num_items_in_batch > 0,
                 "trainer: the " << batches.size() << " micro-batches of this step hold no valid target (all -100)");

    try {
        for (const nn::Batch& batch : batches) {
            // Uploaded with their host values, which validate_batch has checked: the ops' id checks read those
            // instead of the device, so no forward waits for the device.
            const Tensor inputs = batch.inputs.to_keeping_host_copy(device, MemoryCategory::activations);
            const Tensor targets = loss_function_ ? Tensor()
                                                  : shift_targets(batch).to_keeping_host_copy(device, MemoryCategory::activations);
            Tensor loss;
            {
                // The logits go out of scope before backward so that the loss node's backward frees them
                // (B·T·V bytes: the largest activation of a GPT-2 step).
                // (B,T,Vp) for the built-in loss; a custom loss gets the real (B,T,V).
                const Tensor logits = loss_function_ ? model_.forward(inputs) : model_.forward_padded(inputs);
                loss = micro_batch_loss(logits, batch, targets, window);
            }
            backward(loss);
        }
    } catch (...) {
        // Leave the model as the step found it: no half-accumulated gradients, no dangling tape.
        current_tape().clear();
        optimizer_->zero_grad();
        throw;
    }
    return window;
}

// The first parameter (in model order) whose accumulated gradient holds a NaN or an Inf, for the error.
static std::string first_nonfinite_gradient(const nn::GPT& model) {
    for (const auto& [name, parameter] : model.named_parameters())
        if (!all_finite(parameter.grad())) return name;
    return "none (the gradients are finite; the loss is not)";
}

double Trainer::rank_gradient_scale() const {
    if (communicator_ == nullptr) return 1.0;
    const bool divided_by_global_count = loss_function_ ? loss_is_scaled_for_ga_
                                                        : config_.loss_normalization == LossNormalization::tokens;
    return divided_by_global_count ? 1.0 : 1.0 / static_cast<double>(communicator_->world_size());
}

StepResult Trainer::apply_update(const Accumulation& window) {
    StepResult result;
    result.learning_rate = schedule_.at(step());
    const double gradient_scale = rank_gradient_scale(); // folded into the norm and the update kernel
    double loss_sum = 0.0;
    try {
        if (zero_) {
            zero_->reduce_scatter_gradients(); // ZeRO-1: each rank gets the summed gradients of its own part
        } else if (communicator_ != nullptr) {
            // The window's one gradient reduction: after its last backward, before the norm, so that the norm,
            // the clip and the update are the same on every rank.
            std::vector<Tensor> gradients;
            gradients.reserve(parameters_.size());
            for (const Tensor& parameter : parameters_) gradients.push_back(parameter.grad());
            communicator_->all_reduce_gradients(gradients);
        }
        result.grad_norm =
            (zero_ ? std::sqrt(zero_->gradient_sum_of_squares()) : global_grad_norm(parameters_)) * gradient_scale;
        loss_sum = window.loss_sum(); // after the norm's read: the device is idle, nothing waits
        if (communicator_ != nullptr) loss_sum = communicator_->all_reduce_value(loss_sum); // the loss sum's reduction
    } catch (...) {
        // Partly reduced gradients must not be stepped on or added to by a retry. (A failed collective usually
        // leaves the ranks out of step for good; see docs/DISTRIBUTED.md.)
        optimizer_->zero_grad();
        throw;
    }
    // The built-in losses report token sums, so the global token mean is their sum over the global count.
    result.loss = loss_function_ ? loss_sum * gradient_scale : loss_sum / static_cast<double>(window.num_items_in_batch);
    // Caught before the optimizer runs: a NaN or Inf must never reach the weights or the moments.
    if (!std::isfinite(result.loss) || !std::isfinite(result.grad_norm)) {
        const std::string parameter = first_nonfinite_gradient(model_);
        optimizer_->zero_grad();
        if (!config_.skip_nonfinite) {
            ENGINE_FAIL("trainer: non-finite values at step " << step() + 1 << " (loss " << result.loss << ", grad norm "
                        << result.grad_norm << "); first parameter with a non-finite gradient: " << parameter
                        << ". No weight was updated. --skip-nonfinite skips such steps instead");
        }
        ++skipped_steps_;
        result.skipped = true;
    } else {
        optimizer_->set_learning_rate(result.learning_rate);
        optimizer_->step(clip_coefficient(result.grad_norm, config_.max_grad_norm) * gradient_scale); // the one clip
        if (zero_) zero_->all_gather_parameters(); // every rank's updated part, to every replica
        model_.refresh_working_copies();           // bf16: the forward's copies of the new masters
        optimizer_->zero_grad();
    }

    synchronize_device(model_.device());
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
    result.step = step();
    result.tokens = window.tokens;
    result.num_items_in_batch = window.num_items_in_batch;
    result.rank_num_items_in_batch = window.rank_num_items_in_batch;
    result.micro_batches = window.micro_batches;
    result.tokens_per_second = result.seconds > 0.0 ? static_cast<double>(window.tokens) / result.seconds : 0.0;
    if (communicator_ != nullptr) result.communication = communicator_->counters() - window_counters_;
    result.memory = memory_stats(model_.device());
    if (model_.device() != Device::cpu) {
        // Offloaded inputs live in pinned host memory, which the host's account holds: report them here too.
        const MemoryStats host = memory_stats(Device::cpu);
        const int pinned = static_cast<int>(MemoryCategory::pinned_host);
        result.memory.current_by_category[pinned] = host.current_by_category[pinned];
        result.memory.peak_by_category[pinned] = host.peak_by_category[pinned];
    }
    return result;
}

std::optional<StepResult> Trainer::train_step(const nn::BatchSource& source) {
    std::vector<nn::Batch> batches;
    while (static_cast<int>(batches.size()) < config_.gradient_accumulation_steps) {
        std::optional<nn::Batch> batch = source();
        if (!batch) break; // a last partial window normalises by what it has
        batches.push_back(std::move(*batch));
    }
    if (batches.empty()) return std::nullopt;
    return apply_update(accumulate_gradients(batches));
}

} // namespace engine::optim
