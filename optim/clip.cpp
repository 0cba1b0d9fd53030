// Global gradient norm over all parameter gradients and the clip coefficient.
#include "optim/clip.h"

#include <cmath>

#include "engine/elementwise.h"

namespace engine::optim {

double global_grad_norm(const std::vector<Tensor>& parameters) {
    double total = 0.0;
    for (const Tensor& parameter : parameters) {
        const Tensor gradient = parameter.grad();
        ENGINE_CHECK(gradient.defined(), "clip: parameter " << parameter.describe() << " has no gradient buffer");
        total += sum_of_squares(gradient);
    }
    return std::sqrt(total);
}

double clip_coefficient(double norm, double max_norm) {
    if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
    return max_norm / (norm + clip_epsilon);
}

double clip_grad_norm(const std::vector<Tensor>& parameters, double max_norm) {
    const double norm = global_grad_norm(parameters);
    const double coefficient = clip_coefficient(norm, max_norm);
    if (coefficient != 1.0)
        for (const Tensor& parameter : parameters) scale_in_place(parameter.grad(), coefficient);
    return norm;
}

} // namespace engine::optim
