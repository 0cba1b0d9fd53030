// Saving and resuming a training run: model weights, optimizer moments and step, the engine RNG position,
// the data-loader cursor and the run's config, in the rotating, checksummed state files of
// engine/io/state_file.h. Restoring into a fresh model, trainer and loader continues bitwise.
#pragma once

#include <cstdint>
#include <string>

#include "engine/io/state_file.h"
#include "nn/io/token_data.h"
#include "optim/trainer.h" // ModuleTrainer, and the GPT Trainer its callers mostly pass

namespace engine::optim {

// Tensor names inside the file: "model.<parameter>" and "optimizer.<state>" (optimizer.h's names), whole
// tensors even when the optimizer state is sharded over data-parallel ranks (ZeRO-1): then capturing gathers
// them, a collective every rank calls, and restoring takes each rank's part.
io::TrainingState capture_training_state(ModuleTrainer& trainer, const nn::DataLoader* loader,
                                         const std::string& config_json = "{}");

// The same state as a source that pulls each tensor only when a writer reaches it (io::write_state): from host
// memory directly, from a device through one pinned block (io::state_staging_bytes), under ZeRO-1 gathered one
// tensor at a time through the collectives' buffer. A save holds no copy of the state, on the device or the host.
// The emits read the trainer as it is when they run: write the source before the next step. Every rank writes or
// drains it (its emits are collectives under ZeRO-1).
io::StateSource training_state_source(ModuleTrainer& trainer, const nn::DataLoader* loader,
                                      const std::string& config_json = "{}");

// Checks every tensor's presence, dtype and shape, the optimizer kind and the cursor before changing anything, and
// throws EngineError naming what does not match: a state that does not fit changes nothing. Only a read that fails
// after the checks (a state file's disk failing) leaves the tensors part-restored; the loader is then put back.
// `loader` may be null when none was saved.
void restore_training_state(const io::TrainingState& state, ModuleTrainer& trainer, nn::DataLoader* loader);
// From any reader: a state file read in place (io::StateFileReader), each tensor straight into its destination.
void restore_training_state(const io::StateReader& state, ModuleTrainer& trainer, nn::DataLoader* loader);

// save_state_rotating(directory, trainer.step(), training_state_source(...)): streamed, tensor by tensor, into the
// file; returns the path written. With data parallelism every rank calls it (the tensors may be gathered) and only
// the writer (rank 0) passes write = true; the others get "". A writer that fails still takes part in every gather
// before it throws, so the other ranks are not left waiting.
std::string save_training_state(const std::string& directory, ModuleTrainer& trainer, const nn::DataLoader* loader,
                                const std::string& config_json = "{}", bool write = true);

struct ResumedRun {
    int64_t step = 0;
    std::string path;           // the state file used
    std::string refused_reason; // non-empty when the newest file failed validation and an older one was used
    std::string config_json;    // the config saved with the state
};
// open_latest_state(directory) then restore_training_state from the file in place: the host holds the metadata,
// an index and one pinned block for a device, never the state.
ResumedRun resume_training_state(const std::string& directory, ModuleTrainer& trainer, nn::DataLoader* loader);

} // namespace engine::optim
