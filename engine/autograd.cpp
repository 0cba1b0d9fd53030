// The tape walk: reverse order, gradients routed by tensor id, saved tensors freed node by node.
#include "engine/autograd.h"

#include <algorithm>
#include <unordered_set>

#include "engine/ops.h"
#include "engine/elementwise.h"
#include "engine/profiling.h"

namespace engine {
namespace {
thread_local bool thread_grad_enabled = true;
thread_local Tape thread_global_tape;
thread_local Tape* thread_current_tape = nullptr;
} // namespace

bool grad_enabled() { return thread_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(thread_grad_enabled) { thread_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { thread_grad_enabled = previous_; }
GradModeGuard::GradModeGuard(bool enabled) : previous_(thread_grad_enabled) { thread_grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { thread_grad_enabled = previous_; }

void Tape::record(Node node) {
    nodes_.push_back(std::move(node));
    if (walking_ || nodes_.size() < sweep_at_) return;
    release_unreachable();
    sweep_at_ = std::max(minimum_sweep_size, 2 * nodes_.size());
}

size_t Tape::release_unreachable() {
    // Newest first: a node is kept when one of its outputs has a live handle or is an input of a node kept
    // after it; then its own inputs are needed. Only nodes kept can bring a gradient to an earlier one.
    std::unordered_set<uint64_t> needed;
    std::vector<bool> keep(nodes_.size(), true);
    for (size_t index = nodes_.size(); index-- > 0;) {
        const Node& node = nodes_[index];
        if (!node.inputs_known) break; // what it reads is unknown: keep it and everything before it
        bool kept = false;
        for (size_t k = 0; k < node.output_ids.size() && !kept; ++k)
            kept = !node.output_liveness[k].expired() || needed.count(node.output_ids[k]) != 0;
        keep[index] = kept;
        if (kept) needed.insert(node.input_ids.begin(), node.input_ids.end());
        // Freed now, not after the pass: its saved tensors may be the only handles of earlier nodes' outputs.
        else nodes_[index].backward = nullptr;
    }
    const size_t before = nodes_.size();
    size_t write = 0;
    for (size_t index = 0; index < nodes_.size(); ++index)
        if (keep[index]) {
            if (write != index) nodes_[write] = std::move(nodes_[index]);
            ++write;
        }
    nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(write), nodes_.end()); // frees their saved tensors
    return before - write;
}

Tape& current_tape() { return thread_current_tape ? *thread_current_tape : thread_global_tape; }
TapeScope::TapeScope(Tape& tape) : previous_(thread_current_tape) { thread_current_tape = &tape; }
TapeScope::~TapeScope() { thread_current_tape = previous_; }

GradTarget::GradTarget(const Tensor& tensor)
    : id(tensor.id()), requires_grad(tensor.requires_grad()), shape(tensor.shape()), dtype(tensor.dtype()),
      device(tensor.device()) {
    if (tensor.is_leaf() && tensor.requires_grad()) {
        persistent_grad = tensor.grad();
        // A gradient with nowhere to go would be dropped in silence: say which leaf.
        // (Ops describe their inputs under no-grad too, where nothing is recorded and nothing can be dropped.)
        ENGINE_CHECK(persistent_grad.defined() || !grad_enabled(),
                     "autograd: leaf " << tensor.describe() << " requires grad but has no gradient buffer now "
                                       << "(streamed gradients and ZeRO-2 give one only around its segment's backward)");
    }
}

Tensor BackwardContext::output_grad(uint64_t output_id) const {
    auto found = grads_.find(output_id);
    return found == grads_.end() ? Tensor() : found->second;
}

Tensor BackwardContext::input_grad(const GradTarget& input) {
    if (!input.requires_grad) return Tensor();
    if (input.persistent_grad.defined()) {
        if (input.persistent_grad.dtype() == input.dtype) return input.persistent_grad;
        Tensor buffer = Tensor::zeros(input.shape, input.dtype, input.device, MemoryCategory::workspace);
        pending_conversions_.emplace_back(input.persistent_grad, buffer);
        return buffer;
    }
    auto found = grads_.find(input.id);
    if (found != grads_.end()) return found->second;
    Tensor buffer = Tensor::zeros(input.shape, input.dtype, input.device, MemoryCategory::workspace);
    grads_.emplace(input.id, buffer);
    return buffer;
}

BackwardContext::WritableGradient BackwardContext::input_grad_to_write(const GradTarget& input) {
    if (!input.requires_grad || input.persistent_grad.defined() || grads_.count(input.id) != 0)
        return {input_grad(input), false};
    Tensor buffer = Tensor::empty(input.shape, input.dtype, input.device, MemoryCategory::workspace);
    grads_.emplace(input.id, buffer);
    return {buffer, true};
}

Tensor BackwardContext::parameter_grad(const GradTarget& input) {
    if (!input.requires_grad) return Tensor();
    const DType wide = compute_dtype(input.dtype);
    if (input.persistent_grad.defined() && input.persistent_grad.dtype() == wide) return input.persistent_grad;
    if (wide == input.dtype) return input_grad(input);
    Tensor destination = input_grad(input);
    Tensor buffer = Tensor::zeros(input.shape, wide, input.device, MemoryCategory::workspace);
    pending_conversions_.emplace_back(destination, buffer);
    return buffer;
}

void BackwardContext::finish_node() {
    // Taken first: a failed addition must not leave them for the next node.
    std::vector<std::pair<Tensor, Tensor>> conversions = std::move(pending_conversions_);
    pending_conversions_.clear();
    for (const auto& [destination, source] : conversions) accumulate_into(destination, source);
}

bool BackwardContext::adopt_input_grad(const GradTarget& input, const Tensor& gradient) {
    if (!input.requires_grad) return true;
    ENGINE_CHECK(gradient.shape() == input.shape && gradient.dtype() == input.dtype && gradient.device() == input.device,
                 "backward: gradient " << gradient.describe() << " handed over for an input of shape "
                                       << shape_string(input.shape) << " " << dtype_name(input.dtype) << " "
                                       << device_name(input.device));
    if (input.persistent_grad.defined() || grads_.count(input.id) != 0) return false;
    grads_.emplace(input.id, gradient);
    return true;
}

Tensor BackwardContext::gradient_or_scratch(const Tensor& gradient, const GradTarget& target, DType dtype) {
    return gradient.defined() ? gradient : Tensor::zeros(target.shape, dtype, target.device, MemoryCategory::workspace);
}

void BackwardContext::seed(uint64_t id, Tensor gradient) {
    auto found = grads_.find(id);
    if (found == grads_.end()) {
        grads_.emplace(id, std::move(gradient));
        return;
    }
    accumulate_into(found->second, gradient);
}

Tensor BackwardContext::take(uint64_t id) {
    auto found = grads_.find(id);
    if (found == grads_.end()) return Tensor();
    Tensor gradient = std::move(found->second);
    grads_.erase(found);
    return gradient;
}

void run_backward(Tape& tape, BackwardContext& context) {
    NoGradGuard no_grad; // backward computations are never recorded
    // The op profiler files every kernel of the walk (checkpoint recomputation included) under backward.
    const profiling::PhaseScope phase(profiling::Phase::backward);
    auto& nodes = tape.nodes();
    tape.walking_ = true;
    try {
        while (!nodes.empty()) {
            Node node = std::move(nodes.back());
            nodes.pop_back();
            bool any_output_grad = false;
            for (uint64_t id : node.output_ids) any_output_grad = any_output_grad || context.has(id);
            if (any_output_grad) {
                node.backward(context);
                context.finish_node();
            }
            // Outputs are consumed by nodes later on the tape, which have all run: their gradients are done.
            for (uint64_t id : node.output_ids) context.erase(id);
            node.backward = nullptr; // frees the saved tensors now, not at the end of the walk
        }
    } catch (...) {
        // A node that failed (out of memory, say) must not leave the rest of the graph and its saved tensors
        // for the next walk. Parameter gradients may hold part of this backward: zero_grad before retrying.
        tape.walking_ = false;
        tape.clear();
        throw;
    }
    tape.walking_ = false;
    tape.clear(); // empty already; also puts the sweep point back, so a large step does not delay later sweeps
}

void backward(const Tensor& loss, const BackwardOptions& options) {
    ENGINE_CHECK(loss.numel() == 1, "backward: the loss must be a single value, got " << loss.describe());
    ENGINE_CHECK(loss.dtype() != DType::i32, "backward: integer loss " << loss.describe());
    Tape& tape = current_tape();
    ENGINE_CHECK(loss.requires_grad(),
                 "backward: the loss " << loss.describe() << " does not require grad (no recorded op led to it)");
    // backward consumes the whole tape, the branches of other losses included: a loss whose node is gone
    // would otherwise seed a gradient that reaches nothing, silently.
    const auto& nodes = tape.nodes();
    const bool recorded = std::any_of(nodes.begin(), nodes.end(), [&](const Node& node) {
        return std::find(node.output_ids.begin(), node.output_ids.end(), loss.id()) != node.output_ids.end();
    });
    ENGINE_CHECK(recorded, "backward: the loss " << loss.describe()
                               << " is not on the current tape: it was already backpropagated (backward consumes "
                                  "the whole tape, other losses' branches included) or the tape was cleared; add the "
                                  "losses and call backward once");
    BackwardContext context;
    context.seed(loss.id(), Tensor::full(loss.shape(), options.seed_scale, loss.dtype(), loss.device(),
                                         MemoryCategory::workspace));
    run_backward(tape, context);
}

bool record_node(const std::string& op, const std::vector<const Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, BackwardFunction backward_function, RecordWhen when) {
    if (!grad_enabled()) return false;
    bool any_requires_grad = when == RecordWhen::grad_enabled;
    for (const Tensor* input : inputs)
        any_requires_grad = any_requires_grad || (input->defined() && input->requires_grad());
    if (!any_requires_grad) return false;
    Node node;
    node.op = op;
    for (const Tensor* input : inputs)
        if (input->defined() && input->requires_grad()) node.input_ids.push_back(input->id());
    for (Tensor* output : outputs) {
        detail::impl_of(*output).requires_grad = true;
        detail::impl_of(*output).is_leaf = false;
        node.output_ids.push_back(output->id());
        node.output_liveness.push_back(detail::impl_of(*output).liveness);
    }
    node.inputs_known = true;
    node.backward = std::move(backward_function);
    current_tape().record(std::move(node));
    return true;
}

Tensor as_non_leaf(const Tensor& tensor, bool requires_grad) {
    Tensor view = tensor.detach();
    detail::impl_of(view).requires_grad = requires_grad;
    detail::impl_of(view).is_leaf = false;
    return view;
}

Tensor on_backward(const Tensor& input, std::function<void()> action) {
    if (!grad_enabled() || !input.requires_grad()) return input;
    Tensor out = input.detach(); // the same storage under a new id, so that the gradient reaches the node below
    GradTarget input_target(input);
    record_node("on_backward", {&input}, {&out},
                [input_target, output_id = out.id(), action = std::move(action)](BackwardContext& context) {
                    action();
                    const Tensor dout = context.output_grad(output_id);
                    if (!dout.defined() || context.adopt_input_grad(input_target, dout)) return;
                    accumulate_into(context.input_grad(input_target), dout);
                });
    return out;
}

void zero_grad(const std::vector<Tensor>& parameters) {
    for (const Tensor& parameter : parameters) {
        Tensor gradient = parameter.grad();
        // A released buffer (ZeRO-3's token table and head between their uses) holds nothing to zero.
        if (gradient.defined() && !gradient.storage_released()) gradient.fill_zero();
    }
}

} // namespace engine
