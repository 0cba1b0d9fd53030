// Module bookkeeping: parameter registration, dotted names, zero_grad and train/eval mode.
#include "nn/module.h"

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

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
    for (const auto& [name, parameter] : parameters_) out.emplace_back(prefix + name, parameter);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
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

void Module::zero_grad() { engine::zero_grad(parameters()); }

size_t Module::parameter_count() const {
    size_t count = 0;
    for (auto& [name, parameter] : named_parameters()) count += static_cast<size_t>(parameter.numel());
    return count;
}

void Module::train(bool training) {
    training_ = training;
    for (auto& [name, child] : children_) child->train(training);
}

} // namespace engine::nn
