// train_gpt's outputs (--save, --save-adapter, --merge, --out, --log) proven writable, and with room on their file
// systems for what they will hold, before the first step (issue 30 item 2): a run must not train for hours and then
// fail to write its result.
#pragma once

#include <cstddef>
#include <string>

#include "engine/memory_timeline.h"
#include "engine/random.h"
#include "nn/io/token_data.h"
#include "nn/causal_lm.h"
#include "optim/module_trainer.h"
#include "train_gpt_options.h"

namespace train_gpt {

// What each output will hold, in bytes (0: the output is not asked for). The estimates are lower bounds: the
// tensors' bytes without the files' headers.
struct OutputSizes {
    size_t model = 0;   // --save: the weights in the save dtype
    size_t adapter = 0; // --save-adapter: the adapters in f32
    size_t merged = 0;  // --merge: the merged weights in the save dtype
    size_t state = 0;   // --out: one training state (weights and optimizer state)
};

// What `model` (built, adapted, quantised, with its optimizer's state allocated) will write through each output.
OutputSizes output_sizes(const Options& options, engine::nn::CausalLM& model);

// For every output asked for: a temporary file is created and removed where the output will go (its directory, or
// the folder the save will create it in), and each file system must have room for the outputs on it together
// (--out: as many states as the rotation will hold at once beyond those in the directory, at most three). Throws
// UsageError naming the flag, the directory and the figures.
void check_outputs(const Options& options, const OutputSizes& sizes);

// An out-of-memory failure inside step `step` (engine::last_out_of_memory says where): prints what failed beside
// the plan's prediction for the step and the category, and, with --out on one rank when the update had not begun,
// writes the training state as it was before the step (the loader's cursor and the RNG put back, the failed
// window's gradients already zeroed by the trainer), so that --resume continues bitwise.
void report_out_of_memory(const Options& options, engine::optim::ModuleTrainer& trainer,
                          engine::nn::DataLoader& loader, const engine::nn::LoaderCursor& cursor_before,
                          const engine::RngState& rng_before, int64_t step, const std::string& config_json,
                          int world_size);

// --memory-timeline FILE: step `step`'s recording in Chrome's trace format, with the step, the device, its measured
// joint peak and the plan's prediction (planner::predict_memory, none for LoRA) as metadata; written atomically.
void write_memory_timeline(const Options& options, const engine::MemoryTimeline& timeline,
                           const engine::optim::StepResult& result, int64_t step);

// The peaks of a phase since reset_peak on `device` and the host, as --plan prints its prediction: "peak N B" on the
// CPU backend (one account), "device peak N B, host peak M B" on a device.
std::string phase_peaks(engine::Device device);

} // namespace train_gpt
