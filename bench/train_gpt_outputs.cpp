// train_gpt's output checks before the first step (bench/train_gpt_outputs.h).
#include "train_gpt_outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/io/atomic_file.h"
#include "engine/memory.h"
#include "nn/qlora.h"
#include "planner/planner.h"
#include "optim/training_state.h"
#include "train_gpt_plan.h"

namespace train_gpt {
namespace {

namespace fs = std::filesystem;

// Where an output's files will be created: a file's folder, a directory itself; when that does not exist yet, the
// nearest folder above it that does, in which the save creates the rest (--out makes every missing level). A level
// that exists but is no directory (a file where --out's folder would be) is refused: no save could go there.
fs::path landing_directory(const std::string& flag, const std::string& path, bool is_directory) {
    const fs::path target = fs::absolute(fs::path(path)).lexically_normal();
    fs::path directory = is_directory ? target : target.parent_path();
    if (!directory.has_filename()) directory = directory.parent_path(); // "out/" is the directory out
    std::error_code error;
    while (!fs::is_directory(directory, error)) {
        if (fs::exists(fs::symlink_status(directory, error)))
            throw UsageError(flag, "'" + directory.string() + "' is " + path_kind(directory.string()) +
                                       ", not a directory: the output could not be written there");
        if (!directory.has_parent_path() || directory.parent_path() == directory) break;
        directory = directory.parent_path();
    }
    return directory;
}

// A file created, written, synced and removed in `directory`: what the save will do there.
void probe(const std::string& flag, const fs::path& directory) {
    std::string name = (directory / ".train_gpt-probe-XXXXXX").string();
    const int descriptor = mkstemp(name.data());
    if (descriptor < 0)
        throw UsageError(flag, "cannot create a file in '" + directory.string() + "' (" + std::strerror(errno) +
                                   "): the output would fail after training");
    const char byte = 0;
    const bool written = ::write(descriptor, &byte, 1) == 1 && ::fsync(descriptor) == 0;
    const int saved_errno = errno;
    ::close(descriptor);
    ::unlink(name.c_str());
    if (!written)
        throw UsageError(flag, "cannot write a file in '" + directory.string() + "' (" + std::strerror(saved_errno) +
                                   "): the output would fail after training");
}

// How many state files (state-*.bin) a directory holds already.
int existing_states(const std::string& directory) {
    int count = 0;
    std::error_code error;
    if (!fs::is_directory(directory, error)) return 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
        const std::string name = entry.path().filename().string();
        count += name.starts_with("state-") && name.ends_with(".bin");
    }
    return count;
}

struct Need {
    std::string flag;
    fs::path directory;
    size_t bytes = 0;
    std::string what;
};

} // namespace

OutputSizes output_sizes(const Options& options, engine::nn::CausalLM& model) {
    using namespace engine;
    OutputSizes sizes;
    const size_t parameters = model.parameter_count(), trainable = model.trainable_parameter_count();
    size_t quantized = 0; // NF4 layers' weights, dense again in a merge
    for (const auto& [name, layer] : nn::nf4_layers(model)) quantized += static_cast<size_t>(layer->nf4_weight()->numel());
    const size_t save_element = dtype_size(options.save_dtype.value_or(DType::f32));
    sizes.model = parameters * save_element;
    sizes.adapter = trainable * sizeof(float);
    sizes.merged = (parameters - trainable + quantized) * save_element;
    for (const Tensor& parameter : model.parameters()) sizes.state += parameter.nbytes();
    sizes.state += model.buffer_bytes();
    sizes.state += memory_stats(Device::cpu).current(MemoryCategory::optimizer_state);
    if (options.resolved_device != Device::cpu)
        sizes.state += memory_stats(options.resolved_device).current(MemoryCategory::optimizer_state);
    return sizes;
}

