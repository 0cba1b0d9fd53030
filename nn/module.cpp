// Module bookkeeping: parameter registration, dotted names, zero_grad, train/eval mode and moves between
// devices.
#include "nn/module.h"

#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "checkpoint/checkpoint.h"
#include "engine/cuda/runtime.h"

namespace engine::nn {

Tensor Module::register_parameter(const std::string& name, const Tensor& initial) {
    Tensor parameter = initial.category() == MemoryCategory::parameters
                           ? initial
                           : initial.clone(MemoryCategory::parameters);
    parameter.set_name(name);
    parameter.set_requires_grad(true);
    parameters_.emplace_back(name, parameter);
    return parameter;
}

void Module::register_module(const std::string& name, Module& child) { children_.emplace_back(name, &child); }

void Module::remove_module(const std::string& name) {
    for (auto child = children_.begin(); child != children_.end(); ++child)
        if (child->first == name) {
            children_.erase(child);
            return;
        }
    ENGINE_FAIL("remove_module: no child module is named '" << name << "'");
}

const Tensor& Module::register_alias(const Tensor& alias) {
    aliases_.push_back(alias);
    return aliases_.back();
}

void Module::register_buffer(const Tensor& buffer) {
    ENGINE_CHECK(buffer.defined(), "register_buffer: the buffer is undefined");
    buffers_.push_back(buffer);
}

void Module::remove_parameter(const std::string& name) {
    ENGINE_CHECK(!master_device_, "remove_parameter('" << name << "'): the masters are apart (set_master_device)");
    for (size_t index = 0; index < parameters_.size(); ++index) {
        if (parameters_[index].first != name) continue;
        if (!working_copies_.empty()) working_copies_.erase(working_copies_.begin() + static_cast<std::ptrdiff_t>(index));
        parameters_.erase(parameters_.begin() + static_cast<std::ptrdiff_t>(index));
        return;
    }
    ENGINE_FAIL("remove_parameter: no parameter is named '" << name << "'");
}

size_t Module::buffer_bytes() const {
    size_t bytes = 0;
    for (const Tensor& buffer : buffers_) bytes += buffer.storage_bytes();
    for (const auto& [name, child] : children_) bytes += child->buffer_bytes();
    return bytes;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
    for (const auto& [name, parameter] : parameters_) out.emplace_back(prefix + name, parameter);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
    std::vector<std::pair<std::string, Module*>> out = {{"", this}};
    for (auto& [name, child] : children_)
        for (auto& [child_name, module] : child->named_modules())
            out.emplace_back(child_name.empty() ? name : name + "." + child_name, module);
    return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
    std::vector<std::pair<std::string, Tensor>> out;
    collect("", out);
    return out;
}

std::vector<Tensor> Module::parameters() const {
    std::vector<Tensor> out;
    for (auto& [name, parameter] : named_parameters()) out.push_back(parameter);
    return out;
}

void Module::zero_grad() {
    engine::zero_grad(parameters());
    if (!master_device_) return;
    std::vector<Tensor> attached; // buffers of their own, where streamed gradients have given them one
    for (const Tensor& working : working_parameters())
        if (working.grad().defined()) attached.push_back(working);
    engine::zero_grad(attached);
}

size_t Module::parameter_count() const {
    size_t count = 0;
    for (auto& [name, parameter] : named_parameters()) count += static_cast<size_t>(parameter.numel());
    return count;
}

namespace {
// The rows a parameter's storage holds: more than its shape says for a with_rows view (the padded table).
int64_t stored_rows(const Tensor& parameter) {
    if (parameter.dim() == 0 || parameter.numel() == 0) return parameter.dim() == 0 ? 0 : parameter.size(0);
    const size_t row_bytes = parameter.nbytes() / static_cast<size_t>(parameter.size(0));
    return static_cast<int64_t>(parameter.storage_bytes() / row_bytes);
}

// `tensor`'s gradient buffer becomes the first rows of `buffer` (a view of it when it holds more rows).
void give_gradient_rows(Tensor tensor, const Tensor& buffer) {
    tensor.set_gradient_buffer(tensor.dim() >= 1 && tensor.size(0) != buffer.size(0) ? buffer.with_rows(tensor.size(0))
                                                                                       : buffer);
}
} // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_trainable_parameters() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto& named : named_parameters())
        if (named.second.requires_grad()) out.push_back(std::move(named));
    return out;
}

