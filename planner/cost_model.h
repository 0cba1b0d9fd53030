// Predicts one training step's work (FLOPs of forward, backward and recompute; bytes streamed; host<->device
// bytes) and its time from a device's ceilings. docs/PERF.md ("Planner") holds the constants and the errors.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/dtype.h"
#include "nn/model_config.h"
#include "planner/memory_model.h"

namespace engine::planner {

// What a device sustains: the rates the predicted time divides by.
struct Ceilings {
    double gemm_flops_per_second = 0;      // dense matrix multiply (the BLAS on the CPU, cuBLAS on CUDA)
    double attention_flops_per_second = 0; // the attention kernels (plain loops on the CPU)
    double memory_bytes_per_second = 0;    // streaming elementwise kernels over device memory
    double host_link_bytes_per_second = 0; // offload's copies (pinned host <-> device; a copy on the CPU)
    double host_memory_bytes_per_second = 0; // the host's streaming kernels (optimizer offload's update)
    double seconds_per_op = 0;             // a fixed cost per op launched (dispatch, kernel launch)
    double collective_bytes_per_second = 0; // the data-parallel ranks' collectives, bytes through each rank's link
    double seconds_per_collective = 0;     // a fixed cost per collective call (latency)
    std::string source;                    // "measured on this CPU" or where the constants come from
};

// Measured on first use and cached for the process: a 256^3 GEMM through the BLAS, a dot-product loop like
// attention's, a 16 MiB copy (best of a few repetitions each). Uses plain vectors, never the accounting
// allocator, so planning allocates no tensor. About 0.1 s.
const Ceilings& cpu_ceilings();
// H200 constants (bench/roofline.py's PEAK, BANDWIDTH, EFFICIENCY, ATTENTION_RATE; docs/PERF.md): tf32 GEMMs
// for f32, bf16 tensor cores for bf16.
Ceilings cuda_ceilings(DType dtype);
Ceilings ceilings_for(Device device, DType dtype);

struct StepCost {
    // Per optimizer step (all micro-batches).
    double forward_flops = 0;   // GEMMs and attention of the forwards
    double backward_flops = 0;  // 2x the GEMMs, 2.5x attention
    double recompute_flops = 0; // the checkpointed blocks' second forward, and a tiled MLP's
    double gemm_flops = 0, attention_flops = 0; // the same FLOPs split by which ceiling they meet
    double streamed_bytes = 0;     // elementwise traffic of forward, backward, recompute and the optimizer
    double host_device_bytes = 0;  // offload: each saved input out in forward and back before its recompute;
                                   // optimizer offload: the gradients down and the working copies up
    double host_bytes = 0;         // optimizer offload: the host update's traffic (masters, gradients, moments)
    double ops = 0;                // op launches
    double gemm_seconds = 0, attention_seconds = 0, memory_seconds = 0, transfer_seconds = 0, op_seconds = 0;
    double host_seconds = 0;
    // Data parallelism over several ranks (add_communication, called by the planner): the bytes through each
    // rank's link in the step's collectives, their calls, and their time.
    double communicated_bytes = 0, collectives = 0, communication_seconds = 0;
    // Streamed parameters: the part of the prefetched weight copies (on the copy stream) that the segment
    // computing meanwhile hides; transfer_seconds is net of it.
    double hidden_transfer_seconds = 0;
    // Their sum: nothing overlaps on the CPU, and on CUDA offload runs on the compute stream and the host update
    // between steps; only the prefetched weights overlap (hidden_transfer_seconds).
    double seconds = 0;
    std::string to_string() const;
};

StepCost predict_cost(const nn::ModelConfig& config, int micro_batch, int accumulation_steps, int seq_len,
                      const checkpoint::CheckpointPolicy& policy, DType dtype, OptimizerKind optimizer,
                      int optimizer_shards, const Ceilings& ceilings, bool offload_optimizer = false,
                      GradientOffload gradients = GradientOffload::window, bool offload_parameters = false,
                      int loss_chunk_tokens = 0, int mlp_tile_tokens = 0, bool gathered_on_host = false);

// The step's collectives over `ranks` data-parallel ranks at ZeRO stage `zero_stage` (nothing on one rank), added to
// `cost` (its communicated bytes, collectives and seconds, and the total): ring algorithms, bytes through every rank's
// link. Stage 0 all-reduces the f32 gradients once a step (2(N − 1)/N of them); stage 1 reduce-scatters them and
// all-gathers the masters, as many bytes, in pieces (distributed::ZeroPartition); stage 2 reduces the checkpointed
// layers' gradients onto their owners once per micro-batch and the rest once (a reduce moves its whole payload), and
// all-gathers as stage 1: more than stage 1 even with one micro-batch (N/(N − 1) times its reduce-scatter), and A
// times the layers' gradients with A. Not modelled: the scalar reductions, a LoRA run's smaller reductions (the
// whole model's are counted), the host's links under offload_optimizer (priced as the device's). Time: bytes over
// collective_bytes_per_second plus seconds_per_collective a call.
// gathered_element_bytes: what one element of a ZeRO-3 segment's gathered weights takes on the wire (4: f32 masters,
// in fp32 or gathered on the host; 2: bf16 copies its owners rounded). table_elements: at ZeRO-2 and 3, one of the token
// table and head when they are sharded too (sharded_table_elements), table_count of them (1: tied): each one's gradient
// is then reduced once per micro-batch, and at stage 3 the table is gathered for each lookup and the head (the table
// again when tied) for each loss, instead of once per step each. batch_invariant (stages 0 and 1): the exact f64 sums
// all-reduced once a step instead (twice the f32 bytes), and at stage 1 the masters all-gathered as before.
void add_communication(StepCost& cost, const nn::ModelConfig& config, int accumulation_steps,
                       const checkpoint::CheckpointPolicy& policy, int zero_stage, int ranks, const Ceilings& ceilings,
                       int gathered_element_bytes = 4, size_t table_elements = 0, int table_count = 2, bool batch_invariant = false);

} // namespace engine::planner
