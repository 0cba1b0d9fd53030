// Optimizers over a model's named parameters: SGD with momentum and AdamW, both with PyTorch semantics, and
// their state (moments, step count) exposed by name so that a training-state file can save and restore it.
//
// Which parameters decay: by default only tensors with two or more dimensions (the Linear weights and the
// embedding tables). Biases, LayerNorm weights and every other 1-D parameter are not decayed, the grouping
// Hugging Face and nanoGPT use for GPT-2. Pass another DecayRule to change it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace engine::optim {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using DecayRule = std::function<bool(const std::string& name, const Tensor& parameter)>;

// ZeRO stage 1: the elements [begin, end) of the parameters laid end to end in order are the only ones this
// optimizer keeps state for and updates; the others are another rank's (docs/DISTRIBUTED.md). The default is
// every element.
struct ShardRange {
    int64_t begin = 0;
    int64_t end = INT64_MAX;
};

// The default rule: decay tensors of rank >= 2 only.
bool decay_matrices_only(const std::string& name, const Tensor& parameter);

class Optimizer {
public:
    // Every parameter must be a leaf with a gradient buffer. State is allocated here, once, in
    // MemoryCategory::optimizer_state, on each parameter's device and dtype. The learning rate and weight
    // decay are the subclass's options, which it has checked (SGDOptions::problem, AdamWOptions::problem).
    Optimizer(const NamedTensors& named_parameters, double learning_rate, double weight_decay,
              const DecayRule& decays, int state_tensors_per_parameter, ShardRange shard = {});
    virtual ~Optimizer() = default;
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // One update of every parameter from its gradient buffer multiplied by grad_scale (the clip
    // coefficient, fused into the update so the gradients need no extra pass). Advances step_count. With the
    // step's epilogue set (set_step_epilogue) it also writes the working copies and zeroes the gradients.
    virtual void step(double grad_scale = 1.0) = 0;
    void zero_grad(); // memset of every gradient buffer (a parameter without one at the moment has nothing to zero)
    // ZeRO-2: the gradients of this optimizer's range (its ShardRange) are read from `gradients` (1-D, the range's
    // elements laid end to end, on the parameters' device in their gradient dtype), a rank's shard of the summed
    // gradients, and not from the parameters' buffers, which then need not exist at the step. Checked here.
    void read_gradients_from(const Tensor& gradients);
    // ZeRO-3: the parameters whose `offsets` entry (one per parameter, in order) is >= 0 have their part read and
    // updated in `parameters` (1-D, on their device in their dtype) from that element on, a rank's shard of the
    // masters, and not in their own storage, which then need hold nothing at the step; the others (-1) in their
    // own storage, as before. Checked here.
    void write_parameters_in(const Tensor& parameters, const std::vector<int64_t>& offsets);
    // The step's epilogue, in the update's own pass where the optimizer has one (AdamW: one multi-tensor launch per
    // 64 parameters writes the new values, their bf16 copies and the zeroed gradients, where the step would
    // otherwise launch an update, a conversion and a memset per parameter). After each step, working_copies[i]
    // (undefined: none; else bf16 on parameters[i]'s device and of its size, its working copy) holds parameter
    // i's updated values rounded, as Module::refresh_working_copies() would write them, and with zero_gradients
    // every gradient buffer is zero, as zero_grad() leaves it. `parameters` are this optimizer's, in its order.
    // Refused for a sharded optimizer and with read_gradients_from or write_parameters_in, whose ranges are a
    // rank's part (ZeRO): their trainers refresh and zero as before; and for a parameter listed twice (one launch
    // would zero a gradient another of its blocks reads). Checked here. The copies are held by handle: copies
    // made anew later (set_compute_dtype, set_master_device) are not these, so set the epilogue after them.
    void set_step_epilogue(const std::vector<Tensor>& parameters, const std::vector<Tensor>& working_copies,
                           bool zero_gradients);
    bool has_step_epilogue() const { return epilogue_; }

    double learning_rate() const { return learning_rate_; }
    void set_learning_rate(double learning_rate);
    double weight_decay() const { return weight_decay_; }
    // Updates applied so far; AdamW's bias correction uses it. Set it when restoring a training state.
    int64_t step_count() const { return step_count_; }
    void set_step_count(int64_t step_count);