std::vector<Tensor> Module::trainable_parameters() const {
    std::vector<Tensor> out;
    for (auto& [name, parameter] : named_trainable_parameters()) out.push_back(parameter);
    return out;
}

size_t Module::trainable_parameter_count() const {
    size_t count = 0;
    for (auto& [name, parameter] : named_trainable_parameters()) count += static_cast<size_t>(parameter.numel());
    return count;
}

// A zeroed gradient buffer over every row a parameter's storage holds (the padded table's too), of which each
// handle over that storage sees its own rows, as when the parameter was registered.
Tensor Module::gradient_buffer_for(size_t index, const std::string& name) const {
    const Tensor& parameter = parameters_[index].second;
    // A frozen parameter stored in bf16 has no f32 master any more: training it would update bf16 values.
    ENGINE_CHECK(!(parameter.dtype() == DType::bf16 && compute_dtype_ == DType::bf16),
                 "set_requires_grad(true): parameter '" << name << "' was frozen when "
                     "set_compute_dtype(bf16) stored it in bf16, without its f32 master; call set_compute_dtype(f32) "
                     "first (its bf16 values become the master), then unfreeze it");
    Shape shape = parameter.shape();
    if (!shape.empty()) shape[0] = stored_rows(parameter);
    return Tensor::zeros(shape, engine::compute_dtype(parameter.dtype()), parameter.device(), MemoryCategory::gradients);
}

std::vector<Tensor> Module::handles_of(size_t index) const {
    const Tensor& parameter = parameters_[index].second;
    // The tensors over this parameter's storage: its views, and its working copy beside it (bf16), whose
    // gradient buffer is the master's. With the masters apart, the working copy's buffer is its own: the
    // master's side only.
    std::vector<Tensor> handles = {parameter};
    for (const Tensor& alias : aliases_)
        if (alias.shares_storage_with(parameter)) handles.push_back(alias);
    if (index < working_copies_.size()) {
        const WorkingCopy& copy = working_copies_[index];
        handles.push_back(copy.master_storage);
        if (!master_device_) handles.insert(handles.end(), {copy.working_storage, copy.working});
    }
    return handles;
}

void Module::set_requires_grad_of(size_t index, const Tensor& buffer) {
    for (Tensor& handle : handles_of(index)) {
        if (buffer.defined()) give_gradient_rows(handle, buffer);
        else handle.set_requires_grad(false);
    }
}

void Module::set_requires_grad(bool requires_grad) {
    ENGINE_CHECK(!master_device_, "set_requires_grad: the masters are on " << device_name(*master_device_)
                                      << " apart from the working copies (set_master_device); freeze parameters "
                                         "before placing them");
    std::vector<Module*> tree;
    collect_modules(tree);
    const std::vector<std::pair<std::string, Tensor>> named = named_parameters(); // in the walk's order
    // Every buffer is allocated before the first is given: running out of memory changes nothing.
    std::vector<std::tuple<Module*, size_t, Tensor>> changes;
    size_t position = 0;
    for (Module* module : tree)
        for (size_t index = 0; index < module->parameters_.size(); ++index, ++position)
            if (module->parameters_[index].second.requires_grad() != requires_grad)
                changes.emplace_back(module, index,
                                     requires_grad ? module->gradient_buffer_for(index, named[position].first) : Tensor());
    for (const auto& [module, index, buffer] : changes) module->set_requires_grad_of(index, buffer);
}

void Module::set_parameter_requires_grad(const std::string& name, bool requires_grad) {
    ENGINE_CHECK(!master_device_, "set_parameter_requires_grad('" << name << "'): the masters are on "
                                      << device_name(*master_device_) << " apart from the working copies "
                                         "(set_master_device); freeze parameters before placing them");
    std::vector<std::pair<std::string, Tensor>> named = named_parameters();
    std::vector<Module*> tree;
    collect_modules(tree);
    // named_parameters() walks the tree depth first as collect_modules does, so the k-th name is the k-th
    // parameter met in that walk.
    size_t position = 0;
    for (Module* module : tree) {
        for (size_t index = 0; index < module->parameters_.size(); ++index, ++position) {
            if (named[position].first != name) continue;
            if (module->parameters_[index].second.requires_grad() == requires_grad) return;
            return module->set_requires_grad_of(index, requires_grad ? module->gradient_buffer_for(index, name) : Tensor());
        }
    }
    ENGINE_FAIL("set_parameter_requires_grad: no parameter is named '"
                << name << "' (" << named.size() << " parameters"
                << (named.empty() ? std::string() : ", the first '" + named.front().first + "'") << ")");
}

