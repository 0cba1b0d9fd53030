// The tape: ops record one node each while grad mode is on; backward walks it in reverse, routes gradients
// by tensor id, accumulates parameter gradients (+=) into persistent buffers, and frees each node's saved
// tensors as soon as its backward has run.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/tensor.h"

namespace engine {

// ---- grad mode ----
bool grad_enabled();
class NoGradGuard {
public:
    NoGradGuard();
    ~NoGradGuard();
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};

// Sets grad mode for a scope (checkpoint recompute turns it back on inside backward).
class GradModeGuard {
public:
    explicit GradModeGuard(bool enabled);
    ~GradModeGuard();
    GradModeGuard(const GradModeGuard&) = delete;
    GradModeGuard& operator=(const GradModeGuard&) = delete;

private:
    bool previous_;
};

// What a backward function needs to know about an input, without keeping the input's data alive.
struct GradTarget {
    uint64_t id = 0;
    bool requires_grad = false;
    Shape shape;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    Tensor persistent_grad; // a leaf's gradient buffer, which backward accumulates into

    GradTarget() = default;
    explicit GradTarget(const Tensor& tensor);
};

class BackwardContext;
using BackwardFunction = std::function<void(BackwardContext&)>;

struct Node {
    std::string op;
    std::vector<uint64_t> output_ids;
    BackwardFunction backward; // captures exactly the tensors it saved; destroyed right after it runs
    // What release_unreachable needs, filled by record_node: the inputs' ids, and whether each output still
    // has a live handle. A node recorded without them (inputs_known false) keeps every node before it.
    std::vector<uint64_t> input_ids;
    std::vector<std::weak_ptr<const void>> output_liveness;
    bool inputs_known = false;
};

// The recorded graph. A forward run in grad mode whose result is dropped without backward leaves nodes no
// gradient can reach; rather than hold their saved tensors until the next backward, the tape sweeps them out
// whenever it has doubled since the last sweep (at least 64 nodes), so repeated forwards without backward
// hold at most about twice the live graph. release_unreachable() sweeps now. docs/ARCHITECTURE.md, "The tape".
class Tape {
public:
    void record(Node node);
    size_t size() const { return nodes_.size(); }
    bool empty() const { return nodes_.empty(); }
    std::vector<Node>& nodes() { return nodes_; }
    void clear() {
        nodes_.clear();
        sweep_at_ = minimum_sweep_size;
    }
    // Frees every node none of whose outputs is alive or read by a node kept. Returns how many it freed.
    size_t release_unreachable();

private:
    friend void run_backward(Tape& tape, BackwardContext& context);
    // run_backward sets it: the nodes not yet walked have dead outputs whose gradients live only in the
    // walk's context, so a record during the walk (a backward that turned grad mode on without a TapeScope)
    // must not sweep them.
    bool walking_ = false;
    static constexpr size_t minimum_sweep_size = 64;
    std::vector<Node> nodes_;
    size_t sweep_at_ = minimum_sweep_size;
};

// The tape ops record on: the global tape, or the innermost TapeScope (checkpoint recompute uses one).
Tape& current_tape();
class TapeScope {
public:
    explicit TapeScope(Tape& tape);
    ~TapeScope();
    TapeScope(const TapeScope&) = delete;
    TapeScope& operator=(const TapeScope&) = delete;

private:
    Tape* previous_;
};

// Gradients flowing during one backward walk, keyed by tensor id.
class BackwardContext {
public:
    // The gradient arriving at an op output; undefined if nothing downstream used it.
    Tensor output_grad(uint64_t output_id) const;
    Tensor output_grad(const Tensor& output) const { return output_grad(output.id()); }
    // The buffer to accumulate an input's gradient into (+=), in the input's dtype: the persistent buffer of a
    // leaf, else a zeroed workspace tensor created on first use. Undefined if the input does not require grad.
    // A bf16 leaf's persistent buffer is f32 (mixed precision): it gets a bf16 workspace that finish_node
    // adds into the f32 buffer once the node's backward has run.
    Tensor input_grad(const GradTarget& input);
    // The same in compute_dtype(input dtype), for the gradients a kernel accumulates in full precision (the
    // parameters' of linear, layernorm, embedding): a bf16 leaf's f32 persistent buffer itself, so weight
    // gradients of every micro-batch add up in f32 with no rounding to bf16 between them. For an input that
    // is not such a leaf, an f32 workspace that finish_node rounds once into input_grad(input). For f32 and
    // f64 inputs it is input_grad(input).
    Tensor parameter_grad(const GradTarget& input);
    // input_grad for an op that can write the gradient instead of adding it (a β = 0 GEMM, a kernel's write
    // form): when the input has no gradient yet (no persistent buffer, no earlier consumer's), an uninitialised
    // buffer that the walk owns from now on as input_grad's, with `fresh` set: the caller must write every element
    // of it. Otherwise input_grad(input), fresh unset: the caller adds into it. Writing first saves the zero fill
    // and the read of zeros that adding into a fresh buffer costs (docs/ARCHITECTURE.md, "The tape").
    struct WritableGradient {
        Tensor buffer;
        bool fresh = false;
    };
    WritableGradient input_grad_to_write(const GradTarget& input);
    // Adds the buffers handed out above in another dtype into their destinations; run_backward calls it after
    // every node.
    void finish_node();
    // Hands `gradient` over as the input's gradient when none exists yet: for an op whose backward result
    // already sits in a buffer it owns (cross_entropy_in_place writes it over the logits), so no zeroed
    // buffer and no += pass are needed. The buffer then belongs to the walk (later consumers' += land in it),
    // so the op must not touch it again. Returns false, adopting nothing, when the input already has a
    // gradient (a leaf's persistent buffer, or one another consumer created): then the caller adds into
    // input_grad(input), the += every other backward does. An input that does not require grad needs
    // nothing: true.
    bool adopt_input_grad(const GradTarget& input, const Tensor& gradient);
    // For kernels that write every gradient they compute (layernorm, rms_norm): `gradient` when defined, else a
    // zeroed workspace tensor of the target's shape in `dtype`, which the kernel fills and the walk drops.
    static Tensor gradient_or_scratch(const Tensor& gradient, const GradTarget& target, DType dtype);

