// checkpoint(): one outer node that saved only the segment's inputs and RNG position; backward recomputes
// the segment on a local tape. Also the segment plan for every_n_layers / segment_size.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>

#include "engine/elementwise.h"
#include "engine/cuda/runtime.h"

namespace engine::checkpoint {
namespace {

thread_local size_t thread_recomputed_segments = 0;
thread_local size_t thread_prefetched_segments = 0;

struct SavedInput {
    Tensor data;          // on its device, or a pinned host copy when offloaded
    Device device = Device::cpu;
    bool requires_grad = false;
    GradTarget target;    // the original input, where its gradient goes
};

// What one checkpoint node keeps, shared with the prefetch order below.
struct SavedSegment {
    std::vector<SavedInput> inputs;
    std::vector<Tensor> prefetched; // per input: its device copy, brought back ahead of this backward
    bool prefetch_issued = false;
    const Tape* tape = nullptr;     // where the node was recorded: prefetch stays within one backward walk
    std::optional<cuda::StreamEvent> copies_done; // recorded on the copy stream after its offload or prefetch copies

    SavedSegment() = default;
    SavedSegment(const SavedSegment&) = delete;
    SavedSegment& operator=(const SavedSegment&) = delete;
    // A segment dropped with its copies in flight (its backward never ran): the buffers go back to pools
    // that reuse them in compute-stream order, so that stream must first wait for the copies. If that wait
    // cannot be queued, the pools' ordering would not cover the copies: the host waits for the copy stream
    // instead, before the members (the buffers) are destroyed. Never throws; a failed device reports at its
    // next checked call.
    ~SavedSegment() {
        try {
            wait_for_copies();
        } catch (...) {
            cuda::synchronize_copy_stream();
        }
    }
    void wait_for_copies() {
        if (copies_done) copies_done->wait(cuda::compute_stream());
        copies_done.reset();
    }
};

// A pinned host copy of `input`. On CUDA it goes device->host on the copy stream and the host does not wait:
// the segment's event orders every later reader of the copy, and the allocator fences the device block so
// that the caller may drop `input` at once. On the CPU, a plain copy.
Tensor offload_to_host(const Tensor& input, SavedSegment& segment) {
    if (input.device() == Device::cuda) {
        Tensor host = Tensor::empty(input.shape(), input.dtype(), Device::cpu, MemoryCategory::pinned_host);
        if (!segment.copies_done) segment.copies_done.emplace();
        cuda::copy_to_host_async(host.raw_data(), input.raw_data(), input.nbytes(), *segment.copies_done);
        return host;
    }
    return input.to(Device::cpu, MemoryCategory::pinned_host);
}

// This thread's offloaded segments with prefetch on, in the order their forwards ran. Backward meets them
// in reverse, so when one's backward starts, the live one recorded before it is the next to need its inputs.
thread_local std::vector<std::weak_ptr<SavedSegment>> prefetch_order;

void start_prefetch(SavedSegment& segment) {
    segment.prefetch_issued = true;
    segment.prefetched.resize(segment.inputs.size());
    for (size_t index = 0; index < segment.inputs.size(); ++index) {
        const SavedInput& entry = segment.inputs[index];
        if (!entry.data.defined() || entry.data.category() != MemoryCategory::pinned_host) continue;
        if (entry.device == Device::cuda) {
            Tensor destination = Tensor::empty(entry.data.shape(), entry.data.dtype(), Device::cuda,
                                               MemoryCategory::activations);
            if (!segment.copies_done) segment.copies_done.emplace();
            cuda::copy_to_device_async(destination.raw_data(), entry.data.raw_data(), entry.data.nbytes(),
                                       *segment.copies_done);
            segment.prefetched[index] = std::move(destination);
            continue;
        }
        segment.prefetched[index] = entry.data.to(entry.device, MemoryCategory::activations);
    }
    ++thread_prefetched_segments;
}

// Called as `current` starts its backward: takes it out of the order and prefetches the one before it.
void prefetch_previous(const SavedSegment* current) {
    std::erase_if(prefetch_order, [](const std::weak_ptr<SavedSegment>& entry) { return entry.expired(); });
    const auto position = std::find_if(prefetch_order.begin(), prefetch_order.end(),
                                       [current](const std::weak_ptr<SavedSegment>& entry) {
                                           return entry.lock().get() == current;
                                       });
    if (position == prefetch_order.end()) return;
    const auto index = position - prefetch_order.begin();
    prefetch_order.erase(position);
    if (index == 0) return;
    std::shared_ptr<SavedSegment> previous = prefetch_order[static_cast<size_t>(index - 1)].lock();
    if (previous && previous->tape == current->tape && !previous->prefetch_issued) start_prefetch(*previous);
}

} // namespace

size_t recomputed_segment_count() { return thread_recomputed_segments; }
void reset_recomputed_segment_count() { thread_recomputed_segments = 0; }
size_t prefetched_segment_count() { return thread_prefetched_segments; }
void reset_prefetched_segment_count() { thread_prefetched_segments = 0; }

std::string CheckpointPolicy::to_string() const {
    if (!enabled) return "none";
    std::ostringstream text;
    text << "every_n_layers " << every_n_layers << ", segment_size ";
    if (segment_size == 0) text << "sqrt";
    else text << segment_size;
    if (offload) text << ", offload";
    if (offload && prefetch) text << ", prefetch";
    return text.str();
}

std::optional<ConfigProblem> CheckpointPolicy::problem() const {
    if (every_n_layers < 1) return ConfigProblem{"every_n_layers", "must be >= 1, got " + std::to_string(every_n_layers)};
    if (segment_size < 0)
        return ConfigProblem{"segment_size", "must be >= 1, or 0 for sqrt(layers), got " + std::to_string(segment_size)};
    return std::nullopt;
}

std::vector<Segment> plan_segments(int layer_count, const CheckpointPolicy& policy) {
    if (const std::optional<ConfigProblem> found = policy.problem())
        ENGINE_FAIL("checkpoint: " << found->field << " " << found->reason);
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

std::vector<Tensor> checkpoint(const SegmentFunction& fn, const std::vector<Tensor>& inputs, bool offload,
                               bool prefetch, SegmentHooks hooks) {
    ENGINE_CHECK(static_cast<bool>(fn), "checkpoint: the segment function is empty");
    for (size_t index = 0; index < inputs.size(); ++index)
        ENGINE_CHECK(inputs[index].defined(), "checkpoint: input " << index << " is an undefined tensor");
    // The forward between its hooks; after_forward runs on the way out of a throwing forward or before_forward
    // too (and a throwing after_forward is then not allowed to hide the first error).
    const auto run_forward = [&fn, &inputs, &hooks] {
        std::vector<Tensor> outputs;
        try {
            if (hooks.before_forward) hooks.before_forward();
            outputs = fn(inputs);
        } catch (...) {
            try {
                if (hooks.after_forward) hooks.after_forward();
            } catch (...) {
            }
            throw;
        }
        if (hooks.after_forward) hooks.after_forward();
        return outputs;
    };
    if (!grad_enabled()) return run_forward();
    const RngState rng_at_start = rng_state();
    std::vector<Tensor> outputs;
    {
        // Nothing inside the segment is recorded, so its intermediates die as soon as they are consumed.
        NoGradGuard no_grad;
        outputs = run_forward();
    }
    auto segment = std::make_shared<SavedSegment>();
    bool any_offloaded = false;
    for (const Tensor& input : inputs) {
        SavedInput entry;
        entry.device = input.device();
        entry.requires_grad = input.requires_grad();
        entry.target = GradTarget(input);
        // Once the caller drops `input`, the device copy is freed and only the pinned host copy remains.
        // Integer inputs (token ids) are tiny and stay.
        entry.data = offload && input.dtype() != DType::i32 ? offload_to_host(input, *segment) : input.detach();
        any_offloaded = any_offloaded || entry.data.category() == MemoryCategory::pinned_host;
        segment->inputs.push_back(std::move(entry));
    }
    const bool queued = prefetch && any_offloaded;
    if (queued) {
        segment->tape = &current_tape();
        std::erase_if(prefetch_order, [](const std::weak_ptr<SavedSegment>& entry) { return entry.expired(); });
        prefetch_order.push_back(segment);
    }

    std::vector<uint64_t> output_ids;
    std::vector<Tensor*> output_pointers;
    for (Tensor& output : outputs) {
        ENGINE_CHECK(output.defined(), "checkpoint: the segment function returned an undefined tensor");
        // A fresh identity over the same storage: an output that is one of the inputs (an identity segment)
        // must not turn the caller's tensor into a non-leaf or share its gradient slot.
        output = output.detach();
        output_ids.push_back(output.id());
        output_pointers.push_back(&output);
    }
    std::vector<const Tensor*> input_pointers;
    for (const Tensor& input : inputs) input_pointers.push_back(&input);
    // Backward releases the saved inputs as soon as the recompute holds what it needs.
    auto backward_function = [fn, segment, queued, rng_at_start, output_ids,
                              hooks = std::move(hooks)](BackwardContext& context) {
        std::vector<SavedInput>& saved = segment->inputs;
        // Prefetched copies are used only once the compute stream is ordered after them; that also makes
        // releasing their pinned sources below safe.
        segment->wait_for_copies();
        std::vector<Tensor> recompute_inputs;
        std::vector<uint64_t> recompute_ids;
        for (size_t index = 0; index < saved.size(); ++index) {
            SavedInput& entry = saved[index];
            Tensor input;
            if (index < segment->prefetched.size() && segment->prefetched[index].defined()) {
                input = std::move(segment->prefetched[index]);
            } else {
                // Host -> device before the recompute; the pinned buffer goes back to its pool right away.
                input = entry.data.category() == MemoryCategory::pinned_host
                            ? entry.data.to(entry.device, MemoryCategory::activations)
                            : entry.data.detach();
            }
            entry.data = Tensor();
            // A non-leaf that requires grad: its gradient collects in the local context, not in a buffer.
            input = as_non_leaf(input, entry.requires_grad);
            recompute_ids.push_back(input.id());
            recompute_inputs.push_back(std::move(input));
        }
        // After this segment's own copies, so those go first; the next one overlaps the recompute below.
        if (queued) prefetch_previous(segment.get());
        if (hooks.before_recompute) hooks.before_recompute();
        Tape local_tape;
        std::vector<Tensor> recomputed;
        {
            RngStateRestore restore_after; // recompute leaves the stream where the un-checkpointed run would
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
        if (hooks.after_backward) hooks.after_backward();
        for (size_t index = 0; index < saved.size(); ++index) {
            if (!saved[index].requires_grad) continue;
            Tensor gradient = local.take(recompute_ids[index]);
            if (!gradient.defined()) continue;
            const GradTarget& target = saved[index].target;
            if (target.persistent_grad.defined()) accumulate_into(target.persistent_grad, gradient);
            else context.seed(target.id, std::move(gradient));
        }
    };
    // Recorded even when no input requires grad: the segment's parameters inside fn do.
    record_node("checkpoint", input_pointers, output_pointers, std::move(backward_function), RecordWhen::grad_enabled);
    return outputs;
}

} // namespace engine::checkpoint
