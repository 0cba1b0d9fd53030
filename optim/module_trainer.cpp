// The generic accumulation step: count the window, forward/backward per micro-batch, then one update.
#include "optim/module_trainer.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/elementwise.h"
#include "engine/profiling.h"
#include "optim/clip.h"
#include "engine/cuda/runtime.h"

namespace engine::optim {

namespace {

// The schedule of a config checked first: every field's rule before anything is built.
ScheduleConfig schedule_config(const TrainerConfig& config) {
    config.validate();
    return config.schedule_config();
}

std::unique_ptr<Optimizer> make_optimizer(const nn::Module& model, const TrainerConfig& config, ShardRange shard) {
    if (config.optimizer == OptimizerKind::sgd)
        return std::make_unique<SGD>(model.named_trainable_parameters(), config.sgd_options(), decay_matrices_only, shard);
    return std::make_unique<AdamW>(model.named_trainable_parameters(), config.adamw_options(), decay_matrices_only, shard);
}

void synchronize_device(Device device) {
    cuda::synchronize(device);
}

// The first parameter (in model order) whose accumulated gradient holds a NaN or an Inf, for the error: read
// where the step's gradients are when it is asked (with the optimizer on the host, gathered in the masters').
std::string first_nonfinite_gradient(const nn::Module& model) {
    for (const auto& [name, parameter] : model.named_trainable_parameters())
        if (parameter.grad().defined() && !parameter.grad().storage_released() && !all_finite(parameter.grad()))
            return name;
    return "none among the whole gradient buffers (a ZeRO-2 segment's, the token table's and the head's gradients are "
           "summed in the ranks' shards)";
}

// Every gradient buffer a list of leaves has now (streamed ones may have none) back to zero.
void zero_attached(const std::vector<Tensor>& leaves) {
    std::vector<Tensor> attached;
    for (const Tensor& leaf : leaves)
        if (leaf.grad().defined()) attached.push_back(leaf);
    zero_grad(attached);
}

} // namespace

ModuleTrainer::ModuleTrainer(nn::Module& model, const TrainerConfig& config, distributed::Communicator* communicator)
    : model_(model), config_(config), schedule_(schedule_config(config)), communicator_(communicator) {
    ENGINE_CHECK(!model_.parameters().empty(), "trainer: the module has no parameters to train");
    ENGINE_CHECK(model_.trainable_parameter_count() > 0,
                 "trainer: every one of the module's " << model_.named_parameters().size()
                     << " parameters is frozen (Module::set_requires_grad): there is nothing to train");
    // Every refusal before the model changes.
    const bool masters_apart = model_.master_device().has_value();
    ENGINE_CHECK(config_.shape.offload_optimizer || !masters_apart,
                 "trainer: the model's masters are on " << device_name(*model_.master_device())
                     << " apart from its working copies (set_master_device), so its gradients would never reach "
                        "them: train it with offload_optimizer");
    // Released weights (a model placed for ZeRO-3, mark_streamed_layers with parameters_sharded, or left released by
    // a stage-3 trainer) come back only through a stage-3 trainer's gathers.
    if (!(config_.shape.zero_stage == 3 && communicator_ != nullptr))
        for (const Tensor& copy : model_.working_parameters())
            ENGINE_CHECK(!copy.storage_released(),
                         "trainer: " << copy.describe() << " is released (ZeRO-3: placed for it, or left so by a stage-3 "
                                        "trainer), and this trainer gathers nothing: zero_stage 3 with a communicator, "
                                        "or a model placed without it");
    if (config_.shape.offload_optimizer)
        ENGINE_CHECK(masters_apart || model_.compute_device() != Device::cpu,
                     "trainer: offload_optimizer moves the model state from the device to the host, but this model "
                     "is on the host already (cpu): there is nothing to move");
    if (config_.shape.zero_stage >= 2 && communicator_ != nullptr)
        ENGINE_CHECK(dynamic_cast<nn::CausalLM*>(&model_) != nullptr,
                     "trainer: zero_stage " << config_.shape.zero_stage
                                            << " shards the gradients of checkpointed decoder layers as their backward "
                                               "ends, and this module is no causal LM (nn::CausalLM): use zero_stage 1");
    if (streamed())
        ENGINE_CHECK(dynamic_cast<nn::CausalLM*>(&model_) != nullptr,
                     "trainer: offload_gradients stream gives device gradient buffers to checkpointed decoder layers "
                     "only, and this module is no causal LM (nn::CausalLM)");
    if (parameters_streamed())
        ENGINE_CHECK(dynamic_cast<nn::CausalLM*>(&model_) != nullptr,
                     "trainer: offload_parameters streams the weights of checkpointed decoder layers only, and this "
                     "module is no causal LM (nn::CausalLM)");
    // Before anything sizes itself on the activations.
    if (config_.shape.precision == Precision::bf16) model_.set_compute_dtype(DType::bf16);
    model_.set_checkpointing(config.shape.checkpointing);
    // Before the optimizer, whose state goes where the masters are. (A model placed already, as train_gpt does
    // to build its masters on the host, keeps its placement.)
    if (config_.shape.offload_optimizer && !masters_apart) {
        mark_streamed_layers(model_, config_.shape, config_.shape.zero_stage == 3 && communicator_ != nullptr);
        model_.set_master_device(Device::cpu);
    }
    // The trainable parameters only: a frozen one has no gradient, no optimizer state and no part in the norm or
    // the reduction. The working copies in the same order.
    const std::vector<Tensor> masters = model_.parameters(), working = model_.working_parameters();
    for (size_t index = 0; index < masters.size(); ++index) {
        if (!masters[index].requires_grad()) continue;
        parameters_.push_back(masters[index]);
        gradient_leaves_.push_back(working[index]);
    }
    streamed_leaves_.assign(parameters_.size(), false);
    device_ = model_.compute_device();
    loss_dtype_ = model_.compute_dtype() == DType::bf16 ? DType::f32 : parameters_.front().dtype();
    // Without a communicator there is one process, whose one part is the whole: zero_stage 1 or 2 changes nothing.
    if (config_.shape.zero_stage >= 1 && communicator_ != nullptr)
        zero_ = std::make_unique<ZeroShards>(parameters_, *communicator_, config_.shape.zero_stage >= 2);
    optimizer_ = make_optimizer(model_, config_, zero_ ? zero_->range() : ShardRange{});
    if (gradients_sharded()) optimizer_->read_gradients_from(zero_->shard_gradients());
    if (!zero_ && !offloaded()) {
        // The model state whole on the compute device: the update writes the bf16 working copies and zeroes the
        // gradients in its own pass (docs/TRAINING.md, "The step's epilogue"), where refresh_working_copies() and
        // zero_grad() would add a pass and two launches a parameter. A working copy of another dtype (none is
        // made today) keeps the passes.
        std::vector<Tensor> copies;
        bool fusable = true;
        for (size_t index = 0; index < parameters_.size(); ++index) {
            const Tensor& leaf = gradient_leaves_[index];
            const bool apart = !leaf.shares_storage_with(parameters_[index]);
            fusable = fusable && (!apart || (leaf.dtype() == DType::bf16 && leaf.device() == parameters_[index].device()));
            copies.push_back(apart ? leaf : Tensor());
        }
        if (fusable) optimizer_->set_step_epilogue(parameters_, copies, true);
    }
    if (config_.batch_invariant_chunk > 0) fixed_point_ = std::make_unique<FixedPointGradients>(gradient_leaves_);
    // Last: it undoes itself when it fails and nothing after it can throw, so the hooks (which point at this
    // trainer) never outlive a failed construction.
    if (streamed() || parameters_streamed() || gradients_sharded()) start_streaming();
    manual_seed(config_.seed);
}

ModuleTrainer::~ModuleTrainer() {
    if (layered_ == nullptr) return;
    layered_->set_segment_hooks({}); // they point at this trainer
    layered_->set_table_hooks({});
    // The streamed layers get their weights and buffers back, so that the model runs as before.
    try {
        if (parameters_streamed())
            for (int layer : streamed_layers_) layered_->block(layer).unpark_working_copies();
        if (streamed())
            for (int layer : streamed_layers_) layered_->block(layer).attach_working_gradients();
        if (gradients_sharded())
            for (int layer : streamed_layers_) layered_->block(layer).attach_gradients();
        if (table_gradients_sharded()) { // their gradient buffers hold storage again (zeroed), as the model's others
            token_table_->allocate_gradient_storage();
            if (head_ != nullptr) head_->allocate_gradient_storage();
        }
        // ZeRO-3's released layers stay released: their values are the ranks' shards, which go with the trainer, and
        // gathering them is a collective, which a destructor must not make (a rank that threw would leave the others
        // waiting). To keep the model, call gather_released_parameters() on every rank before the trainer goes (the
        // layers then keep their storage); a forward through released layers fails naming the tensor. With the
        // model state on the host that gather brings the masters only: their device copies are made here (local).
        if (parameters_sharded() && offloaded() && whole_scopes_ > 0)
            for (int layer : streamed_layers_) {
                layered_->block(layer).allocate_working_storage();
                layered_->block(layer).refresh_working_copies();
            }
    } catch (...) {
        // Out of memory: they stay as they are; a forward through them then fails naming the tensor.
    }
}

void ModuleTrainer::set_communicator(distributed::Communicator* communicator) {
    ENGINE_CHECK(!zero_ || communicator == communicator_,
                 "trainer: with zero_stage " << config_.shape.zero_stage
                     << " the model state is sharded over the constructor's communicator; it cannot change");
    // Sharding is decided at construction: a communicator given later would silently train unsharded.
    ENGINE_CHECK(zero_ || config_.shape.zero_stage == 0 || communicator == nullptr || communicator->world_size() == 1,
                 "trainer: zero_stage " << config_.shape.zero_stage
                     << " needs its communicator at construction (Trainer(model, config, communicator))");
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
    refuse_inside_whole_parameters("a step");
    // The mode's window ends with its exact sum in the gradient buffers; a second window folded on top of it would carry
    // that sum as a chunk of its own, and lose it if redone. Refused until apply_update (or a failure) takes it.
    ENGINE_CHECK(!unapplied_window_, "trainer: batch_invariant_chunk: the last window's gradient has not been applied; "
                                     "call apply_update before accumulating another window");
    // The trainable parameters were listed when the trainer was built; one frozen since has no buffer to step.
    for (size_t index = 0; index < parameters_.size(); ++index)
        if (!parameters_[index].requires_grad())
            ENGINE_FAIL("trainer: parameter '" << optimizer_->parameter_names()[index]
                                               << "' was frozen after the trainer was built; freeze parameters "
                                                  "(Module::set_requires_grad) before building it");
    const int chunks_per_micro_batch = window_size() / config_.shape.gradient_accumulation_steps;
    ENGINE_CHECK(static_cast<int>(micro_batches.size()) <= window_size(),
                 "trainer: " << micro_batches.size() << (batch_invariant() ? " chunks" : " micro-batches")
                             << " exceed gradient_accumulation_steps " << config_.shape.gradient_accumulation_steps
                             << (batch_invariant() ? " times " + std::to_string(chunks_per_micro_batch) +
                                                         " chunks of batch_invariant_chunk sequences"
                                                   : std::string()));
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
    // ZeRO-2 reduces each segment once per micro-batch: a rank with fewer would pair its step's reduces with another's
    // segments'. Every rank checks (one more count reduction) and throws alike.
    if (gradients_sharded()) {
        const int64_t ranks = communicator_->world_size(), mine = window.micro_batches;
        const int64_t total = communicator_->all_reduce_count(mine);
        ENGINE_CHECK(total == ranks * mine, "trainer: zero_stage " << config_.shape.zero_stage << " needs as many micro-batches on every rank; this rank has "
                                                << mine << " and the " << ranks << " ranks " << total << " together");
    }
    ENGINE_CHECK(window.num_items_in_batch > 0,
                 "trainer: the " << micro_batches.size()
                                 << " micro-batches of this step hold no item to train on (for a causal LM: every "
                                    "target is -100)");

    try {
        if (!batch_invariant()) {
            run_window(micro_batches, window);
        } else {
            // The chunks over every rank fix the grid; the window's RNG state is kept for a redo, so that a redone
            // window draws the same dropout masks.
            const int64_t chunks = communicator_ != nullptr ? communicator_->all_reduce_count(window.micro_batches)
                                                            : window.micro_batches;
            const RngState start = rng_state();
            for (bool redo = false;; redo = true) {
                fixed_point_->begin_window(chunks, redo);
                run_window(micro_batches, window);
                if (!fixed_point_->redo_needed(communicator_)) break;
                ++window.redone;
                window.reported_losses.clear();
                rng_state() = start;
            }
            fixed_point_->finish(gradient_leaves_, communicator_);
            unapplied_window_ = true;
        }
    } catch (...) {
        // Leave the model as the step found it: no half-accumulated gradients, no dangling tape.
        current_tape().clear();
        zero_gradients();
        throw;
    }
    return window;
}

void ModuleTrainer::run_window(const std::vector<MicroBatch>& micro_batches, Accumulation& window) {
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
        if (batch_invariant()) fixed_point_->fold(gradient_leaves_); // the chunk's gradient; its buffers back to zero
        if (table_gradients_sharded()) {
            // ZeRO-2 and 3: the token table's gradient, given storage just before the lookup's backward (the last node),
            // onto its owners; then the storage goes, so no whole buffer lives between micro-batches.
            zero_->reduce_gradients(token_table_indexes_);
            token_table_->release_gradient_storage();
        }
    }
}

