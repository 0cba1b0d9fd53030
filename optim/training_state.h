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

// All or nothing: checks every tensor's presence, dtype and shape, the optimizer kind and the cursor before
// changing anything; throws EngineError naming what does not match. `loader` may be null when none was saved.
void restore_training_state(const io::TrainingState& state, ModuleTrainer& trainer, nn::DataLoader* loader);

// save_state_rotating(directory, trainer.step(), capture_training_state(...)); returns the path written.
// With data parallelism every rank calls it (capturing may gather) and only the writer (rank 0) passes
// write = true; the others get "".
std::string save_training_state(const std::string& directory, ModuleTrainer& trainer, const nn::DataLoader* loader,
                                const std::string& config_json = "{}", bool write = true);

struct ResumedRun {
    int64_t step = 0;
    std::string path;           // the state file used
    std::string refused_reason; // non-empty when the newest file failed validation and an older one was used
    std::string config_json;    // the config saved with the state
};
// load_latest_state(directory) then restore_training_state.
ResumedRun resume_training_state(const std::string& directory, ModuleTrainer& trainer, nn::DataLoader* loader);

} // namespace engine::optim
