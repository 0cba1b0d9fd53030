// Predicts the memory of one causal-LM training step (GPT-2 or Llama) per accounting category and the step's joint
// peak, under a checkpoint policy, from what each op allocates and saves. docs/MEMORY.md derives every term.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/distributed/zero_partition.h"
#include "engine/memory.h"
#include "nn/lora.h"
#include "nn/model_config.h"
#include "planner/step_shape.h"

namespace engine::planner {

// Which optimizer's state to count (planner/step_shape.h): AdamW keeps two moments per parameter, SGD with
// momentum one, none none.
using engine::OptimizerKind;

// What of the model trains (docs/MEMORY.md, "LoRA and QLoRA"). Without `lora`, every parameter (a full fine-tune).
// With it, nn::apply_lora's model: every parameter of the base frozen (no gradient buffer, no optimizer state, no
// working copy: stored in the step's dtype, so 2 bytes under bf16) and an adapter lora_A (r,in), lora_B (out,r) on
// each linear layer the targets name, which trains as any parameter (f32 master with a bf16 working copy under
// bf16, an f32 gradient, the optimizer's state). nf4 (QLoRA, with lora): every linear weight but the head's held in
// NF4 (nn::quantize_nf4: codes, scales and their scales, in `parameters`), the adapters in f32.
struct FineTuning {
    std::optional<nn::LoraConfig> lora;
    bool nf4 = false;
};

// The model state a run holds for its whole length, by category, on the device when nothing is offloaded: what
// the trainer's model and optimizer hold before the first step (Module and optimizer allocations, to the byte).
struct ModelState {
    size_t parameters = 0;      // all of the below but the gradients and the optimizer state
    size_t gradients = 0;       // f32 (compute dtype) buffers of the trainable parameters
    size_t optimizer_state = 0; // of the trainable parameters (ZeRO-1: one rank's part)
    size_t trainable = 0;       // trainable elements (a full fine-tune's count GPT-2's padded rows)
    size_t master_parameters = 0; // the trainable parameters' masters (compute dtype)
    size_t working_copies = 0;    // their bf16 copies under bf16
    size_t frozen_parameters = 0; // LoRA's frozen base: dense in the step's dtype, or NF4 codes and scales
    size_t constant_buffers = 0;  // Llama's RoPE tables
    size_t total() const { return parameters + gradients + optimizer_state; }
};

// The model state of `config` trained as `tuning` says, in `dtype` (bf16: mixed precision), with `optimizer`'s
// state over `optimizer_shards` ranks (ZeRO-1; its collective buffers are the step's workspace, not counted here).
// Exact to the byte on the CPU for full, LoRA and QLoRA runs of GPT-2 and Llama; predict_memory's categories for a full
// fine-tune. Throws EngineError, naming it, for a LoRA config apply_lora would refuse on this model (a bad field, a
// target that matches no linear layer, a rank above a layer's).
// predict_memory(..., tuning) adds a LoRA step's activations and workspace (planner/adapter_step.h).
ModelState predict_model_state(const nn::ModelConfig& config, DType dtype, OptimizerKind optimizer = OptimizerKind::adamw,
                               int optimizer_shards = 1, const FineTuning& tuning = {});

// For `train_gpt --plan` with LoRA: the model state by category next to a full fine-tune's, and what is not
// predicted yet (the step's activations and workspace).
std::string model_state_report(const nn::ModelConfig& config, DType dtype, OptimizerKind optimizer, int optimizer_shards,
                               const FineTuning& tuning);

struct MemoryPrediction {
    // Peak bytes of each category over one step, indexed by engine/memory.h's MemoryCategory (the one list of
    // categories). Parameters, gradients and optimizer state are constant; activations, workspace and
    // pinned_host are high-water marks reached at different moments.
    std::array<size_t, memory_category_count> peaks{};
    size_t master_parameters = 0; // what the optimizer updates (f32 under bf16 mixed precision)
    // The copies the forward reads beside the masters: bf16 under mixed precision; with the optimizer on the
    // host, the device's copies in the step's dtype (f32 ones in fp32); 0 otherwise.
    size_t working_copies = 0;
    // Of those, the checkpointed layers' copies parked on the host between uses (streamed parameters): pinned,
    // in the host's `pinned_host` (beside the offloaded segment inputs' peak), and on the device one segment's at
    // a time.
    size_t parked_working_copies = 0;
    size_t constant_buffers = 0;  // built with the model, in `parameters`, no gradient: Llama's RoPE tables
    // ZeRO-1's collective buffers (distributed::ZeroPartition: a piece of every rank's part and this rank's), in the
    // device's workspace, or the host's with the optimizer there.
    size_t zero_buffers = 0;
    // Stage 0 over several ranks (ZeroSharding::all_reduced), or the batch-invariant mode's exact sums with a
    // communicator: the staging buffer of the gradients' all-reduce (in `workspace`, while it runs).
    size_t all_reduce_bucket_bytes = 0;
    // ZeRO-2's buffer of this rank's part of the summed gradients (in `gradients`, for the whole run).
    size_t shard_gradient_bytes = 0;
    // ZeRO-3's buffer of this rank's part of the masters (in `parameters`, for the whole run; on the host with
    // offload_optimizer), and the bytes one checkpointed layer's gathered weights take on the device while its segment
    // runs: what the forward reads (the f32 masters in fp32, the bf16 copies alone under bf16; with offload_optimizer
    // the working copies, the masters gathered on the host).
    size_t shard_parameter_bytes = 0;
    size_t gathered_layer_bytes = 0;
    // ZeRO-2 and 3 with the model state on the device and an untied head (sharded_table_elements): one table's gradient
    // (f32), given storage for the head's backward and for the lookup's; at stage 3 one table's gathered weights (the
    // token table's and the head's are alike), for the lookup and from the head's gather to the end of its backward.
    size_t gathered_table_bytes = 0;
    size_t table_gradient_bytes = 0;
    // The ranks' parts differ in how much of those layers they hold: what the rank holding the most keeps beyond
    // rank 0 (whose figures these are), on the device, or with the model state on the host (offload_optimizer) on
    // the host (host_largest_rank_extra_bytes). The planner fits that rank.
    size_t largest_rank_extra_bytes = 0;
    size_t host_largest_rank_extra_bytes = 0;