void check_outputs(const Options& options, const OutputSizes& sizes) {
    std::vector<Need> needs;
    if (!options.save.empty())
        needs.push_back({"--save", landing_directory("--save", options.save, saves_directory(options.save)), sizes.model, "the weights"});
    if (!options.save_adapter.empty())
        needs.push_back({"--save-adapter", landing_directory("--save-adapter", options.save_adapter, true), sizes.adapter, "the adapter"});
    if (!options.merge.empty())
        needs.push_back({"--merge", landing_directory("--merge", options.merge, true), sizes.merged, "the merged weights"});
    if (!options.out.empty()) {
        // The rotation (engine/io/state_directory.h) writes each new state before it removes the one before the
        // previous: up to three states at once, of which the directory may hold some already.
        const int64_t steps = options.trainer.max_steps;
        const int64_t saves = options.save_every > 0 ? (steps + options.save_every - 1) / options.save_every : 1;
        const int held = std::min(existing_states(options.out), 2);
        const size_t states = static_cast<size_t>(std::min<int64_t>(saves, 3 - held));
        needs.push_back({"--out", landing_directory("--out", options.out, true), states * sizes.state,
                         std::to_string(states) + " training state" + (states == 1 ? "" : "s")});
    }
    if (!options.log.empty()) needs.push_back({"--log", landing_directory("--log", options.log, false), 0, "the log"});
    if (!options.memory_timeline.empty())
        needs.push_back({"--memory-timeline", landing_directory("--memory-timeline", options.memory_timeline, false), 0,
                         "the memory timeline"});
    // Every output writable where it will go; then each file system's room for all the outputs on it together.
    std::map<dev_t, std::vector<const Need*>> by_device;
    for (const Need& need : needs) {
        probe(need.flag, need.directory);
        struct stat status {};
        if (::stat(need.directory.c_str(), &status) == 0) by_device[status.st_dev].push_back(&need);
    }
    for (const auto& [device, group] : by_device) {
        struct statvfs space {};
        if (::statvfs(group.front()->directory.c_str(), &space) != 0) continue; // no figure: the probe passed
        const size_t free_bytes = static_cast<size_t>(space.f_bavail) * static_cast<size_t>(space.f_frsize);
        size_t total = 0;
        std::string listing;
        int listed = 0;
        for (const Need* need : group) listed += need->bytes > 0;
        for (const Need* need : group) {
            total += need->bytes;
            if (need->bytes == 0) continue;
            listing += (listing.empty() ? "" : " + ") + need->what + " (" + need->flag +
                       (listed > 1 ? ", " + engine::planner::format_bytes(need->bytes) : std::string()) + ")";
        }
        if (total > free_bytes)
            throw UsageError(group.front()->flag, "'" + group.front()->directory.string() + "' has " +
                                                      engine::planner::format_bytes(free_bytes) + " free, but " + listing +
                                                      " need at least " + engine::planner::format_bytes(total) +
                                                      (listed > 1 ? " together" : "") +
                                                      ": the output would fail after training");
    }
}

void write_memory_timeline(const Options& options, const engine::MemoryTimeline& timeline,
                           const engine::optim::StepResult& result, int64_t step) {
    const std::optional<size_t> predicted = predicted_step_peak(options);
    const nlohmann::json metadata{
        {"step", step},
        {"device", engine::device_name(options.resolved_device)},
        {"model", options.model.to_string()},
        {"peak_bytes", result.memory.peak_bytes},
        {"predicted_peak_bytes", predicted ? nlohmann::json(*predicted) : nlohmann::json(nullptr)},
        {"shape", options.trainer.shape.summary()},
    };
    const std::string text = engine::memory_timeline_json(timeline, metadata.dump());
    try {
        engine::io::write_file_atomically(options.memory_timeline, [&](const engine::io::ByteSink& sink) {
            sink(text.data(), text.size());
        });
    } catch (const engine::EngineError& error) {
        throw flag_error("--memory-timeline", error);
    }
    std::cout << "memory timeline of step " << step << ": " << timeline.events.size() << " allocations and frees in "
              << options.memory_timeline << " (scripts/plot_memory.py draws it)" << std::endl;
}

