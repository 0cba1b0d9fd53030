// The trainer's hooks on a causal LM's checkpointed segments: streamed gradients and parameters (the model state off
// the device), ZeRO-2's reduction of a segment's gradients as its backward ends, and ZeRO-3's gathering of a segment's
// weights before each use; and the gathers outside a step that stage 3 needs (a save, a resume).
#include <algorithm>

#include "engine/autograd.h"
#include "engine/elementwise.h"
#include "optim/module_trainer.h"

namespace engine::optim {
namespace {

// What streams, in forward order: the checkpointed segments, and their layers.
std::vector<checkpoint::Segment> checkpointed_segments(const nn::CausalLM& model) {
    std::vector<checkpoint::Segment> out;
    for (const checkpoint::Segment& segment : model.segments())
        if (segment.checkpointed) out.push_back(segment);
    return out;
}

std::vector<int> layers_of(const std::vector<checkpoint::Segment>& segments) {
    std::vector<int> out;
    for (const checkpoint::Segment& segment : segments)
        for (int layer = segment.first_layer; layer < segment.first_layer + segment.layer_count; ++layer) out.push_back(layer);
    return out;
}

} // namespace

void mark_streamed_layers(nn::Module& model, const StepShape& shape, bool parameters_sharded) {
    auto* layered = dynamic_cast<nn::CausalLM*>(&model);
    const bool park = shape.offload_optimizer && shape.offload_parameters;
    const bool without_gradients = shape.offload_optimizer && shape.offload_gradients == GradientOffload::stream;
    const bool released = shape.offload_optimizer && shape.zero_stage == 3 && parameters_sharded;
    if (layered == nullptr || !(park || without_gradients || released)) return;
    for (int layer : layers_of(checkpointed_segments(*layered)))
        layered->block(layer).set_streamed_placement(park, without_gradients, released);
}

void ModuleTrainer::start_streaming() {
    nn::CausalLM* layered = dynamic_cast<nn::CausalLM*>(&model_); // checked by the constructor
    std::vector<checkpoint::Segment> segments = checkpointed_segments(*layered);
    std::vector<int> layers = layers_of(segments);
    // ZeRO-2: each segment's parameters by their index among the trainer's (the shards' order), for its reduction,
    // and the rest, reduced at the step; made before anything is released, so that a failure here changes nothing.
    std::map<int, std::vector<size_t>> segment_parameters;
    std::vector<size_t> whole_gradient_indexes;
    if (gradients_sharded()) {
        std::vector<bool> in_segment(parameters_.size(), false);
        for (const checkpoint::Segment& segment : segments) {
            std::vector<size_t>& indexes = segment_parameters[segment.first_layer];
            for (int layer = segment.first_layer; layer < segment.first_layer + segment.layer_count; ++layer)
                for (const Tensor& parameter : layered->block(layer).parameters())
                    for (size_t index = 0; index < parameters_.size(); ++index) {
                        if (!parameters_[index].shares_storage_with(parameter)) continue;
                        // A parameter in two places would be reduced twice.
                        ENGINE_CHECK(!in_segment[index], "trainer: zero_stage " << config_.shape.zero_stage << ": parameter '"
                                                             << optimizer_->parameter_names()[index]
                                                             << "' belongs to two checkpointed layers");
                        in_segment[index] = true;
                        indexes.push_back(index);
                    }
            std::sort(indexes.begin(), indexes.end());
        }
        for (size_t index = 0; index < parameters_.size(); ++index)
            if (!in_segment[index]) whole_gradient_indexes.push_back(index);
    }
    // ZeRO-2 and 3 with the state on the device: the token table and an untied head have their gradients sharded too
    // (stage 3: and their weights). A tied head is the table.
    nn::Module* token_table = nullptr;
    nn::Module* head = nullptr;
    std::vector<size_t> token_table_indexes, head_indexes;
    if (gradients_sharded() && !offloaded() && layered->token_table() != nullptr) {
        token_table = layered->token_table();
        head = layered->untied_head();
        const auto indexes_of = [&](const nn::Module& module) {
            std::vector<size_t> out;
            for (const Tensor& parameter : module.parameters())
                for (size_t index = 0; index < parameters_.size(); ++index)
                    if (parameters_[index].shares_storage_with(parameter)) out.push_back(index);
            std::sort(out.begin(), out.end());
            return out;
        };
        token_table_indexes = indexes_of(*token_table);
        if (head != nullptr) head_indexes = indexes_of(*head);
        // A frozen table or head (no index) stays whole: it has no shard, no gradient and nothing to reduce.
        if (token_table_indexes.empty() || (head != nullptr && head_indexes.empty())) token_table = head = nullptr;
    }
    if (parameters_sharded()) {
        // ZeRO-3: the segments' masters (and the tables') kept as each rank's part only, which the optimizer updates
        // there.
        std::vector<size_t> released;
        for (const auto& [first_layer, indexes] : segment_parameters)
            released.insert(released.end(), indexes.begin(), indexes.end());
        if (token_table != nullptr) {
            released.insert(released.end(), token_table_indexes.begin(), token_table_indexes.end());
            released.insert(released.end(), head_indexes.begin(), head_indexes.end());
            std::sort(released.begin(), released.end());
        }
        zero_->keep_shards_of(released);
        // Their dotted names, so that a read of one while it is released names it in the model.
        const std::vector<std::string> names = optimizer_->parameter_names();
        for (size_t index : released) { // and what the forward reads of them (a working copy, the master in f32)
            parameters_[index].set_name(names[index]);
            gradient_leaves_[index].set_name(names[index]);
        }
        optimizer_->write_parameters_in(zero_->shard_parameters(), zero_->parameter_offsets());
        released_indexes_ = std::move(released);
    }
    if (parameters_streamed()) {
        // Parked on the host, where the update refreshes them; all or nothing.
        size_t parked = 0;
        try {
            for (; parked < layers.size(); ++parked) layered->block(layers[parked]).park_working_copies();
        } catch (...) {
            for (size_t index = 0; index < parked; ++index) {
                try {
                    layered->block(layers[index]).unpark_working_copies();
                } catch (...) {
                }
            }
            throw;
        }
    }
    // Nothing below throws.
    layered_ = layered;
    streamed_layers_ = std::move(layers);
    streamed_segments_ = std::move(segments);
    if (gradients_sharded()) {
        // The segments' layers' buffers go until each segment's recompute (the masters' side, with them apart).
        segment_parameters_ = std::move(segment_parameters);
        whole_gradient_indexes_ = std::move(whole_gradient_indexes);
        for (int layer : streamed_layers_) layered_->block(layer).release_gradients();
    }
    if (parameters_sharded()) // their values are the shards' now (keep_shards_of): the storage goes
        for (int layer : streamed_layers_) layered_->block(layer).release_parameter_storage();
    if (token_table != nullptr) {
        token_table_ = token_table;
        head_ = head;
        token_table_indexes_ = std::move(token_table_indexes);
        head_indexes_ = std::move(head_indexes);
        // Reduced once per micro-batch as their backward ends (and at stage 3 gathered for each use): not at the step.
        std::erase_if(whole_gradient_indexes_, [&](size_t index) {
            return std::find(token_table_indexes_.begin(), token_table_indexes_.end(), index) != token_table_indexes_.end() ||
                   std::find(head_indexes_.begin(), head_indexes_.end(), index) != head_indexes_.end();
        });
        release_tables(); // their gradient buffers' storage, and at stage 3 their weights
        // Stage 3: the table is gathered for its lookup and goes right after it (its backward, a scatter-add, never reads
        // it). Its gradient storage comes just before that backward (a tied table's came with the head, and stays), and
        // is reduced once backward() returns (accumulate).
        // Inside optim::WholeParameters the weights are whole already: the hooks leave them so.
        layered_->set_table_hooks({[this] {
                                       if (table_weights_released() && whole_scopes_ == 0)
                                           gather_table(*token_table_, token_table_indexes_);
                                   },
                                   [this](const Tensor& looked_up) {
                                       if (table_weights_released() && whole_scopes_ == 0)
                                           token_table_->release_parameter_storage();
                                       if (head_ == nullptr) return looked_up;
                                       return on_backward(looked_up, [this] { token_table_->allocate_gradient_storage(); });
                                   },
                                   [this](const Tensor& hidden) { return gather_head(hidden); },
                                   [this] { release_head_after_no_grad(); }});
    }
    if (streamed()) {
        for (int layer : streamed_layers_) layered_->block(layer).release_working_gradients();
        for (size_t index = 0; index < gradient_leaves_.size(); ++index)
            streamed_leaves_[index] = !gradient_leaves_[index].grad().defined();
    }
    layered_->set_segment_hooks([this](int first_layer, int layer_count) {
        checkpoint::SegmentHooks hooks;
        // Streamed parameters: the next segment to run (in forward order during the forward, in backward order
        // during the backward) is prefetched on the copy stream while this one computes.
        if (parameters_streamed()) {
            hooks.before_forward = [this, first_layer, layer_count] {
                fetch_segment(first_layer, layer_count);
                prefetch_neighbour(first_layer, +1);
            };
            hooks.after_forward = [this, first_layer, layer_count] { release_segment(first_layer, layer_count); };
        }
        // ZeRO-3: the segment's weights from their owners for its forward, and again for its recompute and backward.
        // Inside optim::WholeParameters (a forward between steps: sampling) the weights are whole already.
        if (parameters_sharded()) {
            hooks.before_forward = [this, first_layer, layer_count] {
                if (whole_scopes_ == 0) gather_segment(first_layer, layer_count);
            };
            hooks.after_forward = [this, first_layer, layer_count] {
                if (whole_scopes_ == 0) release_segment_parameters(first_layer, layer_count);
            };
        }
        hooks.before_recompute = [this, first_layer, layer_count] {
            if (parameters_sharded()) gather_segment(first_layer, layer_count);
            if (parameters_streamed()) {
                fetch_segment(first_layer, layer_count);
                prefetch_neighbour(first_layer, -1);
            }
            if (streamed()) attach_segment_gradients(first_layer, layer_count);
            if (gradients_sharded() && !offloaded())
                for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
                    layered_->block(layer).attach_gradients();
        };
        hooks.after_backward = [this, first_layer, layer_count] {
            if (streamed()) stream_segment_gradients(first_layer, layer_count);
            if (gradients_sharded() && !offloaded()) {
                // This micro-batch's gradients of the segment, summed onto their owners; the buffers go.
                zero_->reduce_gradients(segment_parameters_.at(first_layer));
                for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
                    layered_->block(layer).release_gradients();
            }
            if (parameters_streamed()) release_segment(first_layer, layer_count);
            if (parameters_sharded()) release_segment_parameters(first_layer, layer_count);
        };
        return hooks;
    });
}

void ModuleTrainer::gather_segment(int first_layer, int layer_count) {
    // A layer allocated but not gathered (a failure part way) is released again by the hook that follows a failure
    // (after_forward, or the window's zero_gradients).
    if (!offloaded() && model_.compute_dtype() != parameters_.front().dtype()) {
        // bf16 copies beside the masters: the forward reads only them, so only they get storage, each owner rounding
        // its part into them before the broadcast (half a master's bytes travel; the masters stay released).
        for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
            layered_->block(layer).allocate_working_storage();
        return zero_->gather_rounded(segment_parameters_.at(first_layer), gradient_leaves_);
    }
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
        layered_->block(layer).allocate_parameter_storage();
    zero_->gather_parameters(segment_parameters_.at(first_layer));
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer) {
        nn::Module& block = layered_->block(layer);
        // With the model state on the host the masters were gathered there: the device copies are made from them
        // (rounded on the host for bf16, as the update's refresh does), and the host's whole masters go again.
        if (offloaded()) block.allocate_working_storage();
        block.refresh_working_copies(); // bf16: rounded from the gathered masters
        if (offloaded()) block.release_master_storage();
    }
}