namespace {
// Whether a parameter is stored in the compute dtype itself, without a copy: a frozen one on the compute device
// (docs/TRAINING.md, "Frozen parameters"). Nothing writes it, so it needs no f32 master.
bool stored_in_compute_dtype(const Tensor& parameter, Device device) {
    return !parameter.requires_grad() && parameter.device() == device;
}
} // namespace

void Module::set_compute_dtype(DType dtype) {
    ENGINE_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16,
                 "set_compute_dtype: " << dtype_name(dtype) << " is not a compute dtype (f32, f64 or bf16)");
    for (const auto& [name, master] : named_parameters()) {
        // A frozen parameter moves between f32 and bf16 itself: bf16 after set_compute_dtype(bf16), f32 (its bf16
        // values, exactly) after set_compute_dtype(f32).
        const bool frozen_between = !master.requires_grad() && (dtype == DType::f32 || dtype == DType::bf16) &&
                                    (master.dtype() == DType::f32 || master.dtype() == DType::bf16);
        ENGINE_CHECK(dtype == master.dtype() || (master.dtype() == DType::f32 && dtype == DType::bf16) || frozen_between,
                     "set_compute_dtype: parameter '" << name << "' is " << dtype_name(master.dtype())
                                                      << "; working copies are bf16 over f32 masters");
    }
    // Copies in that dtype already (the masters placed apart with them): nothing to remake.
    if (dtype == compute_dtype_ && master_device_) return;
    ENGINE_CHECK(!any_parked(), "set_compute_dtype: working copies are parked on the host (parameter streaming); "
                                "unpark_working_copies first");
    // Every module's copies are made, and the frozen parameters converted, before any module takes them: an
    // allocation failure changes nothing. With the masters apart, the copies stay on the compute device and only
    // their dtype changes.
    const Device device = compute_device();
    std::vector<std::pair<Module*, std::vector<WorkingCopy>>> made;
    make_working_copies(dtype, device, made);
    std::vector<Module*> tree;
    collect_modules(tree);
    std::vector<Tensor> stored; // the frozen parameters stored in the compute dtype, with their views
    for (Module* module : tree)
        for (const auto& [name, parameter] : module->parameters_) {
            if (!stored_in_compute_dtype(parameter, device) || parameter.dtype() == dtype) continue;
            stored.push_back(parameter);
            for (const Tensor& alias : module->aliases_)
                if (alias.shares_storage_with(parameter)) stored.push_back(alias);
        }
    for (auto& [module, copies] : made) // the views the new entries keep over a parameter being converted
        for (const WorkingCopy& copy : copies)
            if (copy.working_storage.shares_storage_with(copy.master_storage) && copy.master_storage.dtype() != dtype)
                stored.insert(stored.end(), {copy.master_storage, copy.working_storage});
    convert_storage_to(stored, dtype);
    for (auto& [module, copies] : made) {
        module->working_copies_ = std::move(copies);
        module->compute_dtype_ = dtype;
    }
}

void Module::make_working_copies(DType dtype, Device device,
                                 std::vector<std::pair<Module*, std::vector<WorkingCopy>>>& made) {
    std::vector<WorkingCopy> copies;
    bool any_copy = false;
    for (const auto& [name, master] : parameters_) {
        WorkingCopy copy;
        copy.master_storage = master.dim() >= 1 ? master.with_rows(stored_rows(master)) : master;
        // No copy: the parameter is what the forward reads (in this dtype, or about to be converted to it).
        if ((dtype == master.dtype() && device == master.device()) || stored_in_compute_dtype(master, device)) {
            copy.working_storage = copy.master_storage;
            copy.working = master;
            copies.push_back(std::move(copy));
            continue;
        }
        any_copy = true;
        Tensor working_storage = Tensor::empty(copy.master_storage.shape(), dtype, device, MemoryCategory::parameters);
        working_storage.set_name(name);
        // A leaf that requires grad, unless its master is frozen. Beside its master: its gradient buffer is the
        // master's (f32, compute_dtype(bf16)). On another device: a buffer of its own there, where backward runs.
        if (master.requires_grad() && device == master.device()) working_storage.share_gradient_buffer(copy.master_storage);
        else if (master.requires_grad()) working_storage.set_requires_grad(true);
        copy.working_storage = working_storage;
        copy.working = master.dim() >= 1 ? working_storage.with_rows(master.size(0)) : working_storage;
        refresh(copy);
        copies.push_back(std::move(copy));
    }
    if (!any_copy) copies.clear(); // every parameter is read as it is
    // Streamed placement: this module's copies go without their device buffers, and to the host, before the
    // next module's are made.
    const bool apart = !copies.empty() && device != copies.front().master_storage.device();
    if (apart && no_gradients_on_placement_)
        for (WorkingCopy& copy : copies) {
            if (!copy.working_storage.requires_grad()) continue; // frozen: it never had one
            copy.working_storage.set_gradient_buffer(Tensor());
            copy.working.set_gradient_buffer(Tensor());
        }
    if (apart && release_on_placement_) {
        // ZeRO-3 takes these layers' values as the ranks' shards: their copies come back when a segment is gathered.
        std::vector<Tensor> trainable;
        for (const WorkingCopy& copy : copies)
            if (copy.working_storage.requires_grad()) trainable.push_back(copy.working_storage), trainable.push_back(copy.working);
        release_storage(trainable);
    }
    if (apart && park_on_placement_) {
        std::vector<Tensor> working;
        for (const WorkingCopy& copy : copies) working.push_back(copy.working_storage), working.push_back(copy.working);
        move_storage_to(working, copies.front().master_storage.device(), false, MemoryCategory::pinned_host);
    }
    made.emplace_back(this, std::move(copies));
    for (auto& [name, child] : children_) child->make_working_copies(dtype, device, made);
}