void report_out_of_memory(const Options& options, engine::optim::ModuleTrainer& trainer,
                          engine::nn::DataLoader& loader, const engine::nn::LoaderCursor& cursor_before,
                          const engine::RngState& rng_before, int64_t step, const std::string& config_json,
                          int world_size) {
    using engine::planner::mebibytes;
    const engine::OutOfMemoryRecord* record = engine::last_out_of_memory();
    if (record == nullptr) return;
    const char* category = engine::memory_category_name(record->category);
    std::ostringstream text;
    text << "train_gpt: out of memory in step " << step << ", " << record->phase
         << (record->after_op.empty() ? std::string() : " after " + record->after_op) << ": "
         << mebibytes(record->requested) << " more for " << category << " on "
         << engine::device_name(record->device) << " holding " << mebibytes(record->usage.current_bytes) << " ("
         << category << " " << mebibytes(record->usage.current(record->category)) << ")";
    if (record->limit != SIZE_MAX)
        text << ", past --memory-limit " << mebibytes(record->limit) << " (" << record->limit << " B)";
    text << ".";
    if (const std::optional<engine::planner::MemoryPrediction> plan = predicted_step_memory(options)) {
        const size_t peak = plan->peak_on(options.resolved_device);
        text << " The plan predicted the step's peak at " << mebibytes(peak) << " (" << peak << " B; " << category
             << " at most " << mebibytes(plan->of(record->category)) << ")";
        // What the step would have held with this allocation: at most the device's room (the limit, or on a device
        // whatever it could still give). A plan at or above that predicted the failure; one below missed a moment.
        const size_t wanted = record->usage.current_bytes + record->requested;
        const size_t room = record->limit != SIZE_MAX ? record->limit : wanted - 1;
        const std::string remedy = options.max_tokens_per_micro_batch > 0
                                       ? "a smaller --max-tokens-per-micro-batch"
                                       : "a plan within it (--max-memory " + std::to_string(room) + "B)";
        text << (peak > room ? ", above what the device gave (" + mebibytes(room) + "): " + remedy +
                                   " would not have run out"
                             : ", within what the device gave: the model missed this moment (" + mebibytes(wanted) +
                                   " wanted); please report it");
        text << ".";
    }
    std::cerr << text.str() << std::endl;
    if (options.out.empty()) {
        std::cerr << "train_gpt: no --out DIR: the training state was not written" << std::endl;
        return;
    }
    if (record->phase == "optimizer" || world_size > 1) {
        std::cerr << "train_gpt: the training state was not written: "
                  << (world_size > 1 ? "the other ranks wait in a collective for this one"
                                     : "the update itself failed, so the weights may be part-updated")
                  << "; --resume " << options.out << " continues from the last state saved there" << std::endl;
        return;
    }
    // The trainer zeroed the failed window's gradients; the weights and the optimizer are the last step's. Put the
    // data and the RNG back where the step began, and lift the limit for the save, which reads to host memory.
    try {
        loader.restore(cursor_before);
        engine::rng_state() = rng_before;
        engine::set_memory_limit(record->device, SIZE_MAX);
        const std::string path =
            engine::optim::save_training_state(options.out, trainer, &loader, config_json, true);
        std::cerr << "train_gpt: saved the training state before step " << step << " to " << path << "; --resume "
                  << options.out << " continues from it" << std::endl;
    } catch (const std::exception& error) {
        std::cerr << "train_gpt: the training state could not be written: " << error.what() << std::endl;
    }
}

std::string phase_peaks(engine::Device device) {
    const size_t peak = engine::memory_stats(device).peak_bytes;
    if (device == engine::Device::cpu) return "peak " + std::to_string(peak) + " B";
    return "device peak " + std::to_string(peak) + " B, host peak " +
           std::to_string(engine::memory_stats(engine::Device::cpu).peak_bytes) + " B";
}

} // namespace train_gpt