void ModuleTrainer::gather_table(nn::Module& table, const std::vector<size_t>& indexes) {
    // As a segment's: under bf16 the copies alone, rounded by their owners; else the masters. Storage allocated but not
    // gathered (a failure part way) is released again by what follows a failure (release_tables).
    if (model_.compute_dtype() != parameters_.front().dtype()) {
        table.allocate_working_storage();
        return zero_->gather_rounded(indexes, gradient_leaves_);
    }
    table.allocate_parameter_storage();
    zero_->gather_parameters(indexes);
}

void ModuleTrainer::release_tables() {
    if (!table_gradients_sharded()) return;
    for (nn::Module* table : {token_table_, head_}) {
        if (table == nullptr) continue; // tied: the head is the table
        if (table_weights_released()) table->release_parameter_storage();
        table->release_gradient_storage();
    }
}

Tensor ModuleTrainer::gather_head(const Tensor& hidden) {
    if (!table_gradients_sharded()) return hidden;
    nn::Module* head = head_ != nullptr ? head_ : token_table_;
    const bool gather = table_weights_released() && whole_scopes_ == 0; // inside WholeParameters it is whole
    if (gather) gather_table(*head, head_ != nullptr ? head_indexes_ : token_table_indexes_);
    if (!grad_enabled()) return hidden; // an evaluation: release_head_after_no_grad
    // The classifier's node captures the buffer now (the streaming head fills it in its forward). A tied table's holds
    // the head's gradient and then the lookup's, and is reduced once backward() returns.
    head->allocate_gradient_storage();
    return on_backward(hidden, [this, head, gather] {
        // The classifier's backward has run: an untied head's gradient onto its owners, and the head goes.
        if (head_ != nullptr) {
            zero_->reduce_gradients(head_indexes_);
            head_->release_gradient_storage();
        }
        if (gather) head->release_parameter_storage();
    });
}

