// The replay under planner/adapter_step.cpp: tensors with a size and no data whose handles free their bytes as
// engine::Tensor's do, a tape and a backward walk that keep and release what engine/autograd.cpp's do, and the ops a
// GPT-2 or Llama step runs, each allocating and saving what its engine twin does (engine/ops/*.cpp). Planner-internal.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "planner/adapter_step.h"

namespace engine::planner::replay {

enum class Account { activations, workspace, pinned_host };

// The allocator's accounting of the replay: current bytes per account and the high-water marks with their moments.
class Ledger {
public:
    void allocate(Account account, size_t bytes) {
        if (events_ != nullptr) events_->push_back({static_cast<int>(account), static_cast<int64_t>(bytes)});
        current_[static_cast<int>(account)] += bytes;
        const size_t activations = current(Account::activations), workspace = current(Account::workspace);
        if (activations > walk_.activations) walk_.activations = activations, compose(walk_.activations_moment);
        walk_.workspace = std::max(walk_.workspace, workspace);
        walk_.pinned_host = std::max(walk_.pinned_host, current(Account::pinned_host));
        note_joint();
    }
    // Bytes of another category held for a while (ZeRO-3: a segment's gathered weights during its forward): in the
    // joint peak, in no account's own, and no event (the allocator's timeline compared with the events has them apart).
    void hold(size_t bytes) {
        held_ += bytes;
        note_joint();
    }
    void let_go(size_t bytes) { held_ -= bytes; }
    void release(Account account, size_t bytes) {
        if (events_ != nullptr) events_->push_back({static_cast<int>(account), -static_cast<int64_t>(bytes)});
        current_[static_cast<int>(account)] -= bytes;
    }
    void record_events(std::vector<AdapterStepEvent>* events) { events_ = events; }
    size_t current(Account account) const { return current_[static_cast<int>(account)]; }
    // The moment the allocations that follow belong to, in three parts ("backward of ", "block 3", " (recomputed)"):
    // kept in buffers that are reused, and joined only when a mark is reached (a replay names every node).
    void at(const std::string& prefix, const std::string& where, const char* suffix = "") {
        prefix_.assign(prefix);
        where_.assign(where);
        suffix_.assign(suffix);
    }
    const AdapterStepWalk& walk() const { return walk_; }

private:
    void compose(std::string& moment) const { moment.assign(prefix_).append(where_).append(suffix_); }
    void note_joint() {
        const size_t joint = current(Account::activations) + current(Account::workspace) + held_;
        if (joint > walk_.joint) walk_.joint = joint, compose(walk_.joint_moment);
        walk_.unified_joint = std::max(walk_.unified_joint, joint + current(Account::pinned_host));
    }
    size_t current_[3] = {0, 0, 0};
    size_t held_ = 0;
    std::string prefix_, where_, suffix_;
    AdapterStepWalk walk_;
    std::vector<AdapterStepEvent>* events_ = nullptr;
};

struct Storage {
    Ledger* ledger;
    Account account;
    size_t bytes;
    Storage(Ledger* ledger, Account account, size_t bytes) : ledger(ledger), account(account), bytes(bytes) {
        ledger->allocate(account, bytes);
    }
    ~Storage() { ledger->release(account, bytes); }
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
};

// A tensor with a size and no data: handles share the storage as engine::Tensor's do, and the last one frees it.
// A parameter has no storage here (the model state is counted apart); a trainable one has a persistent gradient.
struct Sym {
    std::shared_ptr<Storage> storage;
    uint64_t id = 0;
    size_t bytes = 0;
    bool requires_grad = false;
    bool parameter = false;
    bool defined() const { return storage != nullptr || parameter; }
};

// engine::GradTarget: what backward needs of an input.
struct Target {
    uint64_t id = 0;
    size_t bytes = 0;
    bool requires_grad = false;
    bool parameter = false;
    explicit Target(const Sym& tensor)
        : id(tensor.id), bytes(tensor.bytes), requires_grad(tensor.requires_grad), parameter(tensor.parameter) {}
};

class Replay;

// engine::BackwardContext: gradients by tensor id, made zeroed in the workspace on first use. Few are in flight at
// once (a node's inputs and outputs), so a short list searched in order.
class Context {
public:
    explicit Context(Replay& replay) : replay_(replay) {}
    Sym output_grad(uint64_t id) const {
        const auto found = find(id);
        return found == grads_.end() ? Sym() : found->second;
    }
    bool has(uint64_t id) const { return find(id) != grads_.end(); }
    // A trainable parameter's gradient is its persistent buffer (the master's f32 one under bf16): no bytes.
    Sym input_grad(const Target& target);
    Sym parameter_grad(const Target& target) { return input_grad(target); }
    Sym gradient_or_scratch(const Sym& gradient, const Target& target, size_t bytes);
    bool adopt_input_grad(const Target& target, const Sym& gradient) {
        if (!target.requires_grad) return true;
        if (target.parameter || has(target.id)) return false;
        grads_.emplace_back(target.id, gradient);
        return true;
    }
    void seed(uint64_t id, Sym gradient) {
        if (!has(id)) grads_.emplace_back(id, std::move(gradient)); // else added into it: no bytes
    }
    Sym take(uint64_t id) {
        const auto found = find(id);
        if (found == grads_.end()) return Sym();
        Sym gradient = std::move(found->second);
        grads_.erase(found);
        return gradient;
    }
    void erase(uint64_t id) {
        if (const auto found = find(id); found != grads_.end()) grads_.erase(found);
    }

private:
    using Entries = std::vector<std::pair<uint64_t, Sym>>;
    Entries::iterator find(uint64_t id) {
        return std::find_if(grads_.begin(), grads_.end(), [id](const auto& entry) { return entry.first == id; });
    }
    Entries::const_iterator find(uint64_t id) const {
        return std::find_if(grads_.begin(), grads_.end(), [id](const auto& entry) { return entry.first == id; });
    }
    Replay& replay_;
    Entries grads_;
};

struct Node {
    uint64_t output = 0;                    // every op here has one output
    std::function<void(Context&)> backward; // owns the saved tensors
    std::string where;
};

using Tape = std::vector<Node>;

class Replay {
public:
    Replay(DType dtype) : element(dtype_size(dtype)), wide(dtype_size(compute_dtype(dtype))) {}

