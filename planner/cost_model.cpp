// The cost model: FLOPs and bytes of one training step counted from the model's shapes, turned into a time
// by the device's ceilings (measured once on the CPU, constants on CUDA). docs/PERF.md ("Planner").
#include "planner/cost_model.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <vector>

#include "engine/distributed/communicator.h"
#include "engine/distributed/zero_partition.h"
#include "planner/step_terms.h"

namespace engine::planner {
namespace {

using Clock = std::chrono::steady_clock;

// The best of `repetitions` timings of `work`: the machine is shared, and the least disturbed run is the
// closest to what the device can do.
template <typename Work>
double best_seconds(int repetitions, Work&& work) {
    double best = 1e30;
    for (int repetition = 0; repetition < repetitions; ++repetition) {
        const auto start = Clock::now();
        work();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return std::max(best, 1e-9);
}

Ceilings measure_cpu() {
    Ceilings ceilings;
    const int size = 256;
    std::vector<float> a(size * size, 0.5f), b(size * size, 0.25f), c(size * size, 0.0f);
    const double gemm = best_seconds(5, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a.data(), size, b.data(),
                    size, 0.0f, c.data(), size);
    });
    ceilings.gemm_flops_per_second = 2.0 * size * size * size / gemm;
    // Attention's CPU kernels are loops of short dot products over the keys (kernels/cpu/attention_*.cpp).
    const int width = 32, keys = 256;
    std::vector<float> query(width, 0.5f), key_rows(static_cast<size_t>(keys) * width, 0.25f), scores(keys);
    volatile float sink = 0.0f;
    const double attention = best_seconds(5, [&] {
        for (int round = 0; round < 16; ++round) {
            for (int key = 0; key < keys; ++key) {
                float dot = 0.0f;
                for (int index = 0; index < width; ++index) dot += query[index] * key_rows[key * width + index];
                scores[key] = dot;
            }
            sink = sink + scores[round];
        }
    });
    ceilings.attention_flops_per_second = 2.0 * 16 * keys * width / attention;
    const size_t bytes = size_t(16) << 20;
    std::vector<char> source(bytes, 1), target(bytes, 0);
    const double copy = best_seconds(3, [&] { std::memcpy(target.data(), source.data(), bytes); });
    ceilings.memory_bytes_per_second = 2.0 * static_cast<double>(bytes) / copy; // read + write
    ceilings.host_link_bytes_per_second = static_cast<double>(bytes) / copy;    // offload's copy is a memcpy
    ceilings.host_memory_bytes_per_second = ceilings.memory_bytes_per_second;
    ceilings.seconds_per_op = 2e-6; // dispatch, tape record and allocation of one op (a few microseconds)
    // MPI ranks on one host move their collectives through shared memory: a copy in and a copy out, and the sum.
    ceilings.collective_bytes_per_second = static_cast<double>(bytes) / copy / 3.0;
    ceilings.seconds_per_collective = 20e-6;
    ceilings.source = "measured on this CPU (BLAS sgemm 256^3, dot loop, 16 MiB memcpy)";
    return ceilings;
}

} // namespace

const Ceilings& cpu_ceilings() {
    static const Ceilings measured = measure_cpu();
    return measured;
}

Ceilings cuda_ceilings(DType dtype) {
    // One H200 (bench/roofline.py): TF32 495 TFLOP/s or bf16 990 at 60% for cuBLAS at these shapes; attention's
    // wmma kernels at their analysed rates (forward and backward averaged over a step's 1 : 2.5 FLOPs); HBM
    // 4.3 TB/s at 75% for streaming kernels; pinned host over PCIe 5 x16 at about 50 GB/s; a 2 us launch gap.
    const bool bf16 = dtype == DType::bf16;
    Ceilings ceilings;
    ceilings.gemm_flops_per_second = 0.60 * (bf16 ? 990e12 : 495e12);
    const double forward = bf16 ? 120e12 : 75e12, backward = bf16 ? 48e12 : 30e12;
    ceilings.attention_flops_per_second = 3.5 / (1.0 / forward + 2.5 / backward);
    ceilings.memory_bytes_per_second = 0.75 * 4.3e12;
    ceilings.host_link_bytes_per_second = 50e9;
    // The host beside it for optimizer offload: an assumption until bench_host_step measures a GPU machine's
    // host (docs/PERF.md): AdamW's streaming passes at 50 GB/s.
    ceilings.host_memory_bytes_per_second = 50e9;
    ceilings.seconds_per_op = 2e-6;
    // NCCL within an 8-GPU NVLink node: about 400 GB/s of bus bandwidth measured where NVLink 4 says 900
    // (docs/DISTRIBUTED.md, "Communication volume"), and some 20 us a call.
    ceilings.collective_bytes_per_second = 400e9;
    ceilings.seconds_per_collective = 20e-6;
    ceilings.source = std::string("H200 constants (docs/PERF.md), ") + (bf16 ? "bf16" : "tf32") + " tensor cores";
    return ceilings;
}