void ModuleTrainer::release_head_after_no_grad() {
    if (table_weights_released() && whole_scopes_ == 0 && !grad_enabled())
        (head_ != nullptr ? head_ : token_table_)->release_parameter_storage();
}

std::vector<nn::Module*> ModuleTrainer::released_modules() const {
    std::vector<nn::Module*> out;
    if (!parameters_sharded()) return out;
    if (table_weights_released()) out.push_back(token_table_);
    for (int layer : streamed_layers_) out.push_back(&layered_->block(layer));
    if (table_weights_released() && head_ != nullptr) out.push_back(head_);
    return out;
}

void ModuleTrainer::release_segment_parameters(int first_layer, int layer_count) {
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
        layered_->block(layer).release_parameter_storage();
}

void ModuleTrainer::gather_released_parameters() {
    if (!parameters_sharded()) return;
    if (whole_scopes_++ > 0) return; // gathered already (a nested scope)
    try {
        // All or nothing: a layer left with storage but no values would pass for whole.
        for (nn::Module* module : released_modules()) module->allocate_parameter_storage();
        zero_->gather_parameters(released_indexes_);
        for (nn::Module* module : released_modules()) module->refresh_working_copies();
    } catch (...) {
        --whole_scopes_;
        for (nn::Module* module : released_modules()) module->release_parameter_storage();
        throw;
    }
}

