// The generic gradient-accumulation trainer: any nn::Module, any batch type, a loss the user writes that
// returns (sum of losses, number of items). It owns the optimizer step's boundaries: the window's item count
// (all-reduced over data-parallel ranks), loss normalisation, the one clip, the update, the schedule, the
// non-finite guard and ZeRO-1, 2 and 3. What it is told is optim/trainer_config.h; optim/trainer.h builds the causal-LM
// trainer on it; docs/TRAINING.md has the formulas.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/distributed/communicator.h"
#include "nn/causal_lm.h"
#include "nn/module.h"
#include "optim/batch_invariant.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/trainer_config.h"
#include "optim/zero.h"

namespace engine::optim {

// What one optimizer step did.
struct StepResult {
    int64_t step = 0;                // optimizer steps completed, this one included (1-based)
    double loss = 0.0;               // sum of every item's loss / num_items_in_batch, in both modes
    double learning_rate = 0.0;      // the rate this step used
    double grad_norm = 0.0;          // global norm of the accumulated gradients, before clipping
    int64_t tokens = 0;              // input positions processed (sum of MicroBatch::tokens)
    int64_t num_items_in_batch = 0;  // items (valid targets) over the whole window, every rank's
    int64_t rank_num_items_in_batch = 0; // this rank's part of them
    int micro_batches = 0;           // N, or k < N for a last partial window (the batch-invariant mode: chunks)
    double seconds = 0.0;
    double tokens_per_second = 0.0;
    MemoryStats memory;              // the model device's statistics; peaks cover this step only
    MemoryStats host_memory;         // the host's, when the model is on another device (offload's tiers)
    bool skipped = false;            // non-finite loss or gradients with skip_nonfinite: no update was made
    int redone = 0;                  // batch-invariant mode: times the window ran again (a gradient past its bound)
    // What the communicator did during this step (zero without one): one count, one gradient and one loss
    // all-reduce per step with data parallelism, whatever the number of micro-batches.
    distributed::CommunicatorCounters communication;
};

// What a loss function returns for one micro-batch: the SUM of its items' losses (a one-value tensor on the
// tape) and how many items that sum is over. The trainer, not the loss, normalises (LossNormalization).
struct LossSum {
    Tensor sum;
    int64_t items = 0;
};

// What the trainer will do with a micro-batch's LossSum, told to the loss before its forward: its loss is
// sum · factor, so backward brings exactly `factor` to the sum. A fused loss that writes its gradient during
// its forward (cross_entropy_in_place's expected_output_gradient) passes `factor` and no rescale pass runs;
// any other loss may ignore all of it.
struct LossScale {
    int64_t items = 0;              // this micro-batch's, as counted before its forward
    int64_t num_items_in_batch = 0; // the window's, over every rank
    int micro_batches = 0;          // in this window
    double factor = 0.0;            // LossNormalization::factor
};

// One micro-batch as the trainer consumes it. Its item count is a field, set before the trainer sees it,
// not something the forward reports, because token mode divides every micro-batch's loss by the window's
// total: that total must be known (and all-reduced over the ranks) before the window's FIRST backward, and
// a trainer that learnt counts from forwards would have to keep all N micro-batches' activations alive until
// the last one ran, which accumulation exists to avoid. The loss must then report the same count.
struct MicroBatch {
    int64_t items = 0;  // items its loss sum will be over (for a causal LM: labels[:,1:] that are not -100)
    int64_t tokens = 0; // input positions, for the step's throughput only
    // Runs the forward and the loss; the activations it does not return die with it, before backward.
    std::function<LossSum(const LossScale& scale)> loss;
};
using MicroBatchSource = std::function<std::optional<MicroBatch>()>;

// The one loop that pulls a window: up to `count` items from `source`, fewer when it runs dry (a last partial
// window normalises by what it has).
template <typename Item>
std::vector<Item> pull_window(const std::function<std::optional<Item>()>& source, int count) {
    std::vector<Item> window;
    while (static_cast<int>(window.size()) < count) {
        std::optional<Item> item = source();
        if (!item) break;
        window.push_back(std::move(*item));
    }
    return window;
}

// How to train on a user's batch type: counting comes before the forward (see MicroBatch).
template <typename Batch>
struct TrainingTask {
    std::function<int64_t(const Batch&)> count_items;             // items of a batch, without a forward
    std::function<LossSum(const Batch&, const LossScale&)> loss;  // forward + loss sum
    std::function<int64_t(const Batch&)> count_tokens;            // optional: throughput; unset counts 0