Ceilings ceilings_for(Device device, DType dtype) {
    return device == Device::cpu ? cpu_ceilings() : cuda_ceilings(dtype);
}

std::string StepCost::to_string() const {
    std::ostringstream text;
    text << std::setprecision(3) << "forward " << forward_flops / 1e9 << " GFLOP, backward " << backward_flops / 1e9
         << ", recompute " << recompute_flops / 1e9 << "; streamed " << streamed_bytes / (1 << 20)
         << " MiB; host<->device " << host_device_bytes / (1 << 20) << " MiB; predicted " << seconds * 1e3
         << " ms (GEMM " << gemm_seconds * 1e3 << ", attention " << attention_seconds * 1e3 << ", memory "
         << memory_seconds * 1e3 << ", transfer " << transfer_seconds * 1e3 << ", ops " << op_seconds * 1e3;
    if (host_seconds > 0) text << ", host update " << host_seconds * 1e3;
    if (communication_seconds > 0)
        text << ", collectives " << communication_seconds * 1e3 << " for " << communicated_bytes / (1 << 20) << " MiB in "
             << collectives << " calls";
    if (hidden_transfer_seconds > 0) text << "; " << hidden_transfer_seconds * 1e3 << " of prefetch hidden";
    text << ")";
    return text.str();
}

namespace {

// One architecture's per-micro-batch work: a decoder layer's forward GEMM and attention FLOPs, its elementwise
// bytes and op count, and the LM head's GEMM and bytes.
struct LayerWork {
    double layer_gemm = 0, layer_attention = 0, layer_bytes = 0, layer_ops = 0;
    // Of them, the MLP's forward: what a tiled MLP runs once more in backward (GEMMs, its activation's bytes, ops).
    double mlp_gemm = 0, mlp_bytes = 0, mlp_ops = 0;
    double head_gemm = 0, head_bytes = 0;
    double parameters = 0; // what the optimizer updates
};

// Causal attention's two products over the keys 0..t, for NH heads of D (NH·D = C): 2 B T (T+1) C, both archs.
double causal_attention_flops(double batch, double seq_len, double width) {
    return 2.0 * batch * seq_len * (seq_len + 1.0) * width;
}

LayerWork gpt_work(const nn::GPTConfig& config, double batch, double seq_len, double element) {
    const double rows = batch * seq_len, width = config.n_embd;
    const double vocabulary = config.padded_vocab_size();
    LayerWork work;
    // qkv, attention's projection and the MLP's two GEMMs (24 N C^2). Elementwise: a block's forward streams
    // about 22 (B,T,C) tensors (two layernorms, the residual adds, GELU over 4C, attention's qkv in and out).
    work.layer_gemm = 24.0 * rows * width * width;
    work.layer_attention = causal_attention_flops(batch, seq_len, width);
    work.layer_bytes = 22.0 * rows * width * element;
    work.layer_ops = 15.0;
    work.mlp_gemm = 16.0 * rows * width * width; // c_fc and c_proj
    work.mlp_bytes = 8.0 * rows * width * element; // GELU over 4C, in and out
    work.mlp_ops = 3.0;
    work.head_gemm = 2.0 * rows * width * vocabulary;
    work.head_bytes = 3.0 * rows * vocabulary * element;
    work.parameters = static_cast<double>(parameter_count(config, config.vocab_size));
    return work;
}

LayerWork llama_work(const nn::LlamaConfig& config, double batch, double seq_len, double element) {
    const double rows = batch * seq_len, width = config.hidden_size;
    const double key_value = config.key_value_width(), intermediate = config.intermediate_size;
    LayerWork work;
    // q and o (C x C), k and v (C x KVH·D: grouped-query attention shrinks them), gate, up and down (C x I).
    work.layer_gemm = 2.0 * rows * (2.0 * width * width + 2.0 * width * key_value + 3.0 * width * intermediate);
    work.layer_attention = causal_attention_flops(batch, seq_len, width);
    // Elementwise, each tensor read and written once: two RMSNorms (4 A), rope on q and k (2 A + 2 K), the concat
    // (2 A + 4 K), attention's packed input and output (2 A + 2 K), two residual adds (6 A), SwiGLU (3 M).
    work.layer_bytes = rows * element * (16.0 * width + 8.0 * key_value + 3.0 * intermediate);
    work.layer_ops = 16.0; // rms_norm, 3 projections, 2 ropes, concat, attention, o_proj, add, rms_norm, 3, swiglu, add
    work.mlp_gemm = 6.0 * rows * width * intermediate; // gate, up, down
    work.mlp_bytes = 3.0 * rows * intermediate * element; // SwiGLU
    work.mlp_ops = 4.0;
    work.head_gemm = 2.0 * rows * width * config.vocab_size; // no padding
    work.head_bytes = 3.0 * rows * config.vocab_size * element;
    work.parameters = static_cast<double>(llama_parameter_count(config));
    return work;
}

} // namespace