void ModuleTrainer::release_gathered_parameters(bool written) {
    if (!parameters_sharded() || whole_scopes_ == 0) return;
    // The outermost scope releases; a `written` nested one takes its values now, the outer one's are the same storage.
    if (written) zero_->take_parameters(released_indexes_); // the ones kept whole were written in place
    if (--whole_scopes_ > 0) return;
    for (nn::Module* module : released_modules()) module->release_parameter_storage();
}

std::optional<size_t> ModuleTrainer::released_index(const Tensor& parameter) const {
    if (!parameters_sharded() || !parameter.storage_released()) return std::nullopt;
    for (size_t index = 0; index < parameters_.size(); ++index)
        if (parameters_[index].id() == parameter.id()) return index;
    ENGINE_FAIL("trainer: " << parameter.describe() << " is released but not one of the trainer's parameters");
}

void ModuleTrainer::visit_whole_parameter(const Tensor& parameter, const ByteConsumer& consume) {
    const std::optional<size_t> index = released_index(parameter);
    if (!index) return consume(parameter.raw_data(), parameter.nbytes(), parameter.device());
    zero_->gather_parameter(*index, [&](const void* bytes, size_t byte_count) {
        consume(bytes, byte_count, parameter.device());
    });
}

std::optional<ZeroShards::ParameterPart> ModuleTrainer::released_part(const Tensor& parameter) const {
    const std::optional<size_t> index = released_index(parameter);
    if (!index) return std::nullopt;
    return zero_->parameter_part(*index);
}

