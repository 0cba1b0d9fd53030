// The optimizers' update kernels behind tensors: range and device checks, then one dispatch per update.
#include "engine/optimizer_updates.h"

#include "engine/dispatch.h"

namespace engine {
using namespace detail;
namespace {

// The parameter's range [first, first + count), the gradient's [gradient_first, gradient_first + count) and every
// state tensor: one device, one dtype, state of `count` elements. Checked before any kernel runs, so a bad call
// changes nothing.
void check_update(const char* op, const Tensor& parameter, const Tensor& gradient, int64_t gradient_first,
                  std::initializer_list<const Tensor*> states, int64_t first, int64_t count) {
    ENGINE_CHECK(parameter.defined() && gradient.defined(), op << ": parameter and gradient must be defined");
    ENGINE_CHECK(is_floating(parameter.dtype()), op << ": parameter " << parameter.describe() << " is not floating");
    ENGINE_CHECK(gradient_first >= 0 && count >= 0 && gradient_first + count <= gradient.numel(),
                 op << ": gradient elements [" << gradient_first << ", " << gradient_first + count << ") are outside "
                    << gradient.describe() << " (parameter " << parameter.describe() << ")");
    ENGINE_CHECK(first >= 0 && count >= 0 && first + count <= parameter.numel(),
                 op << ": range [" << first << ", " << first + count << ") is outside parameter "
                    << parameter.describe());
    check_same_device(op, parameter, gradient);
    check_same_dtype(op, parameter, gradient);
    for (const Tensor* state : states) {
        ENGINE_CHECK(state->defined() && state->numel() == count,
                     op << ": state " << (state->defined() ? state->describe() : std::string("none")) << " must hold "
                        << count << " elements");
        check_same_device(op, parameter, *state);
        check_same_dtype(op, parameter, *state);
    }
}

} // namespace

void adamw_update(const Tensor& parameter, const Tensor& gradient, int64_t gradient_first, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, int64_t first, int64_t count, const AdamWUpdate& update) {
    constexpr const char* op = "adamw";
    check_update(op, parameter, gradient, gradient_first, {&exp_avg, &exp_avg_sq}, first, count);
    if (count == 0) return;
    const AdamWUpdate& u = update;
    if (parameter.device() == Device::cpu) {
        dispatch_floating(op, parameter.dtype(), [&]<typename T>() {
            kernels::cpu::adamw_update<T>(parameter.data<T>() + first, gradient.data<T>() + gradient_first, exp_avg.data<T>(),
                                          exp_avg_sq.data<T>(), count, u.learning_rate, u.beta1, u.beta2, u.epsilon,
                                          u.weight_decay, u.bias_correction1, u.bias_correction2, u.grad_scale);
        });
    } else {
        ENGINE_ON_CUDA(op, parameter.dtype(),
                       kernels::cuda::adamw_update(parameter.data<float>() + first, gradient.data<float>() + gradient_first,
                                                   exp_avg.data<float>(), exp_avg_sq.data<float>(), count,
                                                   u.learning_rate, u.beta1, u.beta2, u.epsilon, u.weight_decay,
                                                   u.bias_correction1, u.bias_correction2, u.grad_scale,
                                                   cuda::compute_stream()));
    }
}

void adamw_update(const std::vector<AdamWRange>& ranges, const AdamWUpdate& update, bool zero_gradients) {
    constexpr const char* op = "adamw";
    if (ranges.empty()) return;
    for (const AdamWRange& range : ranges) {
        check_update(op, range.parameter, range.gradient, range.gradient_first, {&range.exp_avg, &range.exp_avg_sq},
                     range.first, range.count);
        check_same_device(op, ranges.front().parameter, range.parameter);
        check_same_dtype(op, ranges.front().parameter, range.parameter);
        if (!range.working_copy.defined()) continue;
        ENGINE_CHECK(range.working_copy.dtype() == DType::bf16 && range.working_copy.device() == range.parameter.device() &&
                         range.first + range.count <= range.working_copy.numel(),
                     op << ": working copy " << range.working_copy.describe() << " of parameter "
                        << range.parameter.describe() << " must be bf16 on its device and hold its elements ["
                        << range.first << ", " << range.first + range.count << ")");
    }
    const AdamWUpdate& u = update;
    const auto listed = [&]<typename T>() {
        std::vector<kernels::AdamWTensor<T>> tensors;
        tensors.reserve(ranges.size());
        for (const AdamWRange& range : ranges)
            tensors.push_back({range.parameter.data<T>() + range.first, range.gradient.data<T>() + range.gradient_first,
                               range.exp_avg.data<T>(), range.exp_avg_sq.data<T>(),
                               range.working_copy.defined() ? range.working_copy.data<bfloat16>() + range.first : nullptr,
                               range.count, range.decays ? u.weight_decay : 0.0f});
        return tensors;
    };
    if (ranges.front().parameter.device() == Device::cpu) {
        dispatch_floating(op, ranges.front().parameter.dtype(), [&]<typename T>() {
            const std::vector<kernels::AdamWTensor<T>> tensors = listed.template operator()<T>();
            kernels::cpu::adamw_update_list<T>(tensors.data(), static_cast<int>(tensors.size()), zero_gradients,
                                               u.learning_rate, u.beta1, u.beta2, u.epsilon, u.bias_correction1,
                                               u.bias_correction2, u.grad_scale);
        });
    } else {
        ENGINE_ON_CUDA(op, ranges.front().parameter.dtype(), {
            const std::vector<kernels::AdamWTensor<float>> tensors = listed.template operator()<float>();
            kernels::cuda::adamw_update_list(tensors.data(), static_cast<int>(tensors.size()), zero_gradients,
                                             u.learning_rate, u.beta1, u.beta2, u.epsilon, u.bias_correction1,
                                             u.bias_correction2, u.grad_scale, cuda::compute_stream());
        });
    }
}

void sgd_update(const Tensor& parameter, const Tensor& gradient, int64_t gradient_first, const Tensor& momentum_buffer,
                int64_t first, int64_t count, const SGDUpdate& update) {
    constexpr const char* op = "sgd";
    check_update(op, parameter, gradient, gradient_first, {&momentum_buffer}, first, count);
    if (count == 0) return;
    const SGDUpdate& u = update;
    if (parameter.device() == Device::cpu) {
        dispatch_floating(op, parameter.dtype(), [&]<typename T>() {
            kernels::cpu::sgd_update<T>(parameter.data<T>() + first, gradient.data<T>() + gradient_first,
                                        momentum_buffer.data<T>(), count, u.learning_rate, u.momentum,
                                        u.weight_decay, u.grad_scale);
        });
    } else {
        ENGINE_ON_CUDA(op, parameter.dtype(),
                       kernels::cuda::sgd_update(parameter.data<float>() + first, gradient.data<float>() + gradient_first,
                                                 momentum_buffer.data<float>(), count, u.learning_rate, u.momentum,
                                                 u.weight_decay, u.grad_scale, cuda::compute_stream()));
    }
}

} // namespace engine