    const size_t element; // an activation's element: the step's dtype
    const size_t wide;    // a statistic's: compute_dtype

    Ledger ledger;
    bool grad_enabled = true;
    Tape global_tape;
    Tape* tape = &global_tape;
    std::string phase = "forward"; // of the moments' names: forward, no-grad forward, recompute
    const std::string backward_prefix = "backward of ";
    std::string place;             // where the ops run: "block 3", "the LM head"
    // Replay every tile of a tiled MLP; otherwise the tiles whose marks repeat an earlier one's are skipped.
    bool every_tile = false;

    // Names the moment that follows: the phase at `where`.
    void at(const std::string& where) {
        place = where;
        ledger.at(phase, " of " + where);
    }

    Sym make(size_t bytes, Account account = Account::activations) {
        Sym tensor;
        tensor.storage = std::make_shared<Storage>(&ledger, account, bytes);
        tensor.id = ++last_id_;
        tensor.bytes = bytes;
        return tensor;
    }
    Sym parameter(bool trainable) {
        Sym tensor;
        tensor.id = ++last_id_;
        tensor.parameter = true;
        tensor.requires_grad = trainable;
        return tensor;
    }
    Sym detach(const Sym& tensor) {
        Sym view = tensor;
        view.id = ++last_id_;
        view.requires_grad = false;
        view.parameter = false;
        return view;
    }
    // engine::record_node: nothing under no-grad; otherwise a node when an input requires grad (or `always`),
    // and then the output requires grad.
    bool record(std::initializer_list<const Sym*> inputs, Sym& output, std::function<void(Context&)> backward,
                bool always = false) {
        return record(inputs.begin(), inputs.size(), output, std::move(backward), always);
    }
    bool record(const Sym* const* inputs, size_t count, Sym& output, std::function<void(Context&)> backward,
                bool always = false) {
        if (!grad_enabled) return false;
        bool any = always;
        for (size_t index = 0; index < count; ++index)
            any = any || (inputs[index]->defined() && inputs[index]->requires_grad);
        if (!any) return false;
        output.requires_grad = true;
        tape->push_back(Node{output.id, std::move(backward), place});
        return true;
    }
    // engine::run_backward: newest node first; a node runs when one of its outputs has a gradient; its outputs'
    // gradients are erased after it and its saved tensors freed.
    void run_backward(Tape& nodes, Context& context, const char* suffix = "") {
        const bool previous = grad_enabled;
        grad_enabled = false;
        while (!nodes.empty()) {
            Node node = std::move(nodes.back());
            nodes.pop_back();
            ledger.at(backward_prefix, node.where, suffix);
            place = node.where; // what a recompute inside it records belongs there too
            if (context.has(node.output)) node.backward(context);
            context.erase(node.output);
            node.backward = nullptr;
        }
        grad_enabled = previous;
    }

private:
    uint64_t last_id_ = 0;
};

inline Sym Context::input_grad(const Target& target) {
    if (!target.requires_grad) return Sym();
    if (target.parameter) return replay_.parameter(false); // the persistent buffer
    if (const auto found = find(target.id); found != grads_.end()) return found->second;
    Sym buffer = replay_.make(target.bytes, Account::workspace);
    grads_.emplace_back(target.id, buffer);
    return buffer;
}

inline Sym Context::gradient_or_scratch(const Sym& gradient, const Target&, size_t bytes) {
    return gradient.defined() ? gradient : replay_.make(bytes, Account::workspace);
}

// The ops, each as its engine twin allocates (out, statistics), saves (captured by its node) and, in backward,
// allocates (input gradients on first use, scratch). `rows` is B·T; widths are in elements.
class Ops {
public:
    Ops(Replay& replay, size_t rows) : r(replay), rows(rows) {}
    Replay& r;
    size_t rows; // B·T, or a tile's rows while a tiled MLP runs one

