// Training-state capture and restore over the trainer's public surface: named parameters, the optimizer's
// named state and step count, the thread's RNG stream and the loader cursor.
#include "optim/training_state.h"

#include <algorithm>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/random.h"

namespace engine::optim {
namespace {

constexpr const char* format_name = "libengine-training-state";
const std::string model_prefix = "model.";
const std::string optimizer_prefix = "optimizer.";

nlohmann::json parse_object(const std::string& text, const std::string& what) {
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ENGINE_CHECK(!parsed.is_discarded() && parsed.is_object(), what << " is not a JSON object: " << text);
    return parsed;
}

int world_size_of(const ModuleTrainer& trainer) {
    return trainer.communicator() != nullptr ? trainer.communicator()->world_size() : 1;
}

int rank_of(const ModuleTrainer& trainer) { return trainer.communicator() != nullptr ? trainer.communicator()->rank() : 0; }

} // namespace

namespace {

std::string state_metadata(ModuleTrainer& trainer, const nn::DataLoader* loader, const std::string& config_json) {
    const RngState rng = rng_state();
    nlohmann::json metadata = {
        {"format", format_name},
        {"step", trainer.step()},
        {"optimizer", optimizer_kind_name(trainer.config().optimizer)},
        {"rng", {{"seed", rng.seed}, {"offset", rng.offset}}},
        {"config", parse_object(config_json, "training config")},
    };
    metadata["world_size"] = world_size_of(trainer);
    if (loader != nullptr) {
        metadata["loader"] = parse_object(loader->cursor().to_json(), "loader cursor");
        // Every rank's cursor. The ranks move through the same global batches, so each is the writer's with its
        // own rank: one file (rank 0 writes it) restores them all.
        nlohmann::json ranks = nlohmann::json::array();
        for (int rank = 0; rank < world_size_of(trainer); ++rank) {
            nn::LoaderCursor cursor = loader->cursor();
            cursor.rank = rank;
            ranks.push_back(parse_object(cursor.to_json(), "loader cursor"));
        }
        metadata["loader_ranks"] = ranks;
    }
    return metadata.dump();
}

} // namespace

io::StateSource training_state_source(ModuleTrainer& trainer, const nn::DataLoader* loader,
                                      const std::string& config_json) {
    io::StateSource source;
    source.metadata_json = state_metadata(trainer, loader, config_json);
    // One pinned block for the whole save, made at the first tensor on a device and gone with the source.
    auto staging = std::make_shared<io::StateStaging>();
    for (const auto& named : trainer.module().named_parameters()) {
        const Tensor parameter = named.second; // a handle of its own: the emit outlives this loop
        // At ZeRO-3 a released parameter is gathered from the ranks' shards as it is written (a collective per emit).
        source.tensors.push_back({model_prefix + named.first, parameter.dtype(), parameter.shape(),
                                  [&trainer, parameter, staging](const io::ByteSink& sink) {
                                      trainer.visit_whole_parameter(parameter, [&](const void* bytes, size_t byte_count,
                                                                                   Device device) {
                                          staging->emit(bytes, device, byte_count, sink);
                                      });
                                  }});
    }
    const std::vector<std::pair<std::string, Tensor>> layout = trainer.whole_optimizer_state_layout();
    for (size_t index = 0; index < layout.size(); ++index) {
        const Tensor& like = layout[index].second;
        source.tensors.push_back({optimizer_prefix + layout[index].first, like.dtype(), like.shape(),
                                  [&trainer, index, staging](const io::ByteSink& sink) {
                                      trainer.visit_whole_optimizer_state_tensor(
                                          index, [&](const std::string&, const Tensor&, const void* bytes, size_t byte_count,
                                                     Device device) { staging->emit(bytes, device, byte_count, sink); });
                                  }});
    }
    return source;
}

io::TrainingState capture_training_state(ModuleTrainer& trainer, const nn::DataLoader* loader,
                                         const std::string& config_json) {
    const io::StateSource source = training_state_source(trainer, loader, config_json);
    io::TrainingState state;
    state.metadata_json = source.metadata_json;
    for (const io::StateTensorSource& tensor : source.tensors) {
        io::StateTensor stored{tensor.name, tensor.dtype, tensor.shape, {}};
        stored.data.reserve(static_cast<size_t>(shape_numel(tensor.shape)) * dtype_size(tensor.dtype));
        tensor.emit([&](const void* bytes, size_t size) {
            const auto* begin = static_cast<const uint8_t*>(bytes);
            stored.data.insert(stored.data.end(), begin, begin + size);
        });
        state.add_tensor(std::move(stored));
    }
    return state;
}

void restore_training_state(const io::TrainingState& state, ModuleTrainer& trainer, nn::DataLoader* loader) {
    restore_training_state(io::MemoryStateReader(state), trainer, loader);
}

void restore_training_state(const io::StateReader& state, ModuleTrainer& trainer, nn::DataLoader* loader) {
    const nlohmann::json metadata = parse_object(state.metadata_json(), "training-state metadata");
    auto field = [&](const char* key) -> const nlohmann::json& {
        ENGINE_CHECK(metadata.contains(key), "training state: metadata has no '" << key << "'");
        return metadata[key];
    };
    ENGINE_CHECK(field("format") == format_name, "training state: format is " << field("format").dump()
                                                                               << ", expected " << format_name);
    ENGINE_CHECK(field("step").is_number_integer() && field("step").get<int64_t>() >= 0,
                 "training state: step must be a non-negative integer");
    const std::string optimizer = optimizer_kind_name(trainer.config().optimizer);
    ENGINE_CHECK(field("optimizer") == optimizer, "training state was saved with optimizer "
                                                      << field("optimizer").dump() << ", this run uses " << optimizer);
    const nlohmann::json& rng = field("rng");
    ENGINE_CHECK(rng.is_object() && rng.contains("seed") && rng["seed"].is_number_unsigned() &&
                     rng.contains("offset") && rng["offset"].is_number_unsigned(),
                 "training state: rng must be {\"seed\":uint,\"offset\":uint}");

    // Validate every destination before the first write, so that a mismatch leaves the run untouched. The file
    // holds whole tensors; a sharded (ZeRO-1) optimizer state takes its part, from element `first` on.
    struct Target {
        std::string name;
        Tensor destination;
        Tensor whole; // the shape stored: the destination, or for a shard its parameter
        int64_t first = 0;
        // ZeRO-3: a released parameter is read straight into this rank's part of the shard of the masters.
        std::optional<ZeroShards::ParameterPart> part;
    };
    std::vector<Target> targets;
    for (const auto& [name, parameter] : trainer.module().named_parameters())
        targets.push_back({model_prefix + name, parameter, parameter, 0, trainer.released_part(parameter)});
    for (const Optimizer::StateShard& shard : trainer.optimizer().state_shards())
        targets.push_back({optimizer_prefix + shard.name, shard.state,
                           trainer.optimizer().sharded() ? shard.parameter : shard.state, shard.first, std::nullopt});
    // Every parameter, frozen ones too (the file restores the whole model), and the state of the trainable ones.
    const size_t parameters = trainer.module().named_parameters().size();
    const size_t trainable = trainer.module().named_trainable_parameters().size();
    const size_t expected = parameters + trainable * (trainer.config().optimizer == OptimizerKind::adamw ? 2 : 1);
    ENGINE_CHECK(expected == state.entries().size(), "training state holds " << state.entries().size()
                                                   << " tensors, this model and optimizer have " << expected);
    for (const Target& target : targets) {
        const io::StateReader::Entry* stored = state.find(target.name);
        ENGINE_CHECK(stored != nullptr, "training state has no tensor " << target.name);
        ENGINE_CHECK(stored->dtype == target.whole.dtype() && stored->shape == target.whole.shape(),
                     "training state tensor " << target.name << " is " << shape_string(stored->shape) << " "
                                              << dtype_name(stored->dtype) << ", this run has " << target.whole.describe());
    }
    // States from before data parallelism have no world size: they were one process.
    const int saved_world = metadata.contains("world_size") && metadata["world_size"].is_number_integer()
                                ? metadata["world_size"].get<int>()
                                : 1;
    ENGINE_CHECK(saved_world == world_size_of(trainer),
                 "training state was saved by a run of " << saved_world << " data-parallel ranks and this run has "
                     << world_size_of(trainer) << "; resume with the same world size (mpirun -np " << saved_world
                     << "): each rank's data cursor and share of every batch depend on it");
    std::optional<nn::LoaderCursor> cursor;
    const nn::LoaderCursor previous_cursor = loader != nullptr ? loader->cursor() : nn::LoaderCursor{};
    if (loader != nullptr) {
        const bool per_rank = metadata.contains("loader_ranks");
        ENGINE_CHECK(!per_rank || (metadata["loader_ranks"].is_array() &&
                                   metadata["loader_ranks"].size() == static_cast<size_t>(saved_world)),
                     "training state: loader_ranks must hold one cursor per rank (" << saved_world << ")");
        cursor = nn::LoaderCursor::from_json(
            (per_rank ? metadata["loader_ranks"][static_cast<size_t>(rank_of(trainer))] : field("loader")).dump());
        loader->restore(*cursor); // throws, changing nothing, when the cursor does not fit this data
    }

    // Each tensor straight from where the state is to where it goes (a sharded one's part from element `first` on),
    // validated above, so nothing is allocated here beyond one pinned block for a device. Only a read failing now (the
    // disk, not the file: it was validated) can stop it part way: then the loader is put back, the tensors are not.
    try {
        for (Target& target : targets) {
            if (target.part) {
                if (target.part->count == 0) continue; // another rank's part
                const size_t element = dtype_size(target.whole.dtype());
                state.read(*state.find(target.name), static_cast<size_t>(target.part->first) * element, target.part->data,
                           target.destination.device(), static_cast<size_t>(target.part->count) * element);
                continue;
            }
            const size_t offset = static_cast<size_t>(target.first) * dtype_size(target.whole.dtype());
            detail::impl_of(target.destination).storage->set_host_copy(nullptr); // written behind any host copy
            state.read(*state.find(target.name), offset, target.destination.raw_data(), target.destination.device(),
                       target.destination.nbytes());
        }
    } catch (const EngineError& error) {
        if (loader != nullptr) loader->restore(previous_cursor);
        throw EngineError(std::string(error.what()) + " (the model and optimizer state are part-restored)");
    }
    trainer.module().refresh_working_copies();
    trainer.optimizer().set_step_count(field("step").get<int64_t>());
    rng_state() = RngState{rng["seed"].get<uint64_t>(), rng["offset"].get<uint64_t>()};
}

std::string save_training_state(const std::string& directory, ModuleTrainer& trainer, const nn::DataLoader* loader,
                                const std::string& config_json, bool write) {
    io::StateSource source = training_state_source(trainer, loader, config_json);
    // Under ZeRO-1 each emit is a collective: whatever the writer meets (a directory it cannot create, a full disk),
    // every emit runs on it as on the other ranks, and its error comes after. write_state itself runs them all once
    // it starts; these count the ones that finished before a failure outside it. (An emit that throws part way
    // through a gather leaves the ranks out of step; the one thing an emit allocates, the pinned block, is made at
    // the first tensor on a device, a parameter, before any gather.)
    size_t emitted = 0;
    for (io::StateTensorSource& tensor : source.tensors)
        tensor.emit = [inner = std::move(tensor.emit), &emitted](const io::ByteSink& sink) {
            inner(sink);
            ++emitted;
        };
    if (!write) {
        for (const io::StateTensorSource& tensor : source.tensors) tensor.emit({});
        return "";
    }
    try {
        return io::save_state_rotating(directory, static_cast<uint64_t>(trainer.step()), source);
    } catch (...) {
        for (size_t index = emitted; index < source.tensors.size(); ++index) source.tensors[index].emit({});
        throw;
    }
}

ResumedRun resume_training_state(const std::string& directory, ModuleTrainer& trainer, nn::DataLoader* loader) {
    const io::OpenedState opened = io::open_latest_state(directory);
    try {
        restore_training_state(*opened.reader, trainer, loader);
    } catch (const EngineError& error) {
        throw EngineError(opened.reader->path() + ": " + error.what());
    }
    ResumedRun run;
    run.step = trainer.step();
    run.path = opened.reader->path();
    run.refused_reason = opened.refused_reason;
    run.config_json = parse_object(opened.reader->metadata_json(), "training-state metadata")["config"].dump();
    return run;
}

} // namespace engine::optim