void Module::refresh(const WorkingCopy& copy) const {
    const Tensor& master = copy.master_storage;
    Tensor working = copy.working_storage; // a handle: copy_from writes through it
    if (working.shares_storage_with(master)) return; // the parameter itself: nothing to copy
    // ZeRO-3: refreshed when its values are gathered (the master), or when its segment is (the copy apart).
    if (master.storage_released() || working.storage_released()) return;
    if (working.device() == master.device()) return convert_into(working, master);
    if (working.dtype() == master.dtype()) return working.copy_from(master);
    // Rounded where the master is, then copied: half the bytes cross to the device, and the rounding is the
    // one every kernel shares (base/bfloat16.h), so the copy equals a device-side conversion.
    const Tensor rounded = Tensor::empty(master.shape(), working.dtype(), master.device(), MemoryCategory::workspace);
    convert_into(rounded, master);
    working.copy_from(rounded);
}

void Module::refresh_working_copies() {
    fetched_.restore(); // a parked copy is refreshed where it lives: a fetched copy of it would go stale
    for (const WorkingCopy& copy : working_copies_) refresh(copy);
    for (auto& [name, child] : children_) child->refresh_working_copies();
}

std::vector<Tensor> Module::working_parameters() const {
    std::vector<Tensor> out;
    collect_working(out);
    return out;
}

void Module::collect_working(std::vector<Tensor>& out) const {
    for (const auto& [name, parameter] : parameters_) out.push_back(working(parameter));
    for (const auto& [name, child] : children_) child->collect_working(out);
}

Device Module::compute_device() const {
    if (master_device_) return compute_device_;
    for (const auto& [name, parameter] : named_parameters()) return parameter.device();
    return Device::cpu;
}