    // engine::embedding with a frozen table: the lookup, recorded by nothing.
    Sym embedding(size_t width) { return r.make(rows * width * r.element); }

    // engine::rms_norm: out (N,C), rstd (N) wide; saves input and rstd. Backward: d(input) (scratch when the input
    // needs none) and the gain's gradient (scratch: frozen).
    Sym rms_norm(const Sym& input, const Sym& gain, size_t width) {
        Sym out = r.make(rows * width * r.element);
        Sym rstd = r.make(rows * r.wide);
        const Target input_target(input), gain_target(gain);
        const size_t gain_bytes = width * r.wide;
        r.record({&input, &gain}, out, [=, saved_input = input, saved_rstd = rstd, id = out.id](Context& context) {
            const Sym dout = context.output_grad(id);
            const Sym dinput = context.gradient_or_scratch(context.input_grad(input_target), input_target, input_target.bytes);
            const Sym dgain = context.gradient_or_scratch(context.parameter_grad(gain_target), gain_target, gain_bytes);
        });
        return out;
    }

    // engine::layernorm with a frozen gain and bias: out (N,C), mean and rstd (N) wide; saves input, mean and
    // rstd. Backward: d(input) (scratch when the input needs none) and both parameters' gradients (scratch).
    Sym layernorm(const Sym& input, size_t width) {
        Sym out = r.make(rows * width * r.element);
        Sym mean = r.make(rows * r.wide);
        Sym rstd = r.make(rows * r.wide);
        const Sym weight = r.parameter(false), bias = r.parameter(false);
        const Target input_target(input), weight_target(weight), bias_target(bias);
        const size_t parameter_bytes = width * r.wide;
        r.record({&input, &weight, &bias}, out,
                 [=, saved_input = input, saved_mean = mean, saved_rstd = rstd](Context& context) {
                     const Sym dinput = context.gradient_or_scratch(context.input_grad(input_target), input_target,
                                                                    input_target.bytes);
                     const Sym dweight = context.gradient_or_scratch(context.parameter_grad(weight_target),
                                                                     weight_target, parameter_bytes);
                     const Sym dbias = context.gradient_or_scratch(context.parameter_grad(bias_target), bias_target,
                                                                   parameter_bytes);
                 });
        return out;
    }