    MicroBatch micro_batch(Batch batch) const {
        MicroBatch micro;
        micro.items = count_items(batch);
        micro.tokens = count_tokens ? count_tokens(batch) : 0;
        micro.loss = [loss = loss, batch = std::move(batch)](const LossScale& scale) { return loss(batch, scale); };
        return micro;
    }
};

// The state of one accumulation window, between accumulate and apply_update.
struct Accumulation {
    int64_t num_items_in_batch = 0;       // over every rank's micro-batches of the window
    int64_t rank_num_items_in_batch = 0;  // this rank's part of it (all of it in one process)
    int micro_batches = 0; // in the batch-invariant mode, chunks
    int64_t tokens = 0;
    int redone = 0; // batch-invariant mode: times the window ran again with a chunk's gradient over its bound
    // Each micro-batch's loss sum as a one-value tensor. They stay on the device until loss_sum() reads them,
    // which apply_update does once the gradient norm has waited for the device anyway, so no micro-batch's
    // forward makes the host wait.
    std::vector<Tensor> reported_losses;
    double loss_sum() const; // this rank's sum of item losses
};

// Before a model with checkpointing set (set_checkpointing) has its masters placed on the host
// (Module::set_master_device): the layers that `shape` streams (those of the checkpointed segments of a causal
// LM) get their working copies parked on the host as they are made (offload_parameters), no device
// gradient buffers (offload_gradients stream), and at zero_stage 3 with `parameters_sharded` (the trainer will
// have a communicator) the copies released as they are made, so placing never holds on the device what the plan
// took off it. Nothing for other shapes or modules. The trainer calls it for a model it places; train_gpt for the
// one it builds on the host.
void mark_streamed_layers(nn::Module& model, const StepShape& shape, bool parameters_sharded);

class ModuleTrainer {
public:
    // Applies the checkpoint policy through model.set_checkpointing (a module without checkpointable layers
    // refuses an enabled one), seeds the engine RNG, and creates the optimizer over
    // model.named_trainable_parameters() (its state is allocated now) and the schedule. The model must outlive the
    // trainer and hold at least one trainable parameter (frozen ones, Module::set_requires_grad, get no gradient,
    // state, norm or reduction, and must be frozen before the trainer is built); its device is the one its forward runs on (Module::compute_device). With a communicator the trainer is data-parallel from
    // the start (see set_communicator), and zero_stage 1 shards the optimizer state over its ranks (2: and the
    // gradients, 3: and the checkpointed layers' masters; both need a causal LM with checkpointing).
    ModuleTrainer(nn::Module& model, const TrainerConfig& config, distributed::Communicator* communicator = nullptr);
    virtual ~ModuleTrainer();
    ModuleTrainer(const ModuleTrainer&) = delete;
    ModuleTrainer& operator=(const ModuleTrainer&) = delete;

    // One optimizer step over up to N micro-batches from `source`. Returns nullopt, changing nothing, when
    // the source has no batch left. If any micro-batch throws, no weight changes and the gradient buffers are
    // zeroed again before the error propagates (the batches pulled are consumed).
    std::optional<StepResult> train_step(const MicroBatchSource& source);
    template <typename Batch>
    std::optional<StepResult> train_step(const std::function<std::optional<Batch>()>& source,
                                         const TrainingTask<Batch>& task) {
        return train_step(MicroBatchSource([&]() -> std::optional<MicroBatch> {
            std::optional<Batch> batch = source();
            if (!batch) return std::nullopt;
            return task.micro_batch(std::move(*batch));
        }));
    }

    // The two halves of a step, public for tests and tools that inspect the accumulated gradients.
    // accumulate: counts the window (one count all-reduce), then forward -> loss -> backward each micro-batch.
    // In the batch-invariant mode (batch_invariant_chunk) each micro-batch is one chunk: its gradient is folded into
    // the exact sums after its backward, and the window ends with every rank's sum in the gradient buffers
    // (optim/batch_invariant.h); a window whose chunks broke a bound runs again (Accumulation::redone).
    Accumulation accumulate(const std::vector<MicroBatch>& micro_batches);
    // clip once -> optimizer step at the schedule's rate -> zero_grad -> the schedule advances.
    StepResult apply_update(const Accumulation& accumulation);

