// Module: a named tree of parameters. Names are stable ("h.0.attn.c_attn.weight") and are what
// safetensors files and training-state files key on.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

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
    void zero_grad(); // memset of every gradient buffer; never frees
    size_t parameter_count() const;
    // Train mode turns dropout on.
    void train(bool training = true);
    bool training() const { return training_; }

protected:
    // Creates a leaf parameter (category parameters) with its gradient buffer allocated once.
    Tensor register_parameter(const std::string& name, const Tensor& initial);
    void register_module(const std::string& name, Module& child);

private:
    void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
    std::vector<std::pair<std::string, Tensor>> parameters_;
    std::vector<std::pair<std::string, Module*>> children_;
    bool training_ = true;
};

} // namespace engine::nn