    // engine::gelu: out; saves its input. Backward: d(input).
    Sym gelu(const Sym& input, size_t width) {
        Sym out = r.make(rows * width * r.element);
        const Target input_target(input);
        r.record({&input}, out, [=, saved_input = input](Context& context) {
            const Sym dinput = context.input_grad(input_target);
        });
        return out;
    }

    // engine::matmul(a, b) over `columns` outputs: each side saved only for the other's gradient.
    Sym matmul(const Sym& a, const Sym& b, size_t columns) {
        Sym out = r.make(rows * columns * r.element);
        const Target a_target(a), b_target(b);
        r.record({&a, &b}, out, [=, saved_a = b.requires_grad ? a : Sym(), id = out.id](Context& context) {
            const Sym dout = context.output_grad(id);
            const Sym da = context.input_grad(a_target);
            const Sym db = context.parameter_grad(b_target);
        });
        return out;
    }

    // engine::dequantize_nf4 of an (in,out) weight: the dense weight (workspace), and while it is filled each
    // 64-element block's absmax decoded to f32 (workspace), freed on return.
    Sym dequantize_nf4(size_t elements) {
        Sym dense = r.make(elements * r.element, Account::workspace);
        const Sym absmax = r.make((elements + 63) / 64 * sizeof(float), Account::workspace);
        return dense;
    }

    // engine::nf4_linear: the weight dequantised for the GEMM under no-grad, then freed; the node keeps the 4-bit
    // weight and, in backward, dequantises it again for d(input).
    Sym nf4_linear(const Sym& input, size_t in, size_t out_features) {
        Sym out;
        {
            const bool previous = r.grad_enabled;
            r.grad_enabled = false;
            const Sym dense = dequantize_nf4(in * out_features);
            out = matmul(input, dense, out_features);
            r.grad_enabled = previous;
        }
        const Target input_target(input);
        const size_t elements = in * out_features;
        r.record({&input}, out, [=, id = out.id, this](Context& context) {
            const Sym dinput = context.input_grad(input_target);
            if (!dinput.defined()) return;
            const Sym dout = context.output_grad(id);
            const Sym dense = dequantize_nf4(elements);
        });
        return out;
    }

    // engine::rope: out; saves only the tables. Backward: d(x).
    Sym rope(const Sym& x, size_t width) {
        Sym out = r.make(rows * width * r.element);
        const Target x_target(x);
        r.record({&x}, out, [=](Context& context) { const Sym dx = context.input_grad(x_target); });
        return out;
    }

    // engine::concat along the last dimension: out; saves nothing. Backward: each recorded input's gradient in
    // input order.
    Sym concat(const std::vector<Sym>& inputs, const std::vector<size_t>& widths) {
        size_t total = 0;
        for (size_t width : widths) total += width;
        Sym out = r.make(rows * total * r.element);
        // Only the inputs that require grad are the node's (the engine's `recorded`).
        std::vector<const Sym*> recorded;
        std::vector<Target> targets;
        for (const Sym& input : inputs)
            if (input.requires_grad) {
                recorded.push_back(&input);
                targets.emplace_back(input);
            }
        r.record(recorded.data(), recorded.size(), out, [=](Context& context) {
            for (const Target& target : targets) {
                const Sym dinput = context.input_grad(target);
            }
        });
        return out;
    }

    // engine::attention: out (N,C), logsumexp (B,NH,T) wide; saves the packed input, out and logsumexp.
    // Backward: d(packed).
    Sym attention(const Sym& packed, size_t width, size_t heads) {
        Sym out = r.make(rows * width * r.element);
        Sym logsumexp = r.make(rows * heads * r.wide);
        const Target packed_target(packed);
        r.record({&packed}, out, [=, saved_packed = packed, saved_out = r.detach(out), saved_logsumexp = logsumexp](
                                        Context& context) { const Sym dpacked = context.input_grad(packed_target); });
        return out;
    }

