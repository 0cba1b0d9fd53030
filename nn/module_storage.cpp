// Module's storage for the model state off the device and for ZeRO: streamed and sharded gradient buffers, released
// and re-allocated parameter and gradient storage (stage 3), and working copies parked on the host and fetched for a
// use (streamed parameters). docs/MEMORY.md and docs/DISTRIBUTED.md say when the trainer calls each.
#include "nn/module.h"

#include "engine/cuda/runtime.h"

namespace engine::nn {

void Module::attach_working_gradients() {
    ENGINE_CHECK(master_device_, "attach_working_gradients: the masters are not apart from the working copies");
    for (size_t index = 0; index < working_copies_.size(); ++index) {
        WorkingCopy& copy = working_copies_[index];
        if (!parameters_[index].second.requires_grad()) continue; // frozen: no gradient to stream
        const Tensor buffer = Tensor::zeros(copy.working_storage.shape(), engine::compute_dtype(copy.working_storage.dtype()),
                                            copy.working_storage.device(), MemoryCategory::gradients);
        copy.working_storage.set_gradient_buffer(buffer);
        copy.working.set_gradient_buffer(copy.working.shape() == buffer.shape() ? buffer
                                                                                : buffer.with_rows(copy.working.size(0)));
    }
    for (auto& [name, child] : children_) child->attach_working_gradients();
}

void Module::release_working_gradients() {
    for (WorkingCopy& copy : working_copies_) {
        if (!copy.working_storage.requires_grad()) continue; // frozen
        copy.working_storage.set_gradient_buffer(Tensor());
        copy.working.set_gradient_buffer(Tensor());
    }
    for (auto& [name, child] : children_) child->release_working_gradients();
}

void Module::attach_gradients() {
    for (size_t index = 0; index < parameters_.size(); ++index) {
        const auto& [name, parameter] = parameters_[index];
        if (!parameter.requires_grad() || parameter.grad().defined()) continue; // frozen, or attached already
        set_requires_grad_of(index, gradient_buffer_for(index, name));
    }
    for (auto& [name, child] : children_) child->attach_gradients();
}

void Module::release_gradients() {
    for (size_t index = 0; index < parameters_.size(); ++index) {
        if (!parameters_[index].second.requires_grad()) continue; // frozen: it holds none
        for (Tensor& handle : handles_of(index))
            if (handle.requires_grad()) handle.set_gradient_buffer(Tensor());
    }
    for (auto& [name, child] : children_) child->release_gradients();
}

void Module::collect_trainable_handles(std::vector<Tensor>& out) const {
    for (size_t index = 0; index < parameters_.size(); ++index)
        if (parameters_[index].second.requires_grad())
            for (const Tensor& handle : handles_of(index)) out.push_back(handle);
    for (const auto& [name, child] : children_) child->collect_trainable_handles(out);
}

void Module::collect_trainable_copies(std::vector<Tensor>& out) const {
    for (size_t index = 0; index < working_copies_.size(); ++index) {
        const WorkingCopy& copy = working_copies_[index];
        if (parameters_[index].second.requires_grad() && !copy.working_storage.shares_storage_with(copy.master_storage))
            out.insert(out.end(), {copy.working_storage, copy.working});
    }
    for (const auto& [name, child] : children_) child->collect_trainable_copies(out);
}

void Module::release_parameter_storage() {
    ENGINE_CHECK(!any_parked(), "release_parameter_storage: the working copies are parked on the host "
                                "(park_working_copies); ZeRO-3 gathers a segment's copies itself");
    std::vector<Tensor> handles;
    collect_trainable_handles(handles);
    collect_trainable_copies(handles); // beside the masters (among the handles already) or apart
    release_storage(handles);
}

void Module::release_master_storage() {
    std::vector<Tensor> handles;
    collect_trainable_handles(handles);
    release_storage(handles);
}

void Module::allocate_parameter_storage() {
    std::vector<Tensor> handles;
    collect_trainable_handles(handles);
    allocate_storage(handles);
}

std::vector<Tensor> Module::gradient_handles() const {
    std::vector<Tensor> handles, out;
    collect_trainable_handles(handles);
    collect_trainable_copies(handles);
    for (const Tensor& handle : handles)
        if (handle.grad().defined()) out.push_back(handle.grad());
    return out;
}

void Module::release_gradient_storage() { release_storage(gradient_handles()); }

void Module::allocate_gradient_storage() {
    const std::vector<Tensor> buffers = gradient_handles();
    allocate_storage(buffers);
    for (const Tensor& buffer : buffers) Tensor(buffer).fill_zero(); // views of one storage: zeroed twice, harmlessly
}

void Module::allocate_working_storage() {
    std::vector<Tensor> copies;
    collect_trainable_copies(copies);
    allocate_storage(copies);
}

void Module::collect_working_storage(std::vector<Tensor>& out) const {
    for (const WorkingCopy& copy : working_copies_) {
        out.push_back(copy.working_storage);
        out.push_back(copy.working);
    }
    for (const auto& [name, child] : children_) child->collect_working_storage(out);
}

bool Module::any_parked() const {
    if (parked_) return true;
    for (const auto& [name, child] : children_)
        if (child->any_parked()) return true;
    return false;
}

void Module::set_streamed_placement(bool park, bool without_gradients, bool released) {
    ENGINE_CHECK(!master_device_, "set_streamed_placement: the masters are placed already (set_master_device); "
                                  "use park_working_copies and release_working_gradients");
    std::vector<Module*> tree;
    collect_modules(tree);
    for (Module* module : tree) {
        module->park_on_placement_ = park;
        module->no_gradients_on_placement_ = without_gradients;
        module->release_on_placement_ = released;
    }
}

void Module::park_working_copies() {
    ENGINE_CHECK(master_device_, "park_working_copies: the masters are not apart from the working copies "
                                 "(set_master_device): there is no host copy to stream from");
    if (parked_) return;
    std::vector<Tensor> working;
    collect_working_storage(working);
    // All or nothing; the gradients stay on the device.
    move_storage_to(working, *master_device_, false, MemoryCategory::pinned_host);
    std::vector<Module*> tree;
    collect_modules(tree);
    for (Module* module : tree) module->parked_ = true;
}

void Module::unpark_working_copies() {
    if (!parked_) return;
    release_fetched_copies();
    std::vector<Tensor> working;
    collect_working_storage(working);
    move_storage_to(working, compute_device_, false, MemoryCategory::parameters);
    std::vector<Module*> tree;
    collect_modules(tree);
    for (Module* module : tree) module->parked_ = false;
}

void Module::fetch_working_copies() {
    ENGINE_CHECK(parked_, "fetch_working_copies: the working copies are not parked (park_working_copies)");
    if (fetched_.active()) return fetched_.wait(); // prefetched: the compute stream waits for the copies
    std::vector<Tensor> working;
    collect_working_storage(working);
    fetched_ = StagedStorage(working, compute_device_, MemoryCategory::parameters);
}

void Module::prefetch_working_copies() {
    if (!parked_ || fetched_.active()) return;
    std::vector<Tensor> working;
    collect_working_storage(working);
    fetched_ = StagedStorage(working, compute_device_, MemoryCategory::parameters, true);
}

void Module::release_fetched_copies() { fetched_.restore(); }

} // namespace engine::nn
