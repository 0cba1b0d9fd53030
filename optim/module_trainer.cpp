// The generic accumulation step: count the window, forward/backward per micro-batch, then one update; and
// TrainerConfig's rules, in one place.
#include "optim/module_trainer.h"

#include <cmath>
#include <sstream>

#include "engine/elementwise.h"
#include "engine/profiling.h"
#include "optim/clip.h"
#include "engine/cuda/runtime.h"

namespace engine::optim {

LossNormalization LossNormalization::parse(const std::string& name) {
    if (name == "tokens") return tokens;
    if (name == "mean") return mean;
    ENGINE_FAIL("loss_normalization: unknown mode '" << name << "' (known: tokens, mean)");
}

double LossNormalization::factor(int64_t items, int64_t num_items_in_batch, int micro_batches, DType dtype) const {
    if (mode == Mode::tokens) return 1.0 / static_cast<double>(num_items_in_batch);
    const double per_item = items > 0 ? 1.0 / static_cast<double>(items) : 1.0;
    const double per_batch = 1.0 / static_cast<double>(micro_batches);
    if (dtype == DType::f64) return per_item * per_batch;
    return static_cast<double>(static_cast<float>(per_item) * static_cast<float>(per_batch)); // f32, bf16: float
}

LossNormalization parse_loss_normalization(const std::string& name) { return LossNormalization::parse(name); }

OptimizerKind parse_optimizer_kind(const std::string& name) {
    if (name == "adamw") return OptimizerKind::adamw;
    if (name == "sgd") return OptimizerKind::sgd;
    ENGINE_FAIL("optimizer: unknown optimizer '" << name << "' (known: adamw, sgd)");
}

const char* loss_normalization_name(LossNormalization normalization) { return normalization.name(); }
const char* optimizer_kind_name(OptimizerKind kind) { return kind == OptimizerKind::sgd ? "sgd" : "adamw"; }

namespace {
template <typename Value>
std::string text(const Value& value) {
    std::ostringstream out;
    out << value;
    return out.str();
}
} // namespace

std::optional<ConfigProblem> TrainerConfig::problem() const {
    struct Rule {
        bool holds;
        const char* field;
        std::string reason;
    };
    // Every field with a rule, in declaration order; seed, skip_nonfinite and bf16 take any value.
    const Rule rules[] = {
        {per_device_train_batch_size > 0, "per_device_train_batch_size", "must be positive, got " + text(per_device_train_batch_size)},
        {gradient_accumulation_steps > 0, "gradient_accumulation_steps", "must be positive, got " + text(gradient_accumulation_steps)},
        {std::isfinite(learning_rate) && learning_rate >= 0.0, "learning_rate", "must be >= 0, got " + text(learning_rate)},
        {std::isfinite(weight_decay) && weight_decay >= 0.0, "weight_decay", "must be >= 0, got " + text(weight_decay)},
        {adam_beta1 >= 0.0 && adam_beta1 < 1.0, "adam_beta1", "must be in [0,1), got " + text(adam_beta1)},
        {adam_beta2 >= 0.0 && adam_beta2 < 1.0, "adam_beta2", "must be in [0,1), got " + text(adam_beta2)},
        {std::isfinite(adam_epsilon) && adam_epsilon > 0.0, "adam_epsilon", "must be > 0, got " + text(adam_epsilon)},
        {!std::isnan(max_grad_norm), "max_grad_norm", "is NaN (<= 0 turns clipping off)"},
        {lr_scheduler_type == "constant" || lr_scheduler_type == "cosine", "lr_scheduler_type",
         "unknown schedule '" + lr_scheduler_type + "' (known: constant, cosine)"},
        {warmup_steps >= 0, "warmup_steps", "must be >= 0, got " + text(warmup_steps)},
        {min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "min_lr_ratio", "must be in [0,1], got " + text(min_lr_ratio)},
        {max_steps >= 0, "max_steps", "must be >= 0, got " + text(max_steps)},
        {logging_steps > 0, "logging_steps", "must be positive, got " + text(logging_steps)},
        {loss_normalization.mode == LossNormalization::Mode::tokens || loss_normalization.mode == LossNormalization::Mode::mean,
         "loss_normalization", "is neither tokens nor mean"},
        {optimizer == OptimizerKind::adamw || optimizer == OptimizerKind::sgd, "optimizer", "is neither adamw nor sgd"},
        {std::isfinite(sgd_momentum) && sgd_momentum >= 0.0, "sgd_momentum", "must be >= 0, got " + text(sgd_momentum)},
        {every_n_layers >= 1, "every_n_layers", "must be >= 1, got " + text(every_n_layers)},
        {segment_size >= 0, "segment_size", "must be >= 1, or 0 for sqrt(layers), got " + text(segment_size)},
        {!offload || gradient_checkpointing, "offload",
         "moves checkpointed segment inputs to host memory, so it needs gradient_checkpointing"},
        {!prefetch || offload, "prefetch", "prefetches offloaded inputs, so it needs offload"},
        {zero_stage == 0 || zero_stage == 1, "zero_stage", "must be 0 or 1, got " + text(zero_stage)},
    };
    for (const Rule& rule : rules)
        if (!rule.holds) return ConfigProblem{rule.field, rule.reason};
    return std::nullopt;
}

void TrainerConfig::validate() const {
    if (const std::optional<ConfigProblem> found = problem()) ENGINE_FAIL(found->field << " " << found->reason);
}

checkpoint::CheckpointPolicy TrainerConfig::checkpoint_policy() const {
    return checkpoint::CheckpointPolicy{gradient_checkpointing, every_n_layers, segment_size, offload, prefetch};
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

std::unique_ptr<Optimizer> make_optimizer(const nn::Module& model, const TrainerConfig& config, ShardRange shard) {
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
    cuda::synchronize(device);
}

// The first parameter (in model order) whose accumulated gradient holds a NaN or an Inf, for the error.
std::string first_nonfinite_gradient(const nn::Module& model) {
    for (const auto& [name, parameter] : model.named_parameters())
        if (!all_finite(parameter.grad())) return name;
    return "none (the gradients are finite; the loss is not)";
}

} // namespace

ModuleTrainer::ModuleTrainer(nn::Module& model, const TrainerConfig& config, distributed::Communicator* communicator)
    : model_(model), config_(config), schedule_(schedule_config(config)), communicator_(communicator) {
    ENGINE_CHECK(!model_.parameters().empty(), "trainer: the module has no parameters to train");
    if (config_.bf16) model_.set_compute_dtype(DType::bf16); // before anything sizes itself on the activations
    model_.set_checkpointing(config.checkpoint_policy());
    parameters_ = model_.parameters();
    device_ = parameters_.front().device();
    loss_dtype_ = model_.compute_dtype() == DType::bf16 ? DType::f32 : parameters_.front().dtype();
    // Without a communicator there is one process, whose one part is the whole: zero_stage 1 changes nothing.
    if (config_.zero_stage == 1 && communicator_ != nullptr)
        zero_ = std::make_unique<ZeroShards>(parameters_, *communicator_);
    optimizer_ = make_optimizer(model_, config_, zero_ ? zero_->range() : ShardRange{});
    manual_seed(config_.seed);
}

void ModuleTrainer::set_communicator(distributed::Communicator* communicator) {
    ENGINE_CHECK(!zero_ || communicator == communicator_,
                 "trainer: with zero_stage 1 the optimizer state is sharded over the constructor's communicator; "
                 "it cannot change");
    // Sharding is decided at construction: a communicator given later would silently train unsharded.
    ENGINE_CHECK(zero_ || config_.zero_stage != 1 || communicator == nullptr || communicator->world_size() == 1,
                 "trainer: zero_stage 1 needs its communicator at construction (Trainer(model, config, communicator))");
    communicator_ = communicator;
}

double Accumulation::loss_sum() const {
    double sum = 0.0;
    for (const Tensor& value : reported_losses) sum += value.item();
    return sum;
}

Accumulation ModuleTrainer::accumulate(const std::vector<MicroBatch>& micro_batches) {
    // A forward dropped without backward (in grad mode) left only unreachable nodes: free them first. What
    // remains is a live result's graph, which the window's backward would consume: that is refused.
    current_tape().release_unreachable();
    ENGINE_CHECK(current_tape().empty(),
                 "trainer: the tape holds " << current_tape().size()
                     << " nodes of a forward that was never backpropagated; run evaluation under NoGradGuard");
    ENGINE_CHECK(!micro_batches.empty(), "trainer: an accumulation window needs at least one micro-batch");
    ENGINE_CHECK(static_cast<int>(micro_batches.size()) <= config_.gradient_accumulation_steps,
                 "trainer: " << micro_batches.size() << " micro-batches exceed gradient_accumulation_steps "
                             << config_.gradient_accumulation_steps);
    synchronize_device(device_);
    reset_peak(device_);
    if (device_ != Device::cpu) reset_peak(Device::cpu); // the pinned host tier is accounted on the host
    window_start_ = std::chrono::steady_clock::now();
    if (communicator_ != nullptr) window_counters_ = communicator_->counters();

    // The whole window is counted before the first forward: token mode's normaliser must be known before the
    // first backward (MicroBatch says why the count is not learnt from the forwards).
    Accumulation window;
    window.micro_batches = static_cast<int>(micro_batches.size());
    for (size_t index = 0; index < micro_batches.size(); ++index) {
        const MicroBatch& micro = micro_batches[index];
        ENGINE_CHECK(micro.items >= 0 && micro.loss,
                     "trainer: micro-batch " << index << " has " << micro.items << " items"
                                             << (micro.loss ? "" : " and no loss function"));
        window.num_items_in_batch += micro.items;
        window.tokens += micro.tokens;
    }
    // The window's one count reduction, before its first backward: every rank divides by the global count,
    // so a rank with more padding does not weigh more (Hugging Face's average_tokens_across_devices).
    window.rank_num_items_in_batch = window.num_items_in_batch;
    if (communicator_ != nullptr) window.num_items_in_batch = communicator_->all_reduce_count(window.num_items_in_batch);
    ENGINE_CHECK(window.num_items_in_batch > 0,
                 "trainer: the " << micro_batches.size()
                                 << " micro-batches of this step hold no item to train on (for a causal LM: every "
                                    "target is -100)");

    try {
        for (size_t index = 0; index < micro_batches.size(); ++index) {
            const MicroBatch& micro = micro_batches[index];
            LossScale scale;
            scale.items = micro.items;
            scale.num_items_in_batch = window.num_items_in_batch;
            scale.micro_batches = window.micro_batches;
            scale.factor = config_.loss_normalization.factor(micro.items, window.num_items_in_batch,
                                                             window.micro_batches, loss_dtype_);
            const LossSum result = micro.loss(scale); // the forward's activations not on the tape are gone
            ENGINE_CHECK(result.sum.defined() && result.sum.numel() == 1,
                         "trainer: micro-batch " << index << ": the loss must return one value, got "
                                                 << (result.sum.defined() ? result.sum.describe() : std::string("none")));
            ENGINE_CHECK(result.items == micro.items,
                         "trainer: micro-batch " << index << ": the loss summed over " << result.items
                                                 << " items but the batch was counted as " << micro.items
                                                 << " before its forward; the count must match the loss");
            window.reported_losses.push_back(result.sum.detach());
            backward(multiply(result.sum, scale.factor));
        }
    } catch (...) {
        // Leave the model as the step found it: no half-accumulated gradients, no dangling tape.
        current_tape().clear();
        optimizer_->zero_grad();
        throw;
    }
    return window;
}

ModuleTrainer::Evaluation ModuleTrainer::evaluate(const std::vector<MicroBatch>& micro_batches) {
    Evaluation evaluation;
    int64_t rank_items = 0;
    for (const MicroBatch& micro : micro_batches) rank_items += micro.items;
    evaluation.num_items_in_batch =
        communicator_ != nullptr ? communicator_->all_reduce_count(rank_items) : rank_items;
    ENGINE_CHECK(evaluation.num_items_in_batch > 0, "trainer: evaluate: the " << micro_batches.size()
                                                                              << " micro-batches hold no item");
    const bool was_training = model_.training();
    model_.train(false);
    double sum = 0.0;
    try {
        NoGradGuard no_grad; // an evaluation's forward is never backpropagated: record nothing, keep nothing
        for (size_t index = 0; index < micro_batches.size(); ++index) {
            const MicroBatch& micro = micro_batches[index];
            LossScale scale;
            scale.items = micro.items;
            scale.num_items_in_batch = evaluation.num_items_in_batch;
            scale.micro_batches = static_cast<int>(micro_batches.size());
            scale.factor = 1.0 / static_cast<double>(evaluation.num_items_in_batch);
            const LossSum result = micro.loss(scale);
            ENGINE_CHECK(result.sum.defined() && result.sum.numel() == 1 && result.items == micro.items,
                         "trainer: evaluate: micro-batch " << index << ": the loss must return one value over the "
                                                           << micro.items << " items counted");
            sum += result.sum.item();
        }
    } catch (...) {
        model_.train(was_training);
        throw;
    }
    model_.train(was_training);
    if (communicator_ != nullptr) sum = communicator_->all_reduce_value(sum);
    evaluation.loss = sum / static_cast<double>(evaluation.num_items_in_batch);
    return evaluation;
}

double ModuleTrainer::rank_gradient_scale() const {
    if (communicator_ == nullptr) return 1.0;
    return config_.loss_normalization.divides_by_global_count() ? 1.0
                                                                : 1.0 / static_cast<double>(communicator_->world_size());
}

StepResult ModuleTrainer::apply_update(const Accumulation& window) {
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
        {
            const profiling::PhaseScope phase(profiling::Phase::grad_norm); // the op profiler's clip share
            result.grad_norm =
                (zero_ ? std::sqrt(zero_->gradient_sum_of_squares()) : global_grad_norm(parameters_)) * gradient_scale;
        }
        loss_sum = window.loss_sum(); // after the norm's read: the device is idle, nothing waits
        if (communicator_ != nullptr) loss_sum = communicator_->all_reduce_value(loss_sum); // the loss sum's reduction
    } catch (...) {
        // Partly reduced gradients must not be stepped on or added to by a retry. (A failed collective usually
        // leaves the ranks out of step for good; see docs/DISTRIBUTED.md.)
        optimizer_->zero_grad();
        throw;
    }
    // Every loss reports a sum of item losses, so the global item mean is their sum over the global count.
    result.loss = loss_sum / static_cast<double>(window.num_items_in_batch);
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
        const profiling::PhaseScope phase(profiling::Phase::optimizer); // the update, as the op profiler files it
        optimizer_->set_learning_rate(result.learning_rate);
        optimizer_->step(clip_coefficient(result.grad_norm, config_.max_grad_norm) * gradient_scale); // the one clip
        if (zero_) zero_->all_gather_parameters(); // every rank's updated part, to every replica
        model_.refresh_working_copies();           // bf16: the forward's copies of the new masters
        optimizer_->zero_grad();
    }

    synchronize_device(device_);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
    result.step = step();
    result.tokens = window.tokens;
    result.num_items_in_batch = window.num_items_in_batch;
    result.rank_num_items_in_batch = window.rank_num_items_in_batch;
    result.micro_batches = window.micro_batches;
    result.tokens_per_second = result.seconds > 0.0 ? static_cast<double>(window.tokens) / result.seconds : 0.0;
    if (communicator_ != nullptr) result.communication = communicator_->counters() - window_counters_;
    result.memory = memory_stats(device_);
    if (device_ != Device::cpu) {
        // Offloaded inputs live in pinned host memory, which the host's account holds: report them here too.
        const MemoryStats host = memory_stats(Device::cpu);
        const int pinned = static_cast<int>(MemoryCategory::pinned_host);
        result.memory.current_by_category[pinned] = host.current_by_category[pinned];
        result.memory.peak_by_category[pinned] = host.peak_by_category[pinned];
    }
    return result;
}

std::optional<StepResult> ModuleTrainer::train_step(const MicroBatchSource& source) {
    std::vector<MicroBatch> micro_batches;
    while (static_cast<int>(micro_batches.size()) < config_.gradient_accumulation_steps) {
        std::optional<MicroBatch> micro = source();
        if (!micro) break; // a last partial window normalises by what it has
        micro_batches.push_back(std::move(*micro));
    }
    if (micro_batches.empty()) return std::nullopt;
    return apply_update(accumulate(micro_batches));
}

} // namespace engine::optim