    // Model state off the device (offload_optimizer): what the host holds for the whole run, by category (on
    // the host's account), and its high-water mark during a step (with the update's transient). Zero without
    // offload. The device's `parameters` are then the working copies, its `gradients` the window's buffers,
    // and its `optimizer_state` nothing.
    std::array<size_t, memory_category_count> host{};
    size_t host_peak_bytes = 0;
    size_t host_of(MemoryCategory category) const { return host[static_cast<size_t>(category)]; }

    // The joint high-water mark of everything the device account holds during one Trainer::train_step (what
    // StepResult::memory.peak_bytes reports): the persistent categories, the step's micro-batches, and the
    // largest sum of activations and workspace at one moment. `peak_bytes` is for a device with memory of its
    // own (pinned_host lives on the host); `unified_peak_bytes` for the CPU backend, whose one account holds
    // the offloaded inputs too.
    size_t peak_bytes = 0;
    size_t unified_peak_bytes = 0;
    // What the accounts hold between steps, when a step's micro-batches and transients are gone: the model state on
    // the device (with ZeRO-1's buffers, without the layers streamed in for a step), and on the host its tiers
    // (offload_optimizer: the masters, their gradients, the state, the parked copies). The CPU backend's one account
    // holds both.
    size_t between_steps_bytes = 0;
    size_t host_between_steps_bytes = 0;
    // offload_optimizer under bf16: the one rounded copy of the largest master the host makes on its way to the
    // device, whenever the working copies are refreshed from the masters (each update, and after a resume).
    size_t host_rounding_bytes = 0;
    // Pinned host memory at its high-water mark during a step on a device: the parked working copies, and the larger
    // of the offloaded segment inputs (at the end of forward) and one (B,T) i32 tensor staged on its way to the device
    // (each micro-batch's ids, targets and positions go up through a pinned block of their own size).
    size_t pinned_peak_bytes = 0;
    // What a CUDA device holds besides: cuBLASLt's workspace, which the first GEMM through cuBLASLt (GPT-2's
    // biased linears; Llama has none) allocates and the engine keeps (engine/cuda/runtime.h). Not in the
    // categories above.
    size_t cuda_runtime_bytes = 0;
    std::string peak_moment; // where the joint peak falls, e.g. "backward of block 4 (plain)"

    std::string activations_peak_moment; // e.g. "recompute of segment 3 (blocks 5-6) in backward"
    int checkpointed_segments = 0;
    int recomputed_blocks = 0; // blocks run twice per step: the extra compute, in block forwards

