// Module: a named tree of parameters. Names are stable ("h.0.attn.c_attn.weight") and are what
// safetensors files and training-state files key on.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace engine::checkpoint {
struct CheckpointPolicy;
}

namespace engine::nn {

class Module {
public:
    Module() = default;
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    // Depth-first in registration order, with dotted names.
    std::vector<std::pair<std::string, Tensor>> named_parameters() const;
    std::vector<Tensor> parameters() const;
    // Every module of the subtree with its dotted name ("" for this one), in named_parameters()' order.
    std::vector<std::pair<std::string, Module*>> named_modules();
    void zero_grad(); // memset of every gradient buffer; never frees
    size_t parameter_count() const;
    // The bytes of every buffer of the subtree (register_buffer: an NF4 layer's codes and scales).
    size_t buffer_bytes() const;

    // Frozen parameters (docs/TRAINING.md, "Frozen parameters"). set_requires_grad(false) freezes every parameter
    // of this subtree, PyTorch's requires_grad_(False): its gradient buffer is freed, and so are the buffers of
    // its views (register_alias) and of its working copy, so backward computes no gradient for it (a frozen
    // linear weight's weight-gradient GEMM is skipped; the input gradient still flows), and a trainer gives it no
    // optimizer state, no part in the gradient norm or the data-parallel reduction, and never writes it. It stays
    // in named_parameters() (files save and load it). true gives each frozen parameter a zeroed buffer again.
    // Call it before set_master_device (refused once the masters are apart) and before building a trainer,
    // which lists the trainable parameters when it is made.
    void set_requires_grad(bool requires_grad);
    // The same for one parameter, by its dotted name in named_parameters(); a name that names none throws,
    // naming it and changing nothing.
    void set_parameter_requires_grad(const std::string& name, bool requires_grad);
    // named_parameters() less the frozen ones, in the same order: what an optimizer updates.
    std::vector<std::pair<std::string, Tensor>> named_trainable_parameters() const;
    std::vector<Tensor> trainable_parameters() const;
    size_t trainable_parameter_count() const;
    // Train mode turns dropout on; both reach every registered submodule. New modules start in train mode, as
    // in PyTorch: a module registered after eval() is in train mode until the next call.
    void train(bool training = true);
    void eval() { train(false); }
    bool training() const { return training_; }

    // Moves every parameter of the tree to `device`, with its gradient buffer, its bf16 working copy and the
    // views registered beside it (register_alias), keeping names, values and autograd identities. The move
    // is in place, as PyTorch's: a Tensor handle to a parameter taken before the call (module.weight, an
    // entry of named_parameters()) is the same parameter afterwards and sees the new device; nothing keeps
    // training an old copy. What is not moved: an optimizer's state (it lives on the device the parameters
    // had when the optimizer was built, and its step then throws naming the parameter: build the optimizer,
    // and a Trainer, after to()); views a caller made itself (detach, reshape, with_rows), which keep the old
    // storage; and a graph recorded before the call (call it between steps, not between forward and
    // backward). Every new buffer is allocated before any is taken, so an allocation failure changes
    // nothing. A build without CUDA throws its "built without CUDA" error for Device::cuda. Refused while
    // set_master_device keeps the masters apart from the working copies.
    void to(Device device);

    // Mixed precision (docs/TRAINING.md, "bf16"), for the whole tree. The parameters stay what they are: the
    // f32 masters that named_parameters() lists, the optimizer updates and files save. With bf16 each also
    // gets a working copy in bf16 (category parameters) that the forward reads; the copy's gradient buffer
    // is the master's own (f32), so weight gradients accumulate in f32 across micro-batches. f32 (or the
    // parameters' own dtype) removes the copies. The copies are made now from the masters' values.
    void set_compute_dtype(DType dtype);
    DType compute_dtype() const { return compute_dtype_; }
    // Whether this module's own parameters have working copies apart from them (set_compute_dtype to another
    // dtype, or set_master_device).
    bool has_working_copies() const { return !working_copies_.empty(); }
    // Rounds the masters into the working copies again: after anything writes the masters (the optimizer
    // step, a load, a broadcast). The trainer and the library's loaders call it; code that writes parameters
    // itself must too. Nothing without copies.
    void refresh_working_copies();
    // What the forward reads for one of this module's parameters (or a with_rows view of one, as the padded
    // token table): its working copy with the same shape when there is one, else the parameter itself (an
    // undefined tensor, as a Linear without bias, is returned as it is).
    const Tensor& working(const Tensor& parameter) const;
    // working() of every parameter, in named_parameters() order: the leaves backward accumulates into. Their
    // grad() is the masters' own buffer, except with the masters on another device (set_master_device).
    std::vector<Tensor> working_parameters() const;

