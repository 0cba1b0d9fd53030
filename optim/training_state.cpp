// Training-state capture and restore over the trainer's public surface: named parameters, the optimizer's
// named state and step count, the thread's RNG stream and the loader cursor.
#include "optim/training_state.h"

#include <algorithm>

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

io::TrainingState capture_training_state(ModuleTrainer& trainer, const nn::DataLoader* loader,
                                         const std::string& config_json) {
    io::TrainingState state;
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
    state.metadata_json = metadata.dump();
    for (const auto& [name, parameter] : trainer.module().named_parameters())
        state.add_tensor(model_prefix + name, parameter);
    // Whole tensors, gathered from the ranks under ZeRO-1 one kind at a time straight to the host: the file is the
    // same as an unsharded run's (per parameter, every kind), and the device holds no gathered copy.
    std::vector<io::StateTensor> gathered;
    trainer.visit_whole_optimizer_state([&](const std::string& name, const Tensor& like, const void* bytes, Device device) {
        io::StateTensor stored{optimizer_prefix + name, like.dtype(), like.shape(), std::vector<uint8_t>(like.nbytes())};
        copy_bytes(stored.data.data(), Device::cpu, bytes, device, like.nbytes());
        gathered.push_back(std::move(stored));
    });
    // Kind by kind under ZeRO-1 (exp_avg of every parameter, then exp_avg_sq); the unsharded order interleaves them.
    std::vector<std::string> prefixes; // the kinds of state, by their names' part before the parameter's
    for (const io::StateTensor& stored : gathered) {
        const std::string kind = stored.name.substr(0, stored.name.find('.', optimizer_prefix.size()));
        if (std::find(prefixes.begin(), prefixes.end(), kind) == prefixes.end()) prefixes.push_back(kind);
    }
    const size_t kinds = std::max<size_t>(1, prefixes.size());
    const size_t per_kind = gathered.size() / kinds;
    const bool kind_major = trainer.optimizer().sharded() && kinds > 1;
    for (size_t parameter = 0; parameter < per_kind; ++parameter)
        for (size_t kind = 0; kind < kinds; ++kind)
            state.add_tensor(std::move(gathered[kind_major ? kind * per_kind + parameter : parameter * kinds + kind]));
    return state;
}

void restore_training_state(const io::TrainingState& state, ModuleTrainer& trainer, nn::DataLoader* loader) {
    const nlohmann::json metadata = parse_object(state.metadata_json, "training-state metadata");
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
    };
    std::vector<Target> targets;
    for (const auto& [name, parameter] : trainer.module().named_parameters())
        targets.push_back({model_prefix + name, parameter, parameter, 0});
    for (const Optimizer::StateShard& shard : trainer.optimizer().state_shards())
        targets.push_back({optimizer_prefix + shard.name, shard.state,
                           trainer.optimizer().sharded() ? shard.parameter : shard.state, shard.first});
    // Every parameter, frozen ones too (the file restores the whole model), and the state of the trainable ones.
    const size_t parameters = trainer.module().named_parameters().size();
    const size_t trainable = trainer.module().named_trainable_parameters().size();
    const size_t expected = parameters + trainable * (trainer.config().optimizer == OptimizerKind::adamw ? 2 : 1);
    ENGINE_CHECK(expected == state.tensors.size(), "training state holds " << state.tensors.size()
                                                   << " tensors, this model and optimizer have " << expected);
    for (const Target& target : targets) {
        const io::StateTensor* stored = state.find(target.name);
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
    if (loader != nullptr) {
        const bool per_rank = metadata.contains("loader_ranks");
        ENGINE_CHECK(!per_rank || (metadata["loader_ranks"].is_array() &&
                                   metadata["loader_ranks"].size() == static_cast<size_t>(saved_world)),
                     "training state: loader_ranks must hold one cursor per rank (" << saved_world << ")");
        cursor = nn::LoaderCursor::from_json(
            (per_rank ? metadata["loader_ranks"][static_cast<size_t>(rank_of(trainer))] : field("loader")).dump());
        loader->restore(*cursor); // throws, changing nothing, when the cursor does not fit this data
    }

    for (Target& target : targets) {
        if (target.whole.raw_data() == target.destination.raw_data()) {
            state.copy_into(target.name, target.destination);
            continue;
        }
        // A shard: its slice straight from the stored bytes (validated above), so nothing is allocated here and
        // no failure can leave the restore half done.
        const io::StateTensor* stored = state.find(target.name);
        const size_t offset = static_cast<size_t>(target.first) * dtype_size(target.whole.dtype());
        copy_bytes(target.destination.raw_data(), target.destination.device(), stored->data.data() + offset, Device::cpu,
                   target.destination.nbytes());
    }
    trainer.module().refresh_working_copies();
    trainer.optimizer().set_step_count(field("step").get<int64_t>());
    rng_state() = RngState{rng["seed"].get<uint64_t>(), rng["offset"].get<uint64_t>()};
}

std::string save_training_state(const std::string& directory, ModuleTrainer& trainer, const nn::DataLoader* loader,
                                const std::string& config_json, bool write) {
    io::TrainingState state = capture_training_state(trainer, loader, config_json);
    if (!write) return "";
    return io::save_state_rotating(directory, static_cast<uint64_t>(trainer.step()), std::move(state));
}

ResumedRun resume_training_state(const std::string& directory, ModuleTrainer& trainer, nn::DataLoader* loader) {
    io::LoadedState loaded = io::load_latest_state(directory);
    try {
        restore_training_state(loaded.state, trainer, loader);
    } catch (const EngineError& error) {
        throw EngineError(loaded.path + ": " + error.what());
    }
    ResumedRun run;
    run.step = trainer.step();
    run.path = loaded.path;
    run.refused_reason = loaded.refused_reason;
    run.config_json = parse_object(loaded.state.metadata_json, "training-state metadata")["config"].dump();
    return run;
}

} // namespace engine::optim