    size_t of(MemoryCategory category) const { return peaks[static_cast<size_t>(category)]; }
    size_t& at(MemoryCategory category) { return peaks[static_cast<size_t>(category)]; }
    // The joint peak on `device`'s account: unified on the CPU; elsewhere the device's own, with the CUDA
    // runtime's buffers.
    size_t peak_on(Device device) const {
        return device == Device::cpu ? unified_peak_bytes : peak_bytes + cuda_runtime_bytes;
    }
    // Sum of the device categories' peaks: an upper bound on the per-step activations + workspace (the
    // activation peak and the workspace peak fall at different moments); peak_bytes is the exact joint figure.
    size_t device_total_bound() const;
};

// One training step as the trainer runs it: logits = model.forward_padded(tokens (B,T)) (B,T,Vp) in train mode;
// loss = multiply(cross_entropy_in_place(logits, targets, sum, 1 / items, -100, V), 1 / items) (the fused
// classifier: no separate (B,T,Vp) gradient buffer); logits dropped; backward(loss). Parameters and gradients
// count wte's padded rows (Vp = vocab_size rounded up to 128); the optimizer state only the real ones. Llama
// pads nothing (Vp = V) and adds its RoPE tables to `parameters` (constant_buffers).
// The per-category peaks leave out bytes already live before the step (tokens, targets); peak_bytes counts
// them as Trainer::train_step holds them: all `accumulation_steps` micro-batches (inputs and labels) for the
// whole step, the current one's device copies, and the earlier micro-batches' reported losses.
// sharding.ranks > 1 is ZeRO stage 1 over that many ranks (optim/zero.h): the optimizer state of one rank's
// part (the parameters padded to equal parts of whole pieces, distributed::ZeroPartition), and the collectives'
// buffers (N + 1 pieces) in the workspace. sharding.gradients (stage 2): the gradients of that part in a buffer of
// its own, and the checkpointed segments' layers without whole gradient buffers but during their backward.
// sharding.parameters (stage 3): the masters of that part in a buffer of its own, and those layers without their
// weights (masters and working copies) but while their segment runs its forward, and its recompute and backward.
// offload_optimizer: the masters, their gradients and the optimizer state on the host; `gradients`: where a
// window's gradients are summed then; offload_parameters: the checkpointed layers' working copies parked on the
// host too, fetched one segment at a time (StepShape); loss_chunk_tokens > 0: the streaming LM head
// (linear_cross_entropy over chunks of that many of the B·T tokens) in place of the whole logits; mlp_tile_tokens
// > 0: every decoder layer's MLP tiled over that many of them (checkpoint::tiled_rows); packed_documents: each
// micro-batch carries its (B,T) i32 positions beside its ids and labels (nn::Batch::positions), on the host for the
// step and on the device for its forward and backward (they change no activation: the ops keep them by reference).
// tuning.lora: a LoRA or QLoRA run (nn::apply_lora, nn::quantize_nf4), its model state predict_model_state's and its
// step replayed (planner/adapter_step.h: exact to the byte for GPT-2 and Llama); refused, naming it, with the
// optimizer or parameters off the device or ZeRO-1, which the replay does not follow yet.
// batch_invariant_chunk c > 0 (optim::TrainerConfig, docs/TRAINING.md "The big batch, bitwise"): the step runs each
// micro-batch as its batch / c chunks of c rows, so its activations are a chunk's (the step of micro-batch c and
// accumulation_steps · batch / c); besides, batch_invariant_sum_bytes for the whole run (`gradients`), and the window's
// chunks copied from its micro-batches for the window (where they are).
// Not with LoRA, ZeRO-2 or 3, or the optimizer on the host (refused, as the trainer refuses them).
MemoryPrediction predict_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                const checkpoint::CheckpointPolicy& policy, DType dtype = DType::f32,
                                OptimizerKind optimizer = OptimizerKind::adamw, ZeroSharding sharding = {},
                                int accumulation_steps = 1, bool offload_optimizer = false,
                                GradientOffload gradients = GradientOffload::window, bool offload_parameters = false,
                                int loss_chunk_tokens = 0, int mlp_tile_tokens = 0, bool packed_documents = false,
                                const FineTuning& tuning = {}, int batch_invariant_chunk = 0);

// predict_memory's batch-invariant mode (batch_invariant_chunk > 0; planner/batch_invariant_memory.cpp), with its
// arguments.
MemoryPrediction predict_batch_invariant_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                                const checkpoint::CheckpointPolicy& policy, DType dtype,
                                                OptimizerKind optimizer, ZeroSharding sharding, int accumulation_steps,
                                                bool offload_optimizer, GradientOffload gradients_where,
                                                bool offload_parameters, int loss_chunk_tokens, int mlp_tile_tokens,
                                                bool packed_documents, const FineTuning& tuning,
                                                int batch_invariant_chunk);