    // Model state off the device (docs/MEMORY.md, "Model state off the device"): moves the masters (the
    // parameters, their gradient buffers and the views registered beside them) to `master_device` (the host),
    // and puts what the forward reads on `compute_device` (default: where the parameters are), for the whole
    // tree: the working copies in compute_dtype() (bf16 under mixed precision, else copies in the parameters'
    // own dtype), made anew, each a leaf with its own zeroed gradient buffer there (f32), into which backward
    // accumulates. A model built on the host and placed with compute_device cuda never holds its masters on the
    // device (train_gpt does so); one built on the device frees its masters there before the copies are made.
    // refresh_working_copies() copies (and rounds) the masters up; compute_device() is where the forward runs.
    // All or nothing: a failure puts the masters and their copies back. The parameters must be on one device;
    // a second call with the same devices changes nothing, and to() is refused while they are apart.
    void set_master_device(Device master_device, std::optional<Device> compute_device = std::nullopt);
    // Streamed gradients, with the masters apart: every working copy of this subtree gets a zeroed gradient
    // buffer of its own on the compute device (f32), or loses it; without one, a forward in grad mode that
    // reads it fails naming it, and backward accumulates into the buffer the recorded nodes captured.
    void attach_working_gradients();
    void release_working_gradients();
    // Sharded gradients (ZeRO-2): every trainable parameter of this subtree, with its views and its working copy
    // beside it (which share its buffer), gets a zeroed gradient buffer (category gradients, where the master is) or
    // loses it, staying trainable; without one, a forward in grad mode that reads it fails naming it. The trainer
    // gives a checkpointed segment's layers theirs from its recompute to the end of its backward. With the masters
    // apart (set_master_device) only the masters' side: the working copies' device buffers are
    // attach_working_gradients'.
    void attach_gradients();
    void release_gradients();
    // ZeRO-3 (docs/DISTRIBUTED.md, "Stage 3"): the trainable parameters of this subtree, with the views and working
    // copies beside them, lose their storage (release_parameter_storage: their values are kept elsewhere, as the
    // ranks' shards, and reading one throws naming it) or get fresh storage of their size again
    // (allocate_parameter_storage), uninitialised: the caller writes the masters, then refresh_working_copies(),
    // which passes over released masters and released copies. Gradient buffers and frozen parameters are left as they
    // are. With the masters apart (set_master_device, the model state on the host) release_parameter_storage releases
    // the working copies on the compute device too, allocate_parameter_storage allocates the masters' side only (what a
    // save reads), and release_master_storage lets the masters' side go while the copies stay (a segment gathered on
    // the host, rounded up, then run from its device copies). allocate_working_storage allocates the working copies
    // that are not the masters themselves (bf16 copies beside them, or copies apart) and nothing else: a forward reads
    // only those (ZeroShards::gather_rounded fills them). Refused while the copies are parked (park_working_copies).
    void release_parameter_storage();
    void allocate_parameter_storage();
    // ZeRO-3's token table and head: the gradient buffers of this subtree's trainable parameters, their views and
    // working copies keep their handles (what a recorded node captured) but lose their storage, or get it back zeroed
    // (one storage per storage shared before, so a copy's buffer stays its master's).
    void release_gradient_storage();
    void allocate_gradient_storage();
    void allocate_working_storage();
    void release_master_storage();

    // Parameters streamed (offload_parameters; docs/MEMORY.md, "Parameters streamed"), with the masters apart:
    // park_working_copies() moves this subtree's working copies to the masters' device (the host, category
    // parameters), where refresh_working_copies() keeps them current; their gradient buffers stay where they
    // are. While they are parked, fetch_working_copies() gives them a copy on the compute device for one use (a
    // forward; a recompute and its backward) and release_fetched_copies() lets it go (freed once no recorded
    // node holds it; the host copy was never written). unpark_working_copies() puts them back on the compute
    // device for good. A forward through parked copies that were not fetched fails on the ops' device check.
    // prefetch_working_copies() starts the same copies on the copy stream and returns at once (nothing when they
    // are not parked or are fetched already); the fetch_working_copies() that follows orders the compute stream
    // after them instead of copying.
    // The parked copies are pinned host memory (category pinned_host), so that a copy up is a DMA at the link's
    // rate. set_streamed_placement(park, without_gradients, released), called before set_master_device, makes this
    // subtree's copies parked as soon as each module's are made (park), without device gradient buffers
    // (without_gradients: streamed gradients attach them for a use), or the trainable ones released (released: ZeRO-3
    // gathers them for each use), so that placing a model never holds more than one module's copies on the device
    // beyond what the plan keeps there.
    void set_streamed_placement(bool park, bool without_gradients, bool released = false);
    void park_working_copies();
    void unpark_working_copies();
    void fetch_working_copies();
    void prefetch_working_copies();
    void release_fetched_copies();
    bool working_copies_parked() const { return parked_; }
    // Where the forward runs: the working copies' device when the masters are apart, else the parameters'.
    Device compute_device() const;
    // The masters' device when set_master_device moved them, else nullopt.
    std::optional<Device> master_device() const { return master_device_; }