    // Evaluation: every micro-batch's forward and loss under NoGradGuard in eval mode (dropout off; the
    // module's mode is restored after), so nothing is recorded, no activation is kept for a backward and no
    // gradient or weight changes. Returns the item mean of the losses, over every rank with a communicator
    // (two collectives, which every rank calls). The micro-batches' LossScale says factor 1/num_items.
    struct Evaluation {
        double loss = 0.0;              // Σ sums / num_items_in_batch
        int64_t num_items_in_batch = 0; // every rank's
    };
    Evaluation evaluate(const std::vector<MicroBatch>& micro_batches);

    // Data parallelism (docs/DISTRIBUTED.md): each window's item count is summed over the ranks before its
    // first backward, the gradient buffers once after its last, and the loss sum once for the report, so
    // every rank takes the same step. Not owned; nullptr (the default) is one process. Every rank must make
    // the same calls: a rank that throws leaves the others waiting, so launch with mpirun, which ends them
    // once the failed rank exits (it does not finalise MPI while unwinding; engine/distributed/backends.h).
    // With zero_stage 1 or 2 the communicator must be the constructor's, which sharded the model state.
    void set_communicator(distributed::Communicator* communicator);
    distributed::Communicator* communicator() const { return communicator_; }

    int64_t step() const { return optimizer_->step_count(); } // optimizer steps done
    int64_t skipped_steps() const { return skipped_steps_; }  // windows skipped for non-finite values
    double current_learning_rate() const { return schedule_.at(step()); }
    Optimizer& optimizer() { return *optimizer_; }
    // The optimizer state as whole tensors named as named_state() unsharded, in a state file's order: their names and
    // shapes (as tensors like them), gathering nothing; and the index-th given to `consume` with its bytes (valid
    // during the call): the live tensor, or under ZeRO-1 gathered from every rank a window of the collectives' buffer
    // at a time, with no gathered copy on the device (a collective every rank calls with the same index). What a
    // streamed save pulls.
    std::vector<std::pair<std::string, Tensor>> whole_optimizer_state_layout() const {
        return zero_ ? zero_->state_layout(*optimizer_) : optimizer_->named_state();
    }
    void visit_whole_optimizer_state_tensor(size_t index, const ZeroShards::StateConsumer& consume) {
        if (zero_) return zero_->gather_state_tensor(*optimizer_, index, consume);
        const auto named = optimizer_->named_state();
        ENGINE_CHECK(index < named.size(), "optimizer state tensor " << index << " of " << named.size());
        consume(named[index].first, named[index].second, named[index].second.raw_data(), named[index].second.nbytes(),
                named[index].second.device());
    }
    // ZeRO-3: the parameters released between uses (the checkpointed segments' layers') get storage and their whole
    // values on every rank (gather_released_parameters, a collective every rank calls), for what reads or writes the
    // model outside a step, and go again (release_gathered_parameters; `written`: their values changed meanwhile, so
    // each rank first takes its part of them into its shard, which the update reads; local). Nothing at other
    // stages. WholeParameters scopes the pair. At stage 3 a released parameter written outside a step without
    // `written` is overwritten from the shards at its next gather. With the model state on the host (offload_optimizer)
    // the masters are gathered there and the layers' working copies on the device stay released: a save reads the
    // masters, and a forward inside the scope fails naming the released copy.
    void gather_released_parameters();
    void release_gathered_parameters(bool written);
    // While some are gathered this way a step or an evaluation is refused (its hooks would gather and release them
    // under the scope's feet).
    bool parameters_gathered() const { return whole_scopes_ > 0; }
    bool releases_parameters() const { return parameters_sharded(); }
    // A parameter of the model whole, for a save: `consume` gets its bytes on `device` (valid during the call), in
    // order: its own storage in one piece, or at stage 3 for a released one, gathered from the owners' shards a
    // window of the collectives' buffer at a time, allocating nothing (a collective every rank calls alike).
    using ByteConsumer = std::function<void(const void* bytes, size_t byte_count, Device device)>;
    void visit_whole_parameter(const Tensor& parameter, const ByteConsumer& consume);
    // Stage 3, for a restore: where this rank keeps its part of a released parameter (ZeroShards::parameter_part;
    // count 0 where it has none), or nullopt for a parameter with its own storage, which is written whole.
    std::optional<ZeroShards::ParameterPart> released_part(const Tensor& parameter) const;
    const LearningRateSchedule& schedule() const { return schedule_; }
    const TrainerConfig& config() const { return config_; }
    nn::Module& module() { return model_; }
    Device device() const { return device_; }

private:
    // The head hooks (CausalLM::TableHooks, around every use of the head): at ZeRO-2 and 3 with the model state on the
    // device (table_gradients_sharded) the head (the token table when tied) gathered before the classifier reads it
    // (stage 3), its gradient storage given, zeroed (in grad mode), and the identity over `hidden` that comes back
    // carries its end: once the classifier's backward has run, an untied head's gradient is reduced onto the owners and
    // its storage goes (a tied table's stays for the lookup's backward), and at stage 3 the head goes. `hidden` itself
    // otherwise. Every rank calls it alike (a collective). release_head_after_no_grad: after the head's use under
    // no-grad (an evaluation, a sampled token), the gathered head goes again.
    Tensor gather_head(const Tensor& hidden);
    void release_head_after_no_grad();
    // The factor that turns the ranks' summed gradients into this step's: 1 when each rank's loss is divided
    // by the global item count, 1/world_size for per-rank means (DDP's average).
    double rank_gradient_scale() const;
    // The model state on the host (offload_optimizer): the masters and their gradients apart from the
    // buffers backward fills.
    bool offloaded() const { return config_.shape.offload_optimizer; }
    bool streamed() const { return offloaded() && config_.shape.offload_gradients == GradientOffload::stream; }
    bool parameters_streamed() const { return offloaded() && config_.shape.offload_parameters; }
    // ZeRO-2 over several ranks: the checkpointed segments' layers hold gradient buffers from their recompute to
    // the end of their backward, whose sums go to the owners' shards (ZeroShards::reduce_gradients).
    bool gradients_sharded() const { return zero_ && config_.shape.zero_stage >= 2; }
    // ZeRO-3 over several ranks: those layers also hold their parameters only while a segment is gathered (its
    // forward; its recompute and backward), each rank keeping the masters of its part (ZeroShards::shard_parameters).
    bool parameters_sharded() const { return zero_ && config_.shape.zero_stage == 3; }
    // ZeRO-2 and 3 with the model state on the device: the token table and an untied LM head (CausalLM::token_table,
    // untied_head) have gradient buffers over released storage, given for their backward (the lookup's, the
    // classifier's; a tied table's from the classifier's to the lookup's) and reduced onto the owners right after it
    // (the table's once backward() returns, an untied head's as the classifier's backward ends), once per micro-batch
    // as a segment's; at stage 3 their weights are released too, gathered for the lookup (CausalLM::TableHooks) and for
    // the loss (gather_head). docs/DISTRIBUTED.md.
    bool table_gradients_sharded() const { return token_table_ != nullptr; }
    bool table_weights_released() const { return token_table_ != nullptr && parameters_sharded(); }
    void gather_table(nn::Module& table, const std::vector<size_t>& indexes);
    void release_tables(); // the tables' weights and gradient storage (after a failure)
    std::vector<nn::Module*> released_modules() const; // every module whose weights are released between uses
    void gather_segment(int first_layer, int layer_count);  // storage, the owners' values, the working copies
    void release_segment_parameters(int first_layer, int layer_count);
    void refuse_inside_whole_parameters(const char* what) const; // a step's parts, inside a WholeParameters
    std::optional<size_t> released_index(const Tensor& parameter) const; // among parameters_, if released
    // Streamed gradients, parameters or both, for the decoder layers of the checkpointed segments
    // (checkpoint::SegmentHooks): streamed gradients take away their device gradient buffers, which each
    // segment's backward gets for its duration; streamed parameters park their working copies on the host,
    // fetched for the segment's forward and again for its recompute and backward.
    void start_streaming();
    void fetch_segment(int first_layer, int layer_count);
    void release_segment(int first_layer, int layer_count);
    // Starts the copies of the checkpointed segment after (+1) or before (-1) the one at first_layer, if any.
    void prefetch_neighbour(int first_layer, int direction);
    void attach_segment_gradients(int first_layer, int layer_count);
    void stream_segment_gradients(int first_layer, int layer_count); // down to the host, added there, released
    // Every gradient buffer of the step back to zero: the masters', and the device ones when they are apart
    // (after a failure); after an update, what the next window reads before it writes.
    void zero_gradients();
    void zero_after_update();
    void zero_device_gradients(); // with the masters apart: the device buffers, and streamed ones released
    // accumulate's forward -> loss -> backward over the window, once (the batch-invariant mode may run it again).
    void run_window(const std::vector<MicroBatch>& micro_batches, Accumulation& window);
    bool batch_invariant() const { return fixed_point_ != nullptr; }
    // The MicroBatches a window takes at most: gradient_accumulation_steps, or in the batch-invariant mode, whose
    // MicroBatches are chunks, that times per_device_train_batch_size / batch_invariant_chunk.
    int window_size() const {
        return config_.shape.gradient_accumulation_steps *
               (batch_invariant() ? config_.shape.per_device_train_batch_size / config_.batch_invariant_chunk : 1);
    }