StepCost predict_cost(const nn::ModelConfig& config, int micro_batch, int accumulation_steps, int seq_len,
                      const checkpoint::CheckpointPolicy& policy, DType dtype, OptimizerKind optimizer,
                      int optimizer_shards, const Ceilings& ceilings, bool offload_optimizer,
                      GradientOffload gradients, bool offload_parameters, int loss_chunk_tokens, int mlp_tile_tokens,
                      bool gathered_on_host) {
    const double rows = static_cast<double>(micro_batch) * seq_len; // N = B*T per micro-batch
    const double width = config.width(), layers = config.layers();
    const double steps = accumulation_steps;
    const double element = static_cast<double>(dtype_size(dtype));
    const double wide = static_cast<double>(dtype_size(compute_dtype(dtype)));
    int recomputed = 0, offloaded = 0, checkpointed_segments = 0;
    for (const checkpoint::Segment& segment : checkpoint::plan_segments(config.layers(), policy)) {
        if (!segment.checkpointed) continue;
        recomputed += segment.layer_count;
        ++offloaded;
        ++checkpointed_segments;
    }
    if (!(policy.enabled && policy.offload)) offloaded = 0;

    const LayerWork work = config.is_llama() ? llama_work(config.llama(), micro_batch, seq_len, element)
                                             : gpt_work(config.gpt(), micro_batch, seq_len, element);
    const double block_gemm = work.layer_gemm, block_attention = work.layer_attention, head_gemm = work.head_gemm;
    StepCost cost;
    const double forward_gemm = layers * block_gemm + head_gemm, forward_attention = layers * block_attention;
    cost.forward_flops = steps * (forward_gemm + forward_attention);
    cost.backward_flops = steps * (2.0 * forward_gemm + 2.5 * forward_attention);
    cost.recompute_flops = steps * recomputed * (block_gemm + block_attention);
    cost.gemm_flops = steps * (3.0 * forward_gemm + recomputed * block_gemm);
    cost.attention_flops = steps * (3.5 * forward_attention + recomputed * block_attention);

    // Elementwise traffic (the layers' in LayerWork), backward twice the forward's; the fused classifier reads
    // and writes the logits; the optimizer reads the parameters, gradients and moments and writes the
    // parameters and moments once per step, and zero_grad and the norm touch the gradients again.
    const double stream = rows * width * element;
    const double block_bytes = work.layer_bytes;
    const double head_bytes = work.head_bytes;
    const double parameters = work.parameters;
    const double shard = parameters / optimizer_shards;
    const double optimizer_passes = optimizer == OptimizerKind::adamw ? 7 : optimizer == OptimizerKind::sgd ? 5 : 2;
    const double refresh = element != wide ? parameters * element : 0.0; // bf16: the working copies' refresh
    const double optimizer_bytes = optimizer_passes * shard * wide;
    cost.streamed_bytes = steps * (3.0 * layers * block_bytes + recomputed * block_bytes + head_bytes) +
                          2.0 * parameters * wide + (offload_optimizer ? 0.0 : optimizer_bytes + refresh);
    if (loss_chunk_tokens > 0) {
        // The streaming head: the same GEMMs over chunks, but every chunk's weight-gradient GEMM reads and writes
        // the head's f32 gradient (Vp,C) again (beta 1), where the whole logits' one GEMM does it once; and
        // d(hidden) is zeroed first. Five launches a chunk instead of the head's and loss's three.
        const double chunks = std::ceil(rows / std::min<double>(loss_chunk_tokens, rows));
        const double head_gradient = static_cast<double>(config.padded_vocab_size()) * width * wide;
        cost.streamed_bytes += steps * ((chunks - 1.0) * 2.0 * head_gradient + stream);
        cost.ops += steps * (5.0 * chunks - 3.0);
    }
    if (mlp_tile_tokens > 0) {
        // The tiled MLP: every layer's backward runs the MLP forward once more, tile by tile (recompute); the tiles
        // go in and out through row copies (forward: the input rows and the result's, 4 A; backward: the input
        // rows, d(result)'s and d(input)'s, 6 A, and d(input) zeroed, A); per tile its ops forward (the MLP's and
        // two copies), and in backward its recompute, a backward of twice the ops and three copies, where the
        // untiled MLP's three passes are in layer_ops already.
        const double tiles = std::ceil(rows / std::min<double>(mlp_tile_tokens, rows));
        cost.recompute_flops += steps * layers * work.mlp_gemm;
        cost.gemm_flops += steps * layers * work.mlp_gemm;
        cost.streamed_bytes += steps * layers * (work.mlp_bytes + 11.0 * stream);
        cost.ops += steps * layers * (tiles * (4.0 * work.mlp_ops + 5.0) + 1.0 - 3.0 * work.mlp_ops);
        // A checkpointed layer's segment recompute runs the tiled forward again: its copies (4 A) and, beside the
        // MLP ops layer_ops counts for the recompute, two copies a tile and the MLP's launches once per tile.
        cost.streamed_bytes += steps * recomputed * 4.0 * stream;
        cost.ops += steps * recomputed * (tiles * (work.mlp_ops + 2.0) - work.mlp_ops);
    }
    cost.host_device_bytes = steps * 2.0 * offloaded * stream;
    if (offload_optimizer) {
        // The update moves to the host and the refresh rounds there (the masters' gradient buffers are overwritten
        // by the next copy, so they need no zeroing); the window's gradients cross down once and the working
        // copies (the step's dtype) up once.
        cost.host_bytes = optimizer_bytes + (element != wide ? parameters * (wide + element) : 0.0);
        cost.host_device_bytes += parameters * (wide + element);
        if (gradients == GradientOffload::stream) {
            // The checkpointed layers' gradients cross down every micro-batch instead of once, and each crossing
            // is added on the host (read the master's buffer and the staged copy, write the buffer).
            const double streamed = recomputed * static_cast<double>(layer_parameter_count(config)) * wide;
            cost.host_device_bytes += (steps - 1.0) * streamed;
            cost.host_bytes += steps * 3.0 * streamed + streamed; // and their buffers zeroed once a step
        }
        if (gathered_on_host) {
            // ZeRO-3 with the state on the host (the collectives priced apart): the checkpointed layers' copies are not
            // refreshed by the update; each segment's gathered masters are rounded on the host (bf16; fp32 copies go
            // up as they are) and cross up for every micro-batch's forward and again for its recompute, unhidden.
            const double elements = recomputed * static_cast<double>(layer_parameter_count(config));
            cost.host_device_bytes += steps * 2.0 * elements * element - elements * element;
            if (element != wide) cost.host_bytes += (steps * 2.0 - 1.0) * elements * (wide + element);
        }
        if (offload_parameters) {
            // The checkpointed layers' working copies are refreshed where they are parked (no upload in the
            // update; in fp32 a host copy instead), then cross up for every micro-batch's forward and again for
            // its recompute: nothing overlaps it yet.
            const double weights = recomputed * static_cast<double>(layer_parameter_count(config)) * element;
            cost.host_device_bytes += steps * 2.0 * weights - weights;
            if (element == wide) cost.host_bytes += 2.0 * weights;
            // Each micro-batch's first segment of the forward and of the backward is copied while the device
            // waits; every other one is prefetched during the segment before it, and hidden up to that
            // segment's compute (a forward; a recompute and backward, about 3.5 forwards). Segments taken as
            // equal: the average one's layers.
            if (checkpointed_segments > 1) {
                const double layers_per_segment = static_cast<double>(recomputed) / checkpointed_segments;
                const double copy = layers_per_segment * static_cast<double>(layer_parameter_count(config)) * element /
                                    ceilings.host_link_bytes_per_second;
                const double forward = layers_per_segment * (work.layer_gemm / ceilings.gemm_flops_per_second +
                                                             work.layer_attention / ceilings.attention_flops_per_second +
                                                             work.layer_bytes / ceilings.memory_bytes_per_second);
                cost.hidden_transfer_seconds = steps * (checkpointed_segments - 1.0) *
                                               (std::min(copy, forward) + std::min(copy, 3.5 * forward));
            }
        }
    }
    // layer_ops per block forward (about 15), twice as many in backward, and a dozen for embedding, head and loss.
    cost.ops += steps * (3.0 * work.layer_ops * layers + work.layer_ops * recomputed + 12.0) + 4.0 * (2.0 * layers + 4.0);

    cost.gemm_seconds = cost.gemm_flops / ceilings.gemm_flops_per_second;
    cost.attention_seconds = cost.attention_flops / ceilings.attention_flops_per_second;
    cost.memory_seconds = cost.streamed_bytes / ceilings.memory_bytes_per_second;
    cost.transfer_seconds = cost.host_device_bytes / ceilings.host_link_bytes_per_second - cost.hidden_transfer_seconds;
    cost.op_seconds = cost.ops * ceilings.seconds_per_op;
    cost.host_seconds = cost.host_bytes / ceilings.host_memory_bytes_per_second;
    cost.seconds = cost.gemm_seconds + cost.attention_seconds + cost.memory_seconds + cost.transfer_seconds +
                   cost.op_seconds + cost.host_seconds;
    return cost;
}