// The parameter tensors of a full fine-tune of `config`, each with its own gradient buffer.
int parameter_tensor_count(const nn::ModelConfig& config);
// The staging buffer of Communicator::all_reduce_gradients over the trainable gradients of `config`, in
// `element_bytes` elements: the tensors shorter than a bucket together, at most one bucket (32 MiB).
size_t all_reduce_bucket_bytes(const nn::ModelConfig& config, size_t element_bytes);
// A gradient all-reduce's moment in `prediction`: `beside` bytes held while its `bucket` is staged (in `workspace`);
// it becomes the joint peak, named `moment`, where it is the highest.
void hold_all_reduce(MemoryPrediction& prediction, size_t beside, size_t bucket, const char* moment);
// The batch-invariant mode's sums for the whole run (optim::FixedPointGradients): an f64 beside every element of the
// gradients the parameters show (GPT-2's wte: its V rows, not the padded Vp) and an i32 slot per tensor.
size_t batch_invariant_sum_bytes(const nn::ModelConfig& config, DType dtype);

// A phase of a run outside the step: its joint peak on the device's account (on the CPU backend, the one account),
// where it falls, and what a CUDA device holds besides (as MemoryPrediction::cuda_runtime_bytes).
struct PhasePrediction {
    size_t peak_bytes = 0;
    std::string moment; // e.g. "evaluation of block 3"
    size_t cuda_runtime_bytes = 0;
    size_t peak_on(Device device) const { return device == Device::cpu ? peak_bytes : peak_bytes + cuda_runtime_bytes; }
};

// The evaluation phase (Trainer::evaluate between steps: train_gpt's --eval-data over eval_batches batches of
// batch x seq_len): the model state as a step leaves it (predict_memory's between_steps_bytes for these tiers:
// `gradients` says where a window's gradients live), the evaluation's batches, the current
// one's device copies, and one micro-batch's forward in eval mode under no-grad (planner/adapter_step.h's replay,
// exact to the byte on the CPU for full, LoRA and QLoRA runs of GPT-2 and Llama, and under ZeRO-1 with its part of
// the optimizer state and its collective buffers, and with the optimizer on the host beside the working copies and
// the gradients the device keeps between steps). Refused, naming it, with parameters streamed from the host (offload_parameters), which it does
// not model yet, and for LoRA under ZeRO-1 or with the optimizer on the host, which the step's replay does not follow.
PhasePrediction predict_evaluation_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                          const checkpoint::CheckpointPolicy& policy, DType dtype,
                                          OptimizerKind optimizer, ZeroSharding sharding, bool offload_optimizer,
                                          GradientOffload gradients, bool offload_parameters, int eval_batches,
                                          int loss_chunk_tokens,
                                          int mlp_tile_tokens, bool packed_documents, const FineTuning& tuning = {},
                                          int batch_invariant_chunk = 0);

// Saving and resuming a training state (optim/training_state.h: streamed tensor by tensor between the file and where
// each tensor lives). Neither adds anything to the device: a save reads the model state where it is between steps
// (ZeRO-1 gathers each tensor through its collective buffers), a resume writes into the freshly built trainer's
// tensors before its first step. What they add is on the host: one pinned block of io::state_staging_bytes when a saved tensor
// lives on a device (none on the CPU backend, none when offload_optimizer keeps every saved tensor on the host).
// `step` is predict_memory's prediction for the run. Exact to the byte on the CPU and on the emulated device.
struct StatePhasesPrediction {
    size_t device_save_peak = 0;   // the device's account during a save (on the CPU backend, the one account)
    size_t device_resume_peak = 0; // during the resume: the same less what the first step makes (cuBLASLt's workspace)
    size_t pinned_peak = 0;        // of it pinned on a device, during either: the parked copies and the block
    size_t host_save_peak = 0;     // the host's account on a device: its tiers and the block
    size_t host_resume_peak = 0;   // the same, or with the optimizer on the host, its tiers and the rounded copy the
                                   // working copies are refreshed through (bf16)
    size_t staging = 0;            // the pinned block
};
StatePhasesPrediction predict_state_phases(const MemoryPrediction& step, Device device, bool offload_optimizer);

