// checkpoint(): one outer node that saved only the segment's inputs and RNG position; backward recomputes
// the segment on a local tape. Also the segment plan for every_n_layers / segment_size.
#include "checkpoint/checkpoint.h"

#include <cmath>
#include <sstream>

#include "engine/elementwise.h"

namespace engine::checkpoint {
namespace {

thread_local size_t thread_recomputed_segments = 0;

struct SavedInput {
    Tensor data;          // on its device, or a pinned host copy when offloaded
    Device device = Device::cpu;
    bool requires_grad = false;
    GradTarget target;    // the original input, where its gradient goes
};

} // namespace

size_t recomputed_segment_count() { return thread_recomputed_segments; }
void reset_recomputed_segment_count() { thread_recomputed_segments = 0; }

std::string CheckpointPolicy::to_string() const {
    if (!enabled) return "none";
    std::ostringstream text;
    text << "every_n_layers " << every_n_layers << ", segment_size ";
    if (segment_size == 0) text << "sqrt";
    else text << segment_size;
    if (offload) text << ", offload";
    return text.str();
}

std::vector<Segment> plan_segments(int layer_count, const CheckpointPolicy& policy) {
    ENGINE_CHECK(policy.every_n_layers >= 1, "checkpoint: every_n_layers must be >= 1, got " << policy.every_n_layers);
    ENGINE_CHECK(policy.segment_size >= 0, "checkpoint: segment_size must be >= 1, or 0 for sqrt, got "
                                               << policy.segment_size);
    std::vector<Segment> segments;
    if (!policy.enabled) {
        for (int layer = 0; layer < layer_count; ++layer) segments.push_back({layer, 1, false});
        return segments;
    }
    const int size = policy.segment_size == 0 ? static_cast<int>(std::ceil(std::sqrt(static_cast<double>(layer_count))))
                                              : policy.segment_size;
    int index = 0;
    for (int first = 0; first < layer_count; first += size, ++index) {
        const int count = std::min(size, layer_count - first);
        const bool checkpointed = index % policy.every_n_layers == 0; // 1-based runs 1, 1+n, 1+2n, ...
        if (checkpointed) {
            segments.push_back({first, count, true});
        } else {
            for (int layer = first; layer < first + count; ++layer) segments.push_back({layer, 1, false});
        }
    }
    return segments;
}

std::vector<Tensor> checkpoint(const SegmentFunction& fn, const std::vector<Tensor>& inputs, bool offload) {
    if (!grad_enabled()) return fn(inputs);
    const RngState rng_at_start = rng_state();
    std::vector<Tensor> outputs;
    {
        // Nothing inside the segment is recorded, so its intermediates die as soon as they are consumed.
        NoGradGuard no_grad;
        outputs = fn(inputs);
    }
    std::vector<SavedInput> saved;
    for (const Tensor& input : inputs) {
        SavedInput entry;
        entry.device = input.device();
        entry.requires_grad = input.requires_grad();
        entry.target = GradTarget(input);
        // The host copy is ordered on the compute stream; once the caller drops `input`, the device copy
        // is freed and only the pinned host copy remains.
        entry.data = offload && input.dtype() != DType::i32 ? input.to(Device::cpu, MemoryCategory::pinned_host)
                                                            : input.detach();
        saved.push_back(std::move(entry));
    }

    Node node;
    node.op = "checkpoint";
    for (Tensor& output : outputs) {
        // Outputs are fresh tensors of this segment; they become differentiable through this one node.
        output.impl().requires_grad = true;
        output.impl().is_leaf = false;
        node.output_ids.push_back(output.id());
    }
    node.backward = [fn, saved = std::move(saved), rng_at_start,
                     output_ids = node.output_ids](BackwardContext& context) {
        std::vector<Tensor> recompute_inputs;
        for (const SavedInput& entry : saved) {
            Tensor input = entry.data.device() == entry.device && entry.data.category() != MemoryCategory::pinned_host
                               ? entry.data.detach()
                               : entry.data.to(entry.device, MemoryCategory::activations);
            // A non-leaf that requires grad: its gradient collects in the local context, not in a buffer.
            input.impl().requires_grad = entry.requires_grad;
            input.impl().is_leaf = false;
            recompute_inputs.push_back(input);
        }
        const RngState rng_now = rng_state();
        rng_state() = rng_at_start; // replay the same dropout masks
        Tape local_tape;
        std::vector<Tensor> recomputed;
        {
            TapeScope scope(local_tape);
            GradModeGuard grad_on(true);
            recomputed = fn(recompute_inputs);
        }
        rng_state() = rng_now; // recompute leaves the stream where the un-checkpointed run would
        ++thread_recomputed_segments;

        BackwardContext local;
        for (size_t index = 0; index < recomputed.size(); ++index) {
            Tensor gradient = context.output_grad(output_ids[index]);
            if (gradient.defined() && recomputed[index].requires_grad()) local.seed(recomputed[index].id(), gradient);
        }
        run_backward(local_tape, local);
        recomputed.clear();
        for (size_t index = 0; index < saved.size(); ++index) {
            if (!saved[index].requires_grad) continue;
            Tensor gradient = local.take(recompute_inputs[index].id());
            if (!gradient.defined()) continue;
            const GradTarget& target = saved[index].target;
            if (target.persistent_grad.defined()) accumulate_into(target.persistent_grad, gradient);
            else context.seed(target.id, std::move(gradient));
        }
    };
    current_tape().record(std::move(node));
    return outputs;
}

} // namespace engine::checkpoint