ModuleTrainer::Evaluation ModuleTrainer::evaluate(const std::vector<MicroBatch>& micro_batches) {
    refuse_inside_whole_parameters("an evaluation");
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
        release_tables(); // ZeRO-3: a failure may have left the token table or the head gathered
        throw;
    }
    model_.train(was_training);
    if (communicator_ != nullptr) sum = communicator_->all_reduce_value(sum);
    evaluation.loss = sum / static_cast<double>(evaluation.num_items_in_batch);
    return evaluation;
}

void ModuleTrainer::zero_gradients() {
    optimizer_->zero_grad();
    if (gradients_sharded()) {
        // A failed window may have left a segment's buffers attached, and partial sums in the shard.
        for (int layer : streamed_layers_) layered_->block(layer).release_gradients();
        zero_->zero_shard_gradients();
    }
    if (parameters_sharded()) // a failed window may have left a segment gathered
        for (int layer : streamed_layers_) layered_->block(layer).release_parameter_storage();
    release_tables(); // and the token table or the head, or their gradient storage
    if (!offloaded()) return;
    zero_device_gradients();
}

void ModuleTrainer::zero_after_update() {
    if (gradients_sharded()) zero_->zero_shard_gradients();
    if (!offloaded()) {
        if (!optimizer_->has_step_epilogue()) optimizer_->zero_grad(); // else the update zeroed them
        return;
    }
    // The masters' buffers of the window's leaves are overwritten by the next step's copy before anything
    // reads them: only the streamed ones, which the next window adds into, go back to zero.
    std::vector<Tensor> streamed;
    for (size_t index = 0; index < parameters_.size(); ++index)
        if (streamed_leaves_[index]) streamed.push_back(parameters_[index]);
    zero_grad(streamed);
    zero_device_gradients();
}