    nn::Module& model_;
    TrainerConfig config_;
    std::vector<Tensor> parameters_;      // the masters, as the optimizer updates them
    std::vector<Tensor> gradient_leaves_; // what backward accumulates into: parameters_, or their device copies
    std::vector<bool> streamed_leaves_;   // per parameter: its gradient is summed on the host (stream)
    nn::CausalLM* layered_ = nullptr;     // the model as a causal LM, for its layers, when anything streams
    std::vector<int> streamed_layers_;    // the decoder layers of its checkpointed segments
    std::vector<checkpoint::Segment> streamed_segments_; // those segments, in forward order
    std::map<int, std::vector<size_t>> segment_parameters_; // ZeRO-2: by first layer, its parameters' indexes
    std::vector<size_t> whole_gradient_indexes_;            // ZeRO-2: the parameters whose buffers stay
    std::vector<size_t> released_indexes_;                  // ZeRO-3: every segment's, in order
    int whole_scopes_ = 0;                                  // ZeRO-3: gather_released_parameters not yet released
    nn::Module* token_table_ = nullptr;                     // ZeRO-2, 3 (table_gradients_sharded): the token table
    nn::Module* head_ = nullptr;                            // and an untied LM head (nullptr: tied),
    std::vector<size_t> token_table_indexes_, head_indexes_; // their parameters' indexes
    Device device_ = Device::cpu;         // where the forward runs
    DType loss_dtype_ = DType::f32; // the compute type mean mode's factor is formed in
    std::unique_ptr<Optimizer> optimizer_;
    LearningRateSchedule schedule_;
    distributed::Communicator* communicator_ = nullptr;
    std::unique_ptr<ZeroShards> zero_; // zero_stage 1 or 2 with a communicator
    std::unique_ptr<FixedPointGradients> fixed_point_; // batch_invariant_chunk > 0
    bool unapplied_window_ = false; // the mode: accumulate left its sum in the buffers, apply_update not yet called
    distributed::CommunicatorCounters window_counters_; // the communicator's counters when the window began
    std::chrono::steady_clock::time_point window_start_;
    int64_t skipped_steps_ = 0;
};

// ZeRO-3: the model whole for the scope's life on every rank (ModuleTrainer::gather_released_parameters), released
// again at its end, after each rank took its part of the values into its shard when `written`. A collective: every
// rank makes one at the same point. No step or evaluation runs inside one (refused). It must not outlive the
// trainer. Nothing at other stages.
class WholeParameters {
public:
    explicit WholeParameters(ModuleTrainer& trainer, bool written = false) : trainer_(trainer), written_(written) {
        trainer_.gather_released_parameters();
    }
    ~WholeParameters() {
        try {
            trainer_.release_gathered_parameters(written_);
        } catch (...) {
            // Taking the written values failed (the device): they are lost, the shards keep the last ones.
            try {
                trainer_.release_gathered_parameters(false);
            } catch (...) {
            }
        }
    }
    WholeParameters(const WholeParameters&) = delete;
    WholeParameters& operator=(const WholeParameters&) = delete;

private:
    ModuleTrainer& trainer_;
    bool written_;
};

} // namespace engine::optim