    void seed(uint64_t id, Tensor gradient);                   // adds to what is there
    Tensor take(uint64_t id);                                   // removes and returns
    void erase(uint64_t id) { grads_.erase(id); }
    bool has(uint64_t id) const { return grads_.count(id) != 0; }

private:
    std::unordered_map<uint64_t, Tensor> grads_;
    std::vector<std::pair<Tensor, Tensor>> pending_conversions_; // (destination, source) for finish_node
};

// Walks `tape` in reverse with the gradients already seeded in `context`, then leaves the tape empty.
void run_backward(Tape& tape, BackwardContext& context);

struct BackwardOptions {
    double seed_scale = 1.0; // d(loss) seed: backward of seed_scale * loss
};
// Backward from a scalar loss over the current tape. Parameter gradients accumulate (+=).
void backward(const Tensor& loss, const BackwardOptions& options = {});

// When record_node records: when an input requires grad (every op), or whenever grad mode is on (checkpoint:
// its backward reaches the segment's parameters, which are not among its inputs).
enum class RecordWhen { an_input_requires_grad, grad_enabled };
// Records a node on the current tape if grad mode is on and (by default) any of `inputs` requires grad; marks
// `outputs` as non-leaves requiring grad in that case. Returns whether it recorded.
bool record_node(const std::string& op, const std::vector<const Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, BackwardFunction backward,
                 RecordWhen when = RecordWhen::an_input_requires_grad);
// A new identity over `tensor`'s storage that is a non-leaf (requiring grad as asked): a graph input whose
// gradient collects in a BackwardContext rather than in a persistent buffer, for code that replays part of a
// graph on a local tape (checkpoint recompute).
Tensor as_non_leaf(const Tensor& tensor, bool requires_grad);

// An identity over `input` (its storage under a new id) whose node, when the backward walk reaches it, runs `action`
// and then passes the gradient through: for code that must act at that point of the backward, after every node
// recorded later and before every one recorded earlier (ZeRO-3 gives the token table its gradient storage just
// before the lookup's backward, and reduces the LM head's gradient just after the classifier's). Under no-grad, or
// for an input that requires no grad, nothing is recorded, `input` itself comes back and the action never runs.
Tensor on_backward(const Tensor& input, std::function<void()> action);

// Zeroes gradient buffers in place (a memset, never a free); released ones (release_storage) are passed over.
void zero_grad(const std::vector<Tensor>& parameters);

} // namespace engine
