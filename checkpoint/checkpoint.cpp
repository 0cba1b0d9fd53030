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

namespace {

// Puts the RNG stream back where it was when the scope began, also when the recompute throws.
class RngRestore {
public:
    RngRestore() : saved_(rng_state()) {}
    ~RngRestore() { rng_state() = saved_; }
    RngRestore(const RngRestore&) = delete;
    RngRestore& operator=(const RngRestore&) = delete;

private:
    RngState saved_;
};

} // namespace

std::vector<Tensor> checkpoint(const SegmentFunction& fn, const std::vector<Tensor>& inputs, bool offload) {
    ENGINE_CHECK(static_cast<bool>(fn), "checkpoint: the segment function is empty");
    for (size_t index = 0; index < inputs.size(); ++index)
        ENGINE_CHECK(inputs[index].defined(), "checkpoint: input " << index << " is an undefined tensor");
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
        // is freed and only the pinned host copy remains. Integer inputs (token ids) are tiny and stay.
        entry.data = offload && input.dtype() != DType::i32 ? input.to(Device::cpu, MemoryCategory::pinned_host)
                                                            : input.detach();
        saved.push_back(std::move(entry));
    }

    Node node;
    node.op = "checkpoint";
    for (Tensor& output : outputs) {
        ENGINE_CHECK(output.defined(), "checkpoint: the segment function returned an undefined tensor");
        // A fresh identity over the same storage: an output that is one of the inputs (an identity segment)
        // must not turn the caller's tensor into a non-leaf or share its gradient slot.
        output = output.detach();
        output.impl().requires_grad = true;
        output.impl().is_leaf = false;
        node.output_ids.push_back(output.id());
    }
    // mutable: backward releases the saved inputs as soon as the recompute holds what it needs.
    node.backward = [fn, saved = std::move(saved), rng_at_start,
                     output_ids = node.output_ids](BackwardContext& context) mutable {
        std::vector<Tensor> recompute_inputs;
        std::vector<uint64_t> recompute_ids;
        for (SavedInput& entry : saved) {
            // Host -> device before the recompute; the pinned buffer goes back to its pool right away.
            Tensor input = entry.data.category() == MemoryCategory::pinned_host
                               ? entry.data.to(entry.device, MemoryCategory::activations)
                               : entry.data.detach();
            entry.data = Tensor();
            // A non-leaf that requires grad: its gradient collects in the local context, not in a buffer.
            input.impl().requires_grad = entry.requires_grad;
            input.impl().is_leaf = false;
            recompute_ids.push_back(input.id());
            recompute_inputs.push_back(std::move(input));
        }
        Tape local_tape;
        std::vector<Tensor> recomputed;
        {
            RngRestore restore_after; // recompute leaves the stream where the un-checkpointed run would
            rng_state() = rng_at_start; // replay the same dropout masks
            TapeScope scope(local_tape);
            GradModeGuard grad_on(true);
            recomputed = fn(recompute_inputs);
        }
        // From here on the local tape's saved tensors keep alive exactly what the segment's backward needs.
        recompute_inputs.clear();
        ENGINE_CHECK(recomputed.size() == output_ids.size(),
                     "checkpoint: the recompute returned " << recomputed.size() << " tensors, the forward "
                                                           << output_ids.size());
        ++thread_recomputed_segments;

        BackwardContext local;
        for (size_t index = 0; index < recomputed.size(); ++index) {
            Tensor gradient = context.output_grad(output_ids[index]);
            if (gradient.defined() && recomputed[index].requires_grad()) local.seed(recomputed[index].id(), gradient);
        }
        recomputed.clear(); // no backward reads a segment output, so it need not outlive the seeding
        run_backward(local_tape, local);
        for (size_t index = 0; index < saved.size(); ++index) {
            if (!saved[index].requires_grad) continue;
            Tensor gradient = local.take(recompute_ids[index]);
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
