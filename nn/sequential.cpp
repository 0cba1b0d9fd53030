// nn::Sequential: ownership, PyTorch's index names, and the chained forward.
#include "nn/sequential.h"

#include <string>

namespace engine::nn {

void Sequential::append_layer(std::unique_ptr<Layer> layer) {
    layers_.push_back(std::move(layer));
    register_module(std::to_string(layers_.size() - 1), *layers_.back());
}

Layer& Sequential::operator[](size_t index) const {
    ENGINE_CHECK(index < layers_.size(), "Sequential: index " << index << " with " << layers_.size() << " layers");
    return *layers_[index];
}

Tensor Sequential::forward(const Tensor& input) const {
    Tensor x = input;
    for (const std::unique_ptr<Layer>& layer : layers_) x = layer->forward(x);
    return x;
}

} // namespace engine::nn
