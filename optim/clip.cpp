// Global gradient norm over all parameter gradients and the clip coefficient.
#include "optim/clip.h"

#include <cmath>

#include "engine/elementwise.h"
#include "engine/profiling.h"

namespace engine::optim {

double global_grad_norm(const std::vector<Tensor>& parameters) {
    const profiling::PhaseScope phase(profiling::Phase::grad_norm); // for callers outside the trainer too
    std::vector<Tensor> gradients;
    gradients.reserve(parameters.size());
    for (const Tensor& parameter : parameters) {
        gradients.push_back(parameter.grad());
        ENGINE_CHECK(gradients.back().defined(), "clip: parameter " << parameter.describe() << " has no gradient buffer");
    }
    return std::sqrt(sum_of_squares(gradients)); // one launch list and one device read for the whole model
}

double clip_coefficient(double norm, double max_norm) {
    if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
    return max_norm / (norm + clip_epsilon);
}

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
    const double norm = global_grad_norm(parameters);
    const double coefficient = clip_coefficient(norm, max_norm);
    const profiling::PhaseScope phase(profiling::Phase::grad_norm);
    if (coefficient != 1.0)
        for (const Tensor& parameter : parameters) scale_in_place(parameter.grad(), coefficient);
    return norm;
}

} // namespace engine::optim