void ModuleTrainer::zero_device_gradients() {
    zero_attached(gradient_leaves_); // the device buffers backward accumulates into
    // A failed window may have left a segment's streamed buffers attached, and its weights fetched.
    for (int layer : streamed_layers_) {
        if (streamed()) layered_->block(layer).release_working_gradients();
        if (parameters_streamed()) layered_->block(layer).release_fetched_copies();
    }
}

double ModuleTrainer::rank_gradient_scale() const {
    if (communicator_ == nullptr) return 1.0;
    return config_.loss_normalization.divides_by_global_count() ? 1.0
                                                                : 1.0 / static_cast<double>(communicator_->world_size());
}

void ModuleTrainer::refuse_inside_whole_parameters(const char* what) const {
    ENGINE_CHECK(!parameters_gathered(), "trainer: " << what << " inside optim::WholeParameters (ZeRO-3): the segment "
                                                        "hooks would gather and release the layers under the scope, "
                                                        "and the update would leave the gathered copies stale; end "
                                                        "the scope first");
}

StepResult ModuleTrainer::apply_update(const Accumulation& window) {
    refuse_inside_whole_parameters("an update");
    unapplied_window_ = false; // stepped on, skipped or zeroed below: the window is taken either way
    StepResult result;
    result.learning_rate = schedule_.at(step());
    const double gradient_scale = rank_gradient_scale(); // folded into the norm and the update kernel
    double loss_sum = 0.0;
    try {
        if (offloaded()) {
            // Model state on the host: the window's gradients, summed on the device, are measured there as without
            // offload (the same kernel, so the same bits), then copied to the masters' host buffers, where the
            // ranks reduce them (host tensors: the mpi backend) and the optimizer reads them.
            if (!zero_ && communicator_ == nullptr && !streamed()) {
                const profiling::PhaseScope phase(profiling::Phase::grad_norm);
                result.grad_norm = global_grad_norm(gradient_leaves_) * gradient_scale;
            }
            // The streamed leaves' gradients are on the host already.
            for (size_t index = 0; index < parameters_.size(); ++index)
                if (!streamed_leaves_[index]) parameters_[index].grad().copy_from(gradient_leaves_[index].grad());
        }
        if (gradients_sharded()) {
            zero_->reduce_gradients(whole_gradient_indexes_); // ZeRO-2: the rest, onto their owners' shards
        } else if (zero_ && !batch_invariant()) { // the mode's exact sums are whole on every rank already
            zero_->reduce_scatter_gradients(); // ZeRO-1: each rank gets the summed gradients of its own part
        } else if (communicator_ != nullptr && !batch_invariant()) { // the mode's sums were added in accumulate
            // The window's one gradient reduction: after its last backward, before the norm, so that the norm,
            // the clip and the update are the same on every rank.
            std::vector<Tensor> gradients;
            gradients.reserve(parameters_.size());
            for (const Tensor& parameter : parameters_) gradients.push_back(parameter.grad());
            communicator_->all_reduce_gradients(gradients);
        }
        if (!offloaded() || streamed() || zero_ || communicator_ != nullptr) {
            const profiling::PhaseScope phase(profiling::Phase::grad_norm); // the op profiler's clip share
            // The batch-invariant mode at ZeRO-1 measures the whole gradient every rank holds, as one process does: the
            // shards' partial sums would group the squares by the world size.
            result.grad_norm = (zero_ && !batch_invariant() ? std::sqrt(zero_->gradient_sum_of_squares())
                                                            : global_grad_norm(parameters_)) *
                               gradient_scale;
        }
        // After the norm's read: the device is idle, nothing waits. The mode's sum is exact in any order.
        loss_sum = batch_invariant() ? fixed_point_loss_sum(window.reported_losses, window.num_items_in_batch)
                                     : window.loss_sum();
        if (communicator_ != nullptr) loss_sum = communicator_->all_reduce_value(loss_sum); // the loss sum's reduction
    } catch (...) {
        // Partly reduced gradients must not be stepped on or added to by a retry. (A failed collective usually
        // leaves the ranks out of step for good; see docs/DISTRIBUTED.md.)
        zero_gradients();
        throw;
    }
    // Every loss reports a sum of item losses, so the global item mean is their sum over the global count.
    result.loss = loss_sum / static_cast<double>(window.num_items_in_batch);
    // Caught before the optimizer runs: a NaN or Inf must never reach the weights or the moments.
    if (!std::isfinite(result.loss) || !std::isfinite(result.grad_norm)) {
        const std::string parameter = first_nonfinite_gradient(model_);
        zero_gradients();
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
        // Every rank's updated part, to every replica; at stage 3 to the parameters kept whole only (the
        // segments' are gathered as they run).
        if (parameters_sharded()) zero_->gather_parameters(whole_gradient_indexes_);
        else if (zero_) zero_->all_gather_parameters();
        // bf16, or the host masters: the forward's copies of them (written by the update itself when fused)
        if (!optimizer_->has_step_epilogue()) model_.refresh_working_copies();
        zero_after_update();
    }

    synchronize_device(device_);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
    result.step = step();
    result.tokens = window.tokens;
    result.num_items_in_batch = window.num_items_in_batch;
    result.rank_num_items_in_batch = window.rank_num_items_in_batch;
    result.micro_batches = window.micro_batches;
    result.redone = window.redone;
    result.tokens_per_second = result.seconds > 0.0 ? static_cast<double>(window.tokens) / result.seconds : 0.0;
    if (communicator_ != nullptr) result.communication = communicator_->counters() - window_counters_;
    result.memory = memory_stats(device_);
    if (device_ != Device::cpu) result.host_memory = memory_stats(Device::cpu);
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
    const std::vector<MicroBatch> micro_batches = pull_window(source, window_size());
    if (micro_batches.empty()) return std::nullopt;
    return apply_update(accumulate(micro_batches));
}

} // namespace engine::optim