void Module::set_master_device(Device master_device, std::optional<Device> compute_device) {
    const std::vector<std::pair<std::string, Tensor>> named = named_parameters();
    ENGINE_CHECK(!named.empty(), "set_master_device: the module has no parameters");
    const Device here = named.front().second.device();
    // Where the forward will run: by default where it runs now (a second call with the same devices is a no-op).
    const Device device = compute_device.value_or(master_device_ ? compute_device_ : here);
    if (master_device_ == master_device && compute_device_ == device) return;
    ENGINE_CHECK(!master_device_, "set_master_device: the masters are on " << device_name(*master_device_)
                                                                           << " already; they cannot move again");
    for (const auto& [name, parameter] : named)
        ENGINE_CHECK(parameter.device() == here, "set_master_device: parameter '" << name << "' is on "
                                                     << device_name(parameter.device()) << ", '" << named.front().first
                                                     << "' on " << device_name(here) << ": one device first (to())");
    ENGINE_CHECK(master_device != device, "set_master_device: the masters would be on " << device_name(device)
                                              << ", where the forward runs: nothing would be apart");
    ENGINE_CHECK(device != Device::cuda || cuda::backend_built,
                 "set_master_device: the forward on cuda, but libengine was built without CUDA");
    // The masters (with their views and buffers, the old copies' views of them included, so that what shared
    // storage still does) move out, which frees their bytes on the device; then every module gets copies of
    // its own on the device (parked on the host at once under a streamed placement). The old copies (bf16
    // beside their masters) are set aside until the end, to be put back if anything fails. bf16 copies stay
    // bf16; without them the copies are in the masters' own dtype.
    const DType dtype = compute_dtype_ == DType::bf16 ? DType::bf16 : named.front().second.dtype();
    std::vector<Module*> tree;
    collect_modules(tree);
    std::vector<Tensor> holders, buffers; // buffers: what the forward reads besides the copies, to the compute device
    for (Module* module : tree) {
        for (const auto& [name, parameter] : module->parameters_) holders.push_back(parameter);
        for (const Tensor& alias : module->aliases_) holders.push_back(alias);
        for (const WorkingCopy& copy : module->working_copies_) holders.push_back(copy.master_storage);
        for (const Tensor& buffer : module->buffers_) buffers.push_back(buffer);
    }
    std::vector<std::vector<WorkingCopy>> previous;
    for (Module* module : tree) previous.push_back(std::move(module->working_copies_)), module->working_copies_.clear();
    std::vector<std::pair<Module*, std::vector<WorkingCopy>>> made;
    try {
        move_storage_to(holders, master_device);
        move_storage_to(buffers, device);
        make_working_copies(dtype, device, made);
    } catch (...) {
        // All or nothing: the masters go back where they were, with the copies they had.
        move_storage_to(holders, here);
        move_storage_to(buffers, here);
        for (size_t index = 0; index < tree.size(); ++index) tree[index]->working_copies_ = std::move(previous[index]);
        throw;
    }
    for (auto& [module, copies] : made) module->working_copies_ = std::move(copies);
    for (Module* module : tree) {
        module->master_device_ = master_device;
        module->compute_device_ = device;
        module->parked_ = module->park_on_placement_;
    }
}

void Module::collect_modules(std::vector<Module*>& out) {
    out.push_back(this);
    for (auto& [name, child] : children_) child->collect_modules(out);
}

const Tensor& Module::working(const Tensor& parameter) const {
    if (!parameter.defined()) return parameter;
    for (size_t index = 0; index < working_copies_.size(); ++index) {
        const WorkingCopy& copy = working_copies_[index];
        if (!copy.master_storage.shares_storage_with(parameter)) continue;
        if (parameter.shape() == copy.working.shape()) return copy.working;
        if (parameter.shape() == copy.working_storage.shape()) return copy.working_storage;
    }
    return parameter;
}

// Every tensor handle of this module and its children over parameter, gradient or working-copy storage.
void Module::collect_storage_holders(std::vector<Tensor>& out) const {
    for (const auto& [name, parameter] : parameters_) out.push_back(parameter);
    for (const Tensor& alias : aliases_) out.push_back(alias);
    for (const Tensor& buffer : buffers_) out.push_back(buffer);
    for (const WorkingCopy& copy : working_copies_) {
        out.push_back(copy.master_storage);
        out.push_back(copy.working_storage);
        out.push_back(copy.working);
    }
    for (const auto& [name, child] : children_) child->collect_storage_holders(out);
}

void Module::to(Device device) {
    // Before anything else, so that a parameterless tree (Sequential of GELUs) fails the same way.
    ENGINE_CHECK(device != Device::cuda || cuda::backend_built,
                 "Module::to(cuda): tensor is on cuda, but libengine was built without CUDA");
    ENGINE_CHECK(!master_device_, "Module::to(" << device_name(device) << "): the masters are on "
                                                << device_name(*master_device_) << " apart from the working copies "
                                                << "(set_master_device); move the module before placing them");
    // In place, all or nothing, keeping shared storage shared (the padded table and its rows, a working copy
    // and its master's gradient): handles held before the move see the moved parameters.
    std::vector<Tensor> holders;
    collect_storage_holders(holders);
    move_storage_to(holders, device);
}

void Module::set_checkpointing(const checkpoint::CheckpointPolicy& policy) {
    ENGINE_CHECK(!policy.enabled, "set_checkpointing: gradient checkpointing (" << policy.to_string()
                                      << ") was requested for a module that has no checkpointable layers; override "
                                         "Module::set_checkpointing to apply the policy to its layers, or turn "
                                         "gradient_checkpointing off");
}

void Module::train(bool training) {
    training_ = training;
    for (auto& [name, child] : children_) child->train(training);
}

} // namespace engine::nn
