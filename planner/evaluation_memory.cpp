// The evaluation phase's memory (Trainer::evaluate between steps, train_gpt's --eval-data): the model state as a
// step leaves it, the evaluation's batches, and one micro-batch's forward under no-grad, replayed
// (planner/adapter_step.h). docs/MEMORY.md, "Phases outside the step".
#include "engine/cuda/runtime.h"
#include "planner/adapter_step.h"
#include "planner/memory_model.h"

namespace engine::planner {

PhasePrediction predict_evaluation_memory(const nn::ModelConfig& config, int batch, int seq_len,
                                          const checkpoint::CheckpointPolicy& policy, DType dtype,
                                          OptimizerKind optimizer, ZeroSharding sharding, bool offload_optimizer,
                                          GradientOffload gradients, bool offload_parameters, int eval_batches, int loss_chunk_tokens, int mlp_tile_tokens,
                                          bool packed_documents, const FineTuning& tuning, int batch_invariant_chunk) {
    constexpr const char* what = "predict_evaluation_memory";
    ENGINE_CHECK(eval_batches >= 1, what << ": eval_batches " << eval_batches << " must be >= 1");
    ENGINE_CHECK(batch > 0 && seq_len > 0 && seq_len <= config.max_seq_len(),
                 what << ": batch " << batch << " and seq_len " << seq_len << " must be positive, seq_len at most "
                      << config.max_seq_len());
    ENGINE_CHECK(!offload_parameters,
                 what << ": the evaluation with parameters streamed from the host is not modelled yet");
    // Between steps the trainer holds the model state only (its device copies of a micro-batch are gone): under
    // ZeRO-1 with the optimizer's part and the collectives' buffers, with the optimizer on the host the working copies and
    // the window's gradient buffers (predict_memory's between_steps_bytes); at ZeRO-3 this rank's part of the
    // segments' masters, and during each segment's forward its gathered weights (as in the step's forward).
    // (The batch-invariant mode's sums are part of that state; an evaluation runs its micro-batches whole.)
    const MemoryPrediction step = predict_memory(config, batch, seq_len, policy, dtype, optimizer, sharding, 1,
                                                 offload_optimizer, gradients, false, loss_chunk_tokens,
                                                 mlp_tile_tokens, packed_documents, tuning, batch_invariant_chunk);
    const size_t state = step.between_steps_bytes;
    // The evaluation's batches (ids and labels, and positions for packed documents) for its whole length, and the
    // current micro-batch's device copies (its ids and shifted targets, and positions).
    const size_t per_batch = packed_documents ? 3 : 2;
    const size_t ids = static_cast<size_t>(batch) * static_cast<size_t>(seq_len) * sizeof(int32_t);
    const size_t batches = (static_cast<size_t>(eval_batches) + 1) * per_batch * ids;
    const AdapterStepWalk walk =
        walk_evaluation(config, batch, seq_len, policy, dtype, tuning, loss_chunk_tokens, mlp_tile_tokens, nullptr,
                        sharding.parameters ? step.gathered_layer_bytes : 0, step.gathered_table_bytes);
    PhasePrediction phase;
    phase.peak_bytes = state + batches + walk.joint;
    phase.moment = walk.joint_moment;
    // GPT-2's biased linears run through cuBLASLt's fused epilogue (its workspace, kept once made); Llama's do not.
    phase.cuda_runtime_bytes = config.is_llama() ? 0 : cuda::cublaslt_workspace_bytes;
    return phase;
}

} // namespace engine::planner