void ModuleTrainer::fetch_segment(int first_layer, int layer_count) {
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer) layered_->block(layer).fetch_working_copies();
}

void ModuleTrainer::prefetch_neighbour(int first_layer, int direction) {
    for (size_t index = 0; index < streamed_segments_.size(); ++index) {
        if (streamed_segments_[index].first_layer != first_layer) continue;
        const size_t neighbour = index + static_cast<size_t>(direction); // wraps past the ends: refused below
        if (neighbour >= streamed_segments_.size()) return;
        const checkpoint::Segment& next = streamed_segments_[neighbour];
        for (int layer = next.first_layer; layer < next.first_layer + next.layer_count; ++layer)
            layered_->block(layer).prefetch_working_copies();
        return;
    }
}

void ModuleTrainer::release_segment(int first_layer, int layer_count) {
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer) layered_->block(layer).release_fetched_copies();
}

void ModuleTrainer::attach_segment_gradients(int first_layer, int layer_count) {
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer) layered_->block(layer).attach_working_gradients();
}

void ModuleTrainer::stream_segment_gradients(int first_layer, int layer_count) {
    if (gradients_sharded()) {
        // ZeRO-2 with the model state on the host: each parameter's gradient comes down and is lent to its master,
        // whose own buffer is gone, for the reduce onto the ranks that own its elements (host tensors); then it goes.
        // One parameter at a time, so the host holds one staged gradient, as without ZeRO.
        for (size_t index : segment_parameters_.at(first_layer)) {
            Tensor master = parameters_[index];
            master.set_gradient_buffer(gradient_leaves_[index].grad().to(Device::cpu, MemoryCategory::workspace));
            zero_->reduce_gradients({index});
            master.set_gradient_buffer(Tensor());
        }
        for (int layer = first_layer; layer < first_layer + layer_count; ++layer)
            layered_->block(layer).release_working_gradients();
        return;
    }
    for (int layer = first_layer; layer < first_layer + layer_count; ++layer) {
        nn::Module& block = layered_->block(layer);
        const std::vector<Tensor> masters = block.parameters();
        const std::vector<Tensor> working = block.working_parameters();
        for (size_t index = 0; index < masters.size(); ++index) {
            if (!masters[index].requires_grad()) continue; // frozen: no gradient
            // Down, then added in f32 into the master's buffer: one micro-batch after the other, in order.
            const Tensor staged = working[index].grad().to(Device::cpu, MemoryCategory::workspace);
            accumulate_into(masters[index].grad(), staged);
        }
        block.release_working_gradients();
    }
}

} // namespace engine::optim