    // engine::residual_add: out; saves nothing. Backward: both inputs' gradients.
    Sym add(const Sym& a, const Sym& b, size_t width) {
        Sym out = r.make(rows * width * r.element);
        const Target a_target(a), b_target(b);
        r.record({&a, &b}, out, [=](Context& context) {
            const Sym da = context.input_grad(a_target);
            const Sym db = context.input_grad(b_target);
        });
        return out;
    }

    // engine::swiglu: out; saves gate and up. Backward: both their gradients.
    Sym swiglu(const Sym& gate, const Sym& up, size_t width) {
        Sym out = r.make(rows * width * r.element);
        const Target gate_target(gate), up_target(up);
        r.record({&gate, &up}, out, [=, saved_gate = r.detach(gate), saved_up = r.detach(up)](Context& context) {
            const Sym dgate = context.input_grad(gate_target);
            const Sym dup = context.input_grad(up_target);
        });
        return out;
    }

    // engine::multiply by a scalar: out (zeroed); saves nothing. Backward: d(input).
    Sym multiply(const Sym& input, size_t bytes) {
        Sym out = r.make(bytes);
        const Target input_target(input);
        r.record({&input}, out, [=](Context& context) { const Sym dinput = context.input_grad(input_target); });
        return out;
    }

    // engine::dropout in train mode (p > 0): out; saves nothing (the mask comes again from its seed).
    Sym dropout(const Sym& input, size_t width) {
        Sym out = r.make(rows * width * r.element);
        const Target input_target(input);
        r.record({&input}, out, [=](Context& context) { const Sym dinput = context.input_grad(input_target); });
        return out;
    }

    // engine::cross_entropy_in_place over (N,Vp) logits of which V are the vocabulary: the per-token losses (N) wide
    // and the (1) sum; the node keeps the logits' storage and hands it to the walk as their gradient. Without a node
    // (no-grad: an evaluation) it is plain cross_entropy, over a copy of the real columns when Vp > V.
    Sym cross_entropy_in_place(const Sym& logits, size_t columns, size_t vocabulary) {
        Sym losses = r.make(rows * r.wide);
        if (!r.grad_enabled || !logits.requires_grad) {
            const Sym classes = columns == vocabulary ? logits : r.make(rows * vocabulary * r.element);
            return r.make(r.wide);
        }
        Sym out = r.make(r.wide);
        const Target logits_target(logits);
        r.record({&logits}, out, [=, gradient = r.detach(logits)](Context& context) {
            if (!context.adopt_input_grad(logits_target, gradient)) {
                const Sym dlogits = context.input_grad(logits_target);
            }
        });
        return out;
    }

    // engine::linear_cross_entropy with a frozen (Vp,C) head: the losses (N) wide, d(hidden) (N,C) made in forward,
    // one chunk's logits (chunk,Vp) while the chunks run, the (1) sum; the node hands d(hidden) to the walk. Without
    // a gradient to make (an evaluation) the chunks' logits are over the V real columns only.
    Sym linear_cross_entropy(const Sym& hidden, size_t width, size_t columns, size_t vocabulary, size_t chunk) {
        Sym losses = r.make(rows * r.wide);
        const bool wants_hidden = r.grad_enabled && hidden.requires_grad;
        if (!wants_hidden) {
            const Sym logits = r.make(std::min(chunk, rows) * vocabulary * r.element); // lives to the sum
            return r.make(r.wide);
        }
        Sym dhidden = r.make(rows * width * r.element);
        {
            const Sym logits = r.make(std::min(chunk, rows) * columns * r.element);
        }
        Sym out = r.make(r.wide);
        const Target hidden_target(hidden);
        r.record({&hidden}, out, [=, saved_hidden = r.detach(hidden)](Context& context) {
            if (!context.adopt_input_grad(hidden_target, dhidden)) {
                const Sym dinput = context.input_grad(hidden_target);
            }
        });
        return out;
    }
};


} // namespace engine::planner::replay