namespace {

// The parameter tensors of one decoder layer, and of the whole model: the calls a per-tensor collective makes.
int layer_tensor_count(const nn::ModelConfig& config) {
    return config.is_llama() ? 9 : 12; // Llama: 2 norms, q k v o, gate up down; GPT-2: 2 norms and 4 biased linears
}

} // namespace

void add_communication(StepCost& cost, const nn::ModelConfig& config, int accumulation_steps,
                       const checkpoint::CheckpointPolicy& policy, int zero_stage, int ranks, const Ceilings& ceilings,
                       int gathered_element_bytes, size_t table_elements, int table_count, bool batch_invariant) {
    if (ranks <= 1) return;
    const double parameters = static_cast<double>(parameter_count(config, config.vocab_size()));
    const double share = static_cast<double>(ranks - 1) / ranks; // of a payload through each rank's link
    constexpr double gradient_bytes = 4.0;                        // f32 gradients and masters
    double bytes = 0, calls = 0;
    if (batch_invariant) {
        // The f64 sums all-reduced whole (FixedPointGradients::finish); stage 1 then all-gathers the masters as always.
        constexpr double sum_bytes = 8.0;
        bytes = 2 * share * parameters * sum_bytes;
        calls = std::ceil(parameters * sum_bytes / static_cast<double>(distributed::Communicator::bucket_bytes));
        if (zero_stage == 1) {
            const distributed::ZeroPartition partition = distributed::ZeroPartition::of(
                static_cast<int64_t>(parameters), ranks, static_cast<size_t>(gradient_bytes));
            bytes += share * parameters * gradient_bytes;
            calls += static_cast<double>(partition.pieces);
        }
    } else if (zero_stage == 0) {
        bytes = 2 * share * parameters * gradient_bytes;
        calls = std::ceil(parameters * gradient_bytes / static_cast<double>(distributed::Communicator::bucket_bytes));
    } else {
        const distributed::ZeroPartition partition =
            distributed::ZeroPartition::of(static_cast<int64_t>(parameters), ranks, static_cast<size_t>(gradient_bytes));
        bytes = 2 * share * parameters * gradient_bytes; // the gradients reduced once and the masters gathered
        calls = 2.0 * static_cast<double>(partition.pieces);
        if (zero_stage >= 2) {
            // The gradients go by reduces onto their owners, a piece-long window at a time: a ring reduce moves its
            // whole payload through every link, where a reduce-scatter moves (N − 1)/N of it. The checkpointed layers'
            // once per micro-batch, the rest once; then the all-gather as stage 1.
            int checkpointed_layers = 0, segments = 0;
            for (const checkpoint::Segment& segment : checkpoint::plan_segments(config.layers(), policy))
                if (segment.checkpointed) checkpointed_layers += segment.layer_count, ++segments;
            const double layers = static_cast<double>(checkpointed_layers) * static_cast<double>(layer_parameter_count(config));
            bytes = (accumulation_steps * layers + (parameters - layers)) * gradient_bytes + share * parameters * gradient_bytes;
            calls = static_cast<double>(partition.pieces) +
                    accumulation_steps * (std::ceil(layers / static_cast<double>(partition.piece)) + segments) +
                    std::ceil((parameters - layers) / static_cast<double>(partition.piece)) + ranks;
            if (table_elements > 0) {
                // The token table's and an untied head's gradients (when sharded too) are reduced once per micro-batch,
                // a piece-long window at a time, instead of with the rest once a step.
                const double tables = table_count * static_cast<double>(table_elements);
                bytes += (accumulation_steps - 1) * tables * gradient_bytes;
                calls += (accumulation_steps - 1) * table_count *
                         (std::ceil(static_cast<double>(table_elements) / static_cast<double>(partition.piece)) + 1);
            }
            if (zero_stage == 3) {
                // No all-gather: the checkpointed layers' weights (bf16 copies rounded by their owners, or f32 masters)
                // are broadcast by their owners (a ring broadcast moves the whole payload through every link), one call
                // per tensor and owner of part of it, for each
                // segment's forward and again for its recompute: twice per micro-batch. The parameters kept whole are
                // broadcast the same way once, after the update. (A tensor split between two owners is one call more.)
                const double layer_tensors = static_cast<double>(layer_tensor_count(config));
                const double kept_tensors =
                    static_cast<double>(parameter_tensor_count(config)) - checkpointed_layers * layer_tensors;
                bytes += 2 * accumulation_steps * layers * gathered_element_bytes +
                         ((parameters - layers) - share * parameters) * gradient_bytes;
                calls += 2 * accumulation_steps * (checkpointed_layers * layer_tensors + ranks - 1) + kept_tensors +
                         ranks - 1 - static_cast<double>(partition.pieces);
                if (table_elements > 0) {
                    // The token table and an untied head (one tensor each) leave the step's broadcast; each micro-batch
                    // gathers the table for the lookup and the head (the table again when tied) for the loss.
                    const double table = static_cast<double>(table_elements);
                    bytes += accumulation_steps * 2.0 * table * gathered_element_bytes - table_count * table * gradient_bytes;
                    // One call per table, and one more per owner boundary inside it (the flat layout: the token table
                    // first, an untied head last).
                    const auto boundaries = [&](double from, double to) {
                        double count = 0;
                        for (int rank = 1; rank < ranks; ++rank) {
                            const double begin = static_cast<double>(partition.begin(rank));
                            if (begin > from && begin < to) ++count;
                        }
                        return count;
                    };
                    const double table_calls = 1 + boundaries(0, table);
                    const double head_calls = table_count == 2 ? 1 + boundaries(parameters - table, parameters) : table_calls;
                    calls += accumulation_steps * (table_calls + head_calls) - table_count;
                }
            }
        }
    }
    cost.communicated_bytes = bytes;
    cost.collectives = calls;
    cost.communication_seconds = bytes / ceilings.collective_bytes_per_second + calls * ceilings.seconds_per_collective;
    cost.seconds += cost.communication_seconds;
}

} // namespace engine::planner
