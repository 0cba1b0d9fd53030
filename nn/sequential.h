// nn::Sequential: layers applied one after another, as torch.nn.Sequential. It owns them and registers them
// as "0", "1", ..., so their parameters are named "0.weight", "0.bias", "2.weight", ...
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "nn/layers.h"

namespace engine::nn {

// There is no constructor taking the layers: C++ leaves the order in which a call's arguments are evaluated
// unspecified, so Sequential(std::make_unique<Linear>(...), std::make_unique<Linear>(...)) could draw the two
// layers' streams in either order depending on the compiler. append and emplace build one layer at a time:
//   nn::Sequential model;
//   auto& hidden = model.emplace<nn::Linear>(4, 16);
//   model.emplace<nn::GELU>();
//   model.emplace<nn::Linear>(16, 2);
class Sequential : public Layer {
public:
    Sequential() = default;

    // Takes ownership and returns the layer with its own type; throws on null.
    template <typename LayerType>
    LayerType& append(std::unique_ptr<LayerType> layer) {
        ENGINE_CHECK(layer != nullptr, "Sequential::append: the layer is null");
        LayerType& appended = *layer;
        append_layer(std::move(layer));
        return appended;
    }
    template <typename LayerType, typename... Arguments>
    LayerType& emplace(Arguments&&... arguments) {
        return append(std::make_unique<LayerType>(std::forward<Arguments>(arguments)...));
    }

    size_t size() const { return layers_.size(); }
    Layer& operator[](size_t index) const; // throws out of range
    // Each layer's forward on the previous one's output; an empty Sequential returns its input, as PyTorch's.
    Tensor forward(const Tensor& input) const override;

private:
    void append_layer(std::unique_ptr<Layer> layer);
    std::vector<std::unique_ptr<Layer>> layers_;
};

} // namespace engine::nn