// Loading initial weights (train_gpt's --init: nn::load_safetensors_into, which streams each tensor a chunk at a time
// into its parameter through two heap buffers of at most 2 MiB). The model is as built: every parameter in f32 with
// its f32 gradient buffer (LoRA, NF4 and the step's dtype come after the load) and Llama's RoPE tables; the load adds
// nothing to any account. `built_on_host`: the model is built on the host first (train_gpt does so with the optimizer
// on the host or a 4-bit base), so the device holds nothing yet. On the CPU backend both are the one account.
struct LoadPhasePrediction {
    size_t device_peak = 0;
    size_t host_peak = 0;
};
LoadPhasePrediction predict_load_phase(const nn::ModelConfig& config, Device device, bool built_on_host);

// The streaming LM head's chunk when nothing asks for another (train_gpt's --loss-chunk-tokens auto): the head's
// transient (its d(hidden), one chunk's logits, the per-token losses) at most automatic_loss_chunk_bytes. Every
// token of the micro-batch when that holds for the whole logits (one chunk: bitwise the fused classifier over
// the whole logits), else the largest multiple of minimum_loss_chunk tokens for which it does (at least one);
// when d(hidden) and the losses alone take more than half the target, the chunk's logits get half of it.
inline constexpr size_t automatic_loss_chunk_bytes = size_t(256) << 20;
inline constexpr int minimum_loss_chunk = 64; // tokens: the planner halves a chunk no further; auto rounds to it
int automatic_loss_chunk(const nn::ModelConfig& config, int batch, int seq_len, DType dtype);

// The MLP tile when nothing asks for another (train_gpt's --mlp-tile-tokens auto): 0 (the whole MLP, no extra
// forward) while one layer's MLP intermediates for the whole micro-batch (Llama's g, u, w; GPT-2's c_fc and gelu
// outputs) are at most automatic_mlp_tile_threshold (the streaming head's own target: tiling costs one more MLP
// forward, so it waits until the intermediates are as large as the head's buffers), else the largest multiple of
// minimum_mlp_tile tokens whose intermediates are at most automatic_mlp_tile_bytes (at least one).
inline constexpr size_t automatic_mlp_tile_threshold = size_t(256) << 20;
inline constexpr size_t automatic_mlp_tile_bytes = size_t(64) << 20;
inline constexpr int minimum_mlp_tile = 64; // tokens: the planner halves a tile no further; auto rounds to it
int automatic_mlp_tile(const nn::ModelConfig& config, int batch, int seq_len, DType dtype);

// The parameters' element count with wte's rows counted as `vocabulary_rows`: vocab_size gives the real count
// (what the optimizer keeps moments for), padded_vocab_size() the stored one. For Llama both are vocab_size
// (another count throws); the RoPE tables are buffers, not parameters.
size_t parameter_count(const nn::ModelConfig& config, int vocabulary_rows);

// A human-readable plan for `train_gpt --plan`: the segment layout, the recompute cost and the predicted
// peak per category, next to the same prediction without checkpointing.
std::string plan_report(const nn::ModelConfig& config, int batch, int seq_len,
                        const checkpoint::CheckpointPolicy& policy, DType dtype = DType::f32,
                        OptimizerKind optimizer = OptimizerKind::adamw, ZeroSharding sharding = {},
                        int accumulation_steps = 1, bool offload_optimizer = false,
                        GradientOffload gradients = GradientOffload::window, bool offload_parameters = false,
                        int loss_chunk_tokens = 0, int mlp_tile_tokens = 0, bool packed_documents = false,
                        const FineTuning& tuning = {}, int batch_invariant_chunk = 0);

// One decoder layer's parameters (what streamed gradients hold per layer), and the largest of them.
size_t layer_parameter_count(const nn::ModelConfig& config);
// ZeRO-3: of the checkpointed segments' layers' parameters (and with `tables` the token table's and the head's), the
// elements in `rank`'s part of the flat layout (the trainable parameters in model order, as the trainer lays them out).
size_t sharded_layer_elements(const nn::ModelConfig& config, const std::vector<checkpoint::Segment>& segments,
                              const distributed::ZeroPartition& partition, int64_t rank, bool tables = false);
// ZeRO-2 and 3: the elements of one of the token table and head when the trainer shards their gradients (and at stage 3
// their weights) too (the model state on the device, an untied Llama: optim::ModuleTrainer's rule), else 0.
size_t sharded_table_elements(const nn::ModelConfig& config, ZeroSharding sharding, bool offload_optimizer);
size_t largest_layer_parameter(const nn::ModelConfig& config);

std::string mebibytes(size_t bytes); // "12.34 MiB"

} // namespace engine::planner
