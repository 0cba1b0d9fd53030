// Rotation of training states in a directory: the newest complete state plus one before it, so that a
// save killed part way, or a newest file damaged later, still leaves a state to resume from.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "base/error.h"
#include "engine/io/atomic_file.h"
#include "engine/io/state_file.h"

namespace engine::io {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view state_prefix = "state-";
constexpr std::string_view state_suffix = ".bin";

struct StateEntry {
    uint64_t step;
    fs::path path;
};

// state-<digits>.bin exactly; anything else (temporary files, user files) is not a state.
bool parse_state_name(const std::string& name, uint64_t* step) {
    if (name.size() <= state_prefix.size() + state_suffix.size() || !name.starts_with(state_prefix) ||
        !name.ends_with(state_suffix))
        return false;
    const char* first = name.data() + state_prefix.size();
    const char* last = name.data() + name.size() - state_suffix.size();
    const auto [end, error] = std::from_chars(first, last, *step);
    return error == std::errc() && end == last && std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; });
}

// Newest first.
std::vector<StateEntry> list_states(const fs::path& directory) {
    std::vector<StateEntry> entries;
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
        uint64_t step = 0;
        if (parse_state_name(entry.path().filename().string(), &step)) entries.push_back({step, entry.path()});
    }
    ENGINE_CHECK(!error, "cannot list state directory " << directory.string() << ": " << error.message());
    std::sort(entries.begin(), entries.end(), [](const StateEntry& a, const StateEntry& b) { return a.step > b.step; });
    return entries;
}

} // namespace

std::string state_file_name(uint64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "state-%012llu.bin", static_cast<unsigned long long>(step));
    return name;
}

std::string save_state_rotating(const std::string& directory, uint64_t step, const TrainingState& state) {
    return save_state_rotating(directory, step, source_of(state));
}

std::string save_state_rotating(const std::string& directory, uint64_t step, const StateSource& source) {
    std::error_code error;
    fs::create_directories(directory, error);
    ENGINE_CHECK(!error, "cannot create state directory " << directory << ": " << error.message());
    const fs::path target = fs::path(directory) / state_file_name(step);
    write_state_file(target.string(), source); // durable (file and directory fsynced) before anything is deleted

    // Keep the new state and the newest one older than it. Larger steps are from a run that was abandoned
    // (we resumed from an earlier state), and would otherwise shadow the new one at the next load.
    bool kept_previous = false;
    bool removed_any = false;
    for (const StateEntry& entry : list_states(directory)) {
        if (entry.step == step) continue;
        if (entry.step < step && !kept_previous) {
            kept_previous = true;
            continue;
        }
        removed_any |= fs::remove(entry.path, error);
    }
    // Temporary files left by a writer that was killed: with one writer per directory, any that is not
    // ours is dead.
    for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
        const std::string name = entry.path().filename().string();
        if (name.starts_with(state_prefix) && name.find(temporary_suffix) != std::string::npos)
            removed_any |= fs::remove(entry.path(), error);
    }
    if (removed_any) sync_directory(directory);
    return target.string();
}

namespace {

// The newest state file for which `open` succeeds, newer ones' refusals joined in `refusals`.
template <typename Open>
void open_newest(const std::string& directory, std::string& refused_reason, const Open& open) {
    std::error_code error;
    ENGINE_CHECK(fs::is_directory(directory, error), "state directory " << directory << " does not exist");
    const std::vector<StateEntry> entries = list_states(directory);
    ENGINE_CHECK(!entries.empty(), "state directory " << directory << " holds no state-<step>.bin file");
    std::ostringstream refusals;
    for (const StateEntry& entry : entries) {
        try {
            open(entry);
            refused_reason = refusals.str();
            return;
        } catch (const EngineError& refused) {
            refusals << (refusals.tellp() > 0 ? "; " : "") << "refused " << entry.path.string() << ": "
                     << refused.what();
        }
    }
    ENGINE_FAIL("no valid training state in " << directory << ": " << refusals.str());
}

} // namespace

LoadedState load_latest_state(const std::string& directory) {
    LoadedState loaded;
    open_newest(directory, loaded.refused_reason, [&](const StateEntry& entry) {
        loaded.state = read_state_file(entry.path.string());
        loaded.path = entry.path.string();
        loaded.step = entry.step;
    });
    return loaded;
}

OpenedState open_latest_state(const std::string& directory) {
    OpenedState opened;
    open_newest(directory, opened.refused_reason, [&](const StateEntry& entry) {
        opened.reader = std::make_unique<StateFileReader>(entry.path.string());
        opened.step = entry.step;
    });
    return opened;
}

} // namespace engine::io
