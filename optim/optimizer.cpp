// SGD and AdamW: state allocation, decay grouping and the per-parameter dispatch to the update kernels.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "engine/ops.h"
#include "engine/optimizer_updates.h"
#include "optim/schedule.h"

namespace engine::optim {
namespace {

// The options' rule shared by SGD and AdamW: a weight decay finite and >= 0.
std::optional<ConfigProblem> weight_decay_problem(double weight_decay) {
    if (std::isfinite(weight_decay) && weight_decay >= 0.0) return std::nullopt;
    return ConfigProblem{"weight_decay", "must be finite and >= 0, got " + value_text(weight_decay)};
}

// The options, or the constructor's one error naming the optimizer and the field.
template <typename Options>
const Options& checked(const char* optimizer, const Options& options) {
    if (const std::optional<ConfigProblem> found = options.problem())
        ENGINE_FAIL(optimizer << ": " << found->field << " " << found->reason);
    return options;
}

} // namespace

std::optional<ConfigProblem> SGDOptions::problem() const {
    if (const std::optional<std::string> reason = learning_rate_problem(learning_rate))
        return ConfigProblem{"learning_rate", *reason};
    if (!(std::isfinite(momentum) && momentum >= 0.0))
        return ConfigProblem{"momentum", "must be finite and >= 0, got " + value_text(momentum)};
    return weight_decay_problem(weight_decay);
}

std::optional<ConfigProblem> AdamWOptions::problem() const {
    if (const std::optional<std::string> reason = learning_rate_problem(learning_rate))
        return ConfigProblem{"learning_rate", *reason};
    if (!(beta1 >= 0.0 && beta1 < 1.0)) return ConfigProblem{"beta1", "must be in [0,1), got " + value_text(beta1)};
    if (!(beta2 >= 0.0 && beta2 < 1.0)) return ConfigProblem{"beta2", "must be in [0,1), got " + value_text(beta2)};
    if (!(std::isfinite(epsilon) && epsilon > 0.0))
        return ConfigProblem{"epsilon", "must be finite and > 0, got " + value_text(epsilon)};
    return weight_decay_problem(weight_decay);
}

bool decay_matrices_only(const std::string&, const Tensor& parameter) { return parameter.dim() >= 2; }

Optimizer::Optimizer(const NamedTensors& named_parameters, double learning_rate, double weight_decay,
                     const DecayRule& decays, int state_tensors_per_parameter, ShardRange shard)
    : learning_rate_(learning_rate), weight_decay_(weight_decay) {
    ENGINE_CHECK(shard.begin >= 0 && shard.begin <= shard.end,
                 "optimizer: shard [" << shard.begin << ", " << shard.end << ") is not a range of elements");
    ENGINE_CHECK(!named_parameters.empty(), "optimizer: no parameters to optimise");
    for (const auto& [name, parameter] : named_parameters) {
        ENGINE_CHECK(parameter.defined() && parameter.is_leaf() && parameter.grad().defined(),
                     "optimizer: parameter '" << name << "' is not a leaf with a gradient buffer");
        ENGINE_CHECK(parameter.dtype() != DType::i32, "optimizer: parameter '" << name << "' is an integer tensor");
    }
    // Allocate after every check so that a bad parameter list leaves no state behind.
    int64_t offset = 0; // of this parameter among all of them laid end to end
    for (const auto& [name, parameter] : named_parameters) {
        Slot slot;
        slot.name = name;
        slot.parameter = parameter;
        slot.decays = decays ? decays(name, parameter) : false;
        const int64_t first = std::max(offset, shard.begin), last = std::min(offset + parameter.numel(), shard.end);
        slot.shard_begin = first - offset;
        slot.shard_count = std::max<int64_t>(0, last - first);
        slot.range_offset = slot.shard_count > 0 ? first - shard.begin : 0;
        range_elements_ += slot.shard_count;
        const bool whole = slot.shard_count == parameter.numel();
        sharded_ = sharded_ || !whole;
        offset += parameter.numel();
        for (int index = 0; index < state_tensors_per_parameter && slot.shard_count > 0; ++index)
            slot.state.push_back(Tensor::zeros(whole ? parameter.shape() : Shape{slot.shard_count}, parameter.dtype(),
                                               parameter.device(), MemoryCategory::optimizer_state));
        slots_.push_back(std::move(slot));
    }
}

void Optimizer::check_state_devices(const char* optimizer) const {
    for (const Slot& slot : slots_)
        for (const Tensor& state : slot.state)
            ENGINE_CHECK(state.device() == slot.parameter.device(),
                         optimizer << ": parameter '" << slot.name << "' is on " << device_name(slot.parameter.device())
                                   << " but its state on " << device_name(state.device())
                                   << ": the model was moved (Module::to) after the optimizer was built; build "
                                      "the optimizer after to()");
}

void Optimizer::zero_grad() {
    for (const Slot& slot : slots_) // a released buffer (ZeRO-3's tables between uses) holds nothing to zero
        if (slot.parameter.grad().defined() && !slot.parameter.grad().storage_released()) slot.parameter.grad().fill_zero();
}

void Optimizer::read_gradients_from(const Tensor& gradients) {
    ENGINE_CHECK(!epilogue_, "optimizer: the step's epilogue (set_step_epilogue) writes whole tensors, and a range's "
                             "gradients are a rank's part");
    ENGINE_CHECK(gradients.defined() && gradients.dim() == 1 && gradients.numel() >= range_elements_,
                 "optimizer: the range's gradients must be 1-D and hold its " << range_elements_ << " elements, got "
                     << (gradients.defined() ? gradients.describe() : std::string("none")));
    for (const Slot& slot : slots_)
        ENGINE_CHECK(gradients.device() == slot.parameter.device() &&
                         gradients.dtype() == compute_dtype(slot.parameter.dtype()),
                     "optimizer: the range's gradients " << gradients.describe() << " are not where parameter '"
                                                         << slot.name << "' " << slot.parameter.describe() << " is");
    range_gradients_ = gradients;
}

void Optimizer::write_parameters_in(const Tensor& parameters, const std::vector<int64_t>& offsets) {
    ENGINE_CHECK(!epilogue_, "optimizer: the step's epilogue (set_step_epilogue) writes whole tensors, and a range's "
                             "parameters are a rank's part");
    ENGINE_CHECK(offsets.size() == slots_.size(),
                 "optimizer: " << offsets.size() << " parameter offsets for " << slots_.size() << " parameters");
    for (size_t index = 0; index < slots_.size(); ++index) {
        const Slot& slot = slots_[index];
        if (offsets[index] < 0 || slot.shard_count == 0) continue;
        ENGINE_CHECK(parameters.defined() && parameters.dim() == 1 && offsets[index] + slot.shard_count <= parameters.numel() &&
                         parameters.device() == slot.parameter.device() && parameters.dtype() == slot.parameter.dtype(),
                     "optimizer: parameter '" << slot.name << "' " << slot.parameter.describe() << ": its "
                         << slot.shard_count << " elements from element " << offsets[index] << " are not in "
                         << (parameters.defined() ? parameters.describe() : std::string("none")));
    }
    range_parameters_ = parameters;
    parameter_offsets_ = offsets;
}

void Optimizer::set_step_epilogue(const std::vector<Tensor>& parameters, const std::vector<Tensor>& working_copies,
                                  bool zero_gradients) {
    ENGINE_CHECK(!sharded_ && !range_gradients_.defined() && parameter_offsets_.empty(),
                 "optimizer: the step's epilogue writes whole tensors, and this optimizer updates a rank's part (ZeRO)");
    ENGINE_CHECK(parameters.size() == slots_.size() && working_copies.size() == slots_.size(),
                 "optimizer: the step's epilogue needs one parameter and one working copy (or none) for each of its "
                     << slots_.size() << " parameters, got " << parameters.size() << " and " << working_copies.size());
    for (size_t index = 0; index < slots_.size(); ++index) {
        const Slot& slot = slots_[index];
        for (size_t earlier = 0; earlier < index; ++earlier)
            ENGINE_CHECK(slots_[earlier].parameter.raw_data() != slot.parameter.raw_data() ||
                             slot.parameter.numel() == 0,
                         "optimizer: parameters '" << slots_[earlier].name << "' and '" << slot.name
                             << "' are one tensor: the step's epilogue would zero its gradient while reading it");
        ENGINE_CHECK(parameters[index].defined() && parameters[index].raw_data() == slot.parameter.raw_data() &&
                         parameters[index].numel() == slot.parameter.numel(),
                     "optimizer: the step's epilogue lists " << (parameters[index].defined() ? parameters[index].describe()
                                                                                          : std::string("none"))
                         << " where parameter '" << slot.name << "' " << slot.parameter.describe() << " is");
        const Tensor& copy = working_copies[index];
        ENGINE_CHECK(!copy.defined() || (copy.dtype() == DType::bf16 && copy.device() == slot.parameter.device() &&
                                         copy.numel() == slot.parameter.numel() &&
                                         !copy.shares_storage_with(slot.parameter)),
                     "optimizer: working copy " << (copy.defined() ? copy.describe() : std::string("none"))
                         << " of parameter '" << slot.name << "' " << slot.parameter.describe()
                         << " must be a bf16 tensor of its size on its device, apart from it");
    }
    epilogue_ = true;
    working_copies_ = working_copies;
    zero_gradients_in_step_ = zero_gradients;
}

void Optimizer::run_step_epilogue() const {
    if (!epilogue_) return;
    for (size_t index = 0; index < slots_.size(); ++index) {
        if (working_copies_[index].defined()) convert_into(working_copies_[index], slots_[index].parameter);
        if (zero_gradients_in_step_) slots_[index].parameter.grad().fill_zero();
    }
}

std::pair<Tensor, int64_t> Optimizer::parameter_of(const Slot& slot) const {
    const size_t index = static_cast<size_t>(&slot - slots_.data());
    if (!parameter_offsets_.empty() && parameter_offsets_[index] >= 0) return {range_parameters_, parameter_offsets_[index]};
    return {slot.parameter, slot.shard_begin};
}

std::pair<Tensor, int64_t> Optimizer::gradient_of(const Slot& slot) const {
    if (range_gradients_.defined()) return {range_gradients_, slot.range_offset};
    return {slot.parameter.grad(), slot.shard_begin};
}

void Optimizer::set_learning_rate(double learning_rate) {
    if (const std::optional<std::string> reason = learning_rate_problem(learning_rate))
        ENGINE_FAIL("optimizer: learning rate " << *reason);
    learning_rate_ = learning_rate;
}

void Optimizer::set_step_count(int64_t step_count) {
    ENGINE_CHECK(step_count >= 0, "optimizer: step count must be >= 0, got " << step_count);
    step_count_ = step_count;
}

std::vector<Optimizer::StateShard> Optimizer::state_shards() const {
    const NamedTensors named = named_state();
    std::vector<StateShard> shards;
    size_t index = 0;
    for (const Slot& slot : slots_)
        for (const Tensor& state : slot.state) {
            // named_state() lists each slot's state tensors in slot order; check that it still does.
            ENGINE_CHECK(index < named.size() && named[index].second.raw_data() == state.raw_data(),
                         "optimizer: named_state() does not list the state of '" << slot.name << "' in slot order");
            shards.push_back({named[index++].first, state, slot.parameter, slot.shard_begin});
        }
    return shards;
}

std::vector<std::string> Optimizer::parameter_names() const {
    std::vector<std::string> names;
    for (const Slot& slot : slots_) names.push_back(slot.name);
    return names;
}

bool Optimizer::decays(const std::string& parameter_name) const {
    for (const Slot& slot : slots_)
        if (slot.name == parameter_name) return slot.decays;
    ENGINE_FAIL("optimizer: no parameter named '" << parameter_name << "'");
}

// ---- SGD ----

SGD::SGD(const NamedTensors& named_parameters, const SGDOptions& options, const DecayRule& decays, ShardRange shard)
    : Optimizer(named_parameters, checked("SGD", options).learning_rate, options.weight_decay, decays, 1, shard),
      momentum_(options.momentum) {}

void SGD::step(double grad_scale) {
    const float lr = static_cast<float>(learning_rate_);
    const float momentum = static_cast<float>(momentum_);
    const float scale = static_cast<float>(grad_scale);
    check_state_devices("SGD");
    for (const Slot& slot : slots_) {
        if (slot.shard_count == 0) continue; // another rank's parameter
        const float decay = slot.decays ? static_cast<float>(weight_decay_) : 0.0f;
        const auto [gradient, gradient_first] = gradient_of(slot);
        const auto [parameter, first] = parameter_of(slot);
        sgd_update(parameter, gradient, gradient_first, slot.state[0], first, slot.shard_count,
                   SGDUpdate{lr, momentum, decay, scale});
    }
    run_step_epilogue();
    ++step_count_;
}

NamedTensors SGD::named_state() const {
    NamedTensors state;
    for (const Slot& slot : slots_)
        if (!slot.state.empty()) state.emplace_back("momentum_buffer." + slot.name, slot.state[0]);
    return state;
}

// ---- AdamW ----

AdamW::AdamW(const NamedTensors& named_parameters, const AdamWOptions& options, const DecayRule& decays,
             ShardRange shard)
    : Optimizer(named_parameters, checked("AdamW", options).learning_rate, options.weight_decay, decays, 2, shard),
      options_(options) {}

void AdamW::step(double grad_scale) {
    const int64_t t = step_count_ + 1;
    // The corrections are computed in double and rounded once; the kernels take float hyperparameters.
    const float bias_correction1 = static_cast<float>(1.0 - std::pow(options_.beta1, static_cast<double>(t)));
    const float bias_correction2 = static_cast<float>(1.0 - std::pow(options_.beta2, static_cast<double>(t)));
    const float lr = static_cast<float>(learning_rate_);
    const float beta1 = static_cast<float>(options_.beta1);
    const float beta2 = static_cast<float>(options_.beta2);
    const float epsilon = static_cast<float>(options_.epsilon);
    const float scale = static_cast<float>(grad_scale);
    check_state_devices("AdamW");
    // Every part in one multi-tensor update (a launch per 64 on CUDA), in runs of one device and dtype.
    const AdamWUpdate update{lr, beta1, beta2, epsilon, static_cast<float>(weight_decay_), bias_correction1,
                             bias_correction2, scale};
    std::vector<AdamWRange> ranges;
    for (size_t index = 0; index < slots_.size(); ++index) {
        const Slot& slot = slots_[index];
        if (slot.shard_count == 0) continue; // another rank's parameter
        const auto [gradient, gradient_first] = gradient_of(slot);
        const auto [parameter, first] = parameter_of(slot);
        if (!ranges.empty() && (ranges.back().parameter.device() != parameter.device() ||
                                ranges.back().parameter.dtype() != parameter.dtype())) {
            adamw_update(ranges, update, zero_gradients_in_step_);
            ranges.clear();
        }
        ranges.push_back({parameter, first, gradient, gradient_first, slot.state[0], slot.state[1], slot.shard_count,
                          slot.decays, epilogue_ ? working_copies_[index] : Tensor()});
    }
    adamw_update(ranges, update, zero_gradients_in_step_);
    step_count_ = t;
}

NamedTensors AdamW::named_state() const {
    NamedTensors state;
    for (const Slot& slot : slots_) {
        if (slot.state.empty()) continue; // another rank's parameter
        state.emplace_back("exp_avg." + slot.name, slot.state[0]);
        state.emplace_back("exp_avg_sq." + slot.name, slot.state[1]);
    }
    return state;
}

} // namespace engine::optim