    // The seam through which a trainer applies its checkpoint policy (checkpoint/checkpoint.h): only the model
    // knows which of its layers are checkpointable and how they chain (GPT: its blocks). The default, for a
    // module with no checkpointable layers, accepts a disabled policy and refuses an enabled one, so that
    // gradient_checkpointing is never silently ignored.
    virtual void set_checkpointing(const checkpoint::CheckpointPolicy& policy);

protected:
    // Creates a leaf parameter (category parameters) with its gradient buffer allocated once.
    Tensor register_parameter(const std::string& name, const Tensor& initial);
    // The child must outlive this module's use of it: a member, or owned by this module (nn::Sequential).
    void register_module(const std::string& name, Module& child);
    // Takes a registered child away again (a LoRA adapter merged into its layer); a name not registered throws.
    void remove_module(const std::string& name);
    // A tensor the module keeps over one of its parameters' storage, besides the parameter itself (the
    // padded token table, nn::Embedding): to() moves it with the parameter. Returns it for the member.
    const Tensor& register_alias(const Tensor& alias);
    // A tensor the module keeps that is not a parameter and has no gradient (an NF4 layer's codes and scales,
    // nn::AdaptableLinear::quantize_nf4): to() moves it in place with the parameters, and set_master_device puts
    // it on the compute device, where the forward reads it. Files, optimizers and parameter counts never see it.
    void register_buffer(const Tensor& buffer);
    // Takes a registered parameter away (a weight quantised to NF4), with its gradient buffer and working copy;
    // refused with the masters apart. A name not registered throws.
    void remove_parameter(const std::string& name);

private:
    struct WorkingCopy {
        Tensor master_storage;  // the master seen over all the rows its storage holds
        Tensor working_storage; // (same shape, compute dtype) a leaf whose gradient is the master's
        Tensor working;         // working_storage with the master's own rows
    };
    void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
    // Freezes parameters_[index] with its views and working copy (set_requires_grad), or with a `buffer` from
    // gradient_buffer_for unfreezes them over it.
    Tensor gradient_buffer_for(size_t index, const std::string& name) const; // name: the dotted one, for errors
    void set_requires_grad_of(size_t index, const Tensor& buffer);
    // The tensors over parameters_[index]'s storage: it, its views, and its working copy beside it (not one apart).
    std::vector<Tensor> handles_of(size_t index) const;
    void collect_trainable_handles(std::vector<Tensor>& out) const; // handles_of every trainable parameter of the subtree
    void collect_trainable_copies(std::vector<Tensor>& out) const; // their working copies that are not the masters
    std::vector<Tensor> gradient_handles() const; // the gradient buffers of both, each handle
    // Copies in `dtype` on `device` (the masters' own device: sharing their gradient buffers; another: each
    // with a gradient buffer of its own).
    void make_working_copies(DType dtype, Device device,
                             std::vector<std::pair<Module*, std::vector<WorkingCopy>>>& made);
    void refresh(const WorkingCopy& copy) const;
    void collect_storage_holders(std::vector<Tensor>& out) const;
    void collect_working(std::vector<Tensor>& out) const;
    void collect_modules(std::vector<Module*>& out);
    void collect_working_storage(std::vector<Tensor>& out) const; // every working copy handle of the subtree
    bool any_parked() const;
    std::vector<std::pair<std::string, Tensor>> parameters_;
    std::vector<Tensor> aliases_;
    std::vector<Tensor> buffers_;
    std::vector<WorkingCopy> working_copies_; // empty, or one per parameters_ entry
    DType compute_dtype_ = DType::f32;
    std::optional<Device> master_device_; // set_master_device's, for the whole tree
    Device compute_device_ = Device::cpu; // the working copies' device, with master_device_
    bool parked_ = false;                 // park_working_copies's, for the subtree it was called on
    bool park_on_placement_ = false;      // set_streamed_placement's
    bool no_gradients_on_placement_ = false;
    bool release_on_placement_ = false;
    StagedStorage fetched_;               // fetch_working_copies's copies, on the module it was called on
    std::vector<std::pair<std::string, Module*>> children_;
    bool training_ = true;
};

// A module whose forward takes one tensor and returns one: what nn::Sequential chains. Linear, LayerNorm,
// Dropout, GELU, Lambda and GPT's blocks are layers.
class Layer : public Module {
public:
    virtual Tensor forward(const Tensor& input) const = 0;
    Tensor operator()(const Tensor& input) const { return forward(input); }
};

} // namespace engine::nn