    // The live state tensors, named "<state>.<parameter>" ("exp_avg.h.0.attn.c_attn.weight"). A restorer
    // copies saved values into them (Tensor::copy_from); their shapes equal the parameters' (sharded: 1-D,
    // this shard's part of the parameter, possibly none).
    virtual NamedTensors named_state() const = 0;
    // The kinds of state each parameter has, in named_state()'s order ("exp_avg", "exp_avg_sq"): the same on every
    // rank, also one that holds no part of any parameter.
    virtual std::vector<std::string> state_kinds() const = 0;
    bool sharded() const { return sharded_; }
    // Each live state tensor with its parameter and the parameter's first element it covers (0 unsharded), in
    // named_state()'s order: what a sharded state is gathered from and restored into.
    struct StateShard {
        std::string name; // as in named_state()
        Tensor state;
        Tensor parameter;
        int64_t first = 0;
    };
    std::vector<StateShard> state_shards() const;
    std::vector<std::string> parameter_names() const;
    bool decays(const std::string& parameter_name) const; // throws for an unknown name

protected:
    struct Slot {
        std::string name;
        Tensor parameter;
        bool decays = false;
        std::vector<Tensor> state; // zero-initialised, same shape as the parameter (sharded: shard_count long)
        int64_t shard_begin = 0;   // the part of the parameter this optimizer updates
        int64_t shard_count = 0;
        int64_t range_offset = 0;  // where that part starts among the range's elements (read_gradients_from)
    };
    // The gradient a slot's update reads, and the element its part starts at there.
    std::pair<Tensor, int64_t> gradient_of(const Slot& slot) const;
    // The parameter a slot's update writes, and the element its part starts at there.
    std::pair<Tensor, int64_t> parameter_of(const Slot& slot) const;
    // Before a step writes anything: every state tensor is on its parameter's device. A parameter moved by
    // Module::to after the optimizer was built is not (its state stayed behind): a clear error, not a kernel
    // reading the other device's memory.
    void check_state_devices(const char* optimizer) const;
    // The epilogue of a step whose update did not write it itself (SGD): each slot's copy rounded from its
    // parameter, then its gradient zeroed, tensor by tensor.
    void run_step_epilogue() const;
    std::vector<Slot> slots_;
    bool epilogue_ = false;              // set_step_epilogue's
    std::vector<Tensor> working_copies_; // set_step_epilogue's, per slot (undefined: none)
    bool zero_gradients_in_step_ = false;
    bool sharded_ = false;
    Tensor range_gradients_; // read_gradients_from, or undefined
    Tensor range_parameters_; // write_parameters_in's, or undefined
    std::vector<int64_t> parameter_offsets_; // write_parameters_in's, per slot, or empty
    int64_t range_elements_ = 0; // the elements of the range that are parameters' (read_gradients_from's minimum)
    double learning_rate_;
    double weight_decay_;
    int64_t step_count_ = 0;
};

struct SGDOptions {
    double learning_rate = 1e-3;
    double momentum = 0.9;   // 0 turns the buffer into plain SGD
    double weight_decay = 0; // coupled (added to the gradient), as torch.optim.SGD
    // The rules on these fields (named as here): the first broken one, or nullopt. The constructor throws it.
    std::optional<ConfigProblem> problem() const;
};

// torch.optim.SGD without dampening or Nesterov: g = s·grad + wd·p; buf = momentum·buf + g; p -= lr·buf.
class SGD : public Optimizer {
public:
    SGD(const NamedTensors& named_parameters, const SGDOptions& options, const DecayRule& decays = decay_matrices_only,
        ShardRange shard = {});
    void step(double grad_scale = 1.0) override;
    NamedTensors named_state() const override; // "momentum_buffer.<name>"
    std::vector<std::string> state_kinds() const override { return {"momentum_buffer"}; }
    double momentum() const { return momentum_; }

private:
    double momentum_;
};

struct AdamWOptions {
    double learning_rate = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-8;
    double weight_decay = 0.01;
    // The rules on these fields (named as here): the first broken one, or nullopt. The constructor throws it.
    std::optional<ConfigProblem> problem() const;
};

// torch.optim.AdamW: p -= lr·wd·p; m, v moving averages of g and g²; p -= lr·m̂ / (sqrt(v̂) + eps), with
// m̂ = m / (1 − β1^t) and v̂ = v / (1 − β2^t), t the 1-based step.
class AdamW : public Optimizer {
public:
    AdamW(const NamedTensors& named_parameters, const AdamWOptions& options,
          const DecayRule& decays = decay_matrices_only, ShardRange shard = {});
    void step(double grad_scale = 1.0) override;
    NamedTensors named_state() const override; // "exp_avg.<name>", "exp_avg_sq.<name>"
    std::vector<std::string> state_kinds() const override { return {"exp_avg", "exp_avg_sq"}; }
    const AdamWOptions& options() const { return options_; }

private:
    AdamWOptions options_;
};

} // namespace engine::optim
