// The load, save and resume phases' memory (optim/training_state.h streams the state between the file and where each
// tensor lives): what the accounts hold between steps, and on a device one pinned block on the host.
// docs/MEMORY.md, "Phases outside the step".
#include <algorithm>

#include "engine/io/state_file.h"
#include "planner/memory_model.h"

namespace engine::planner {

StatePhasesPrediction predict_state_phases(const MemoryPrediction& step, Device device, bool offload_optimizer) {
    StatePhasesPrediction phases;
    if (device == Device::cpu) {
        // One account, and every tensor already in host memory: the stream writes from it and reads into it.
        phases.device_save_peak = step.between_steps_bytes + step.host_between_steps_bytes;
        phases.device_resume_peak = phases.device_save_peak;
        return phases;
    }
    // With the optimizer on the host every saved tensor is there (the masters, the state, ZeRO-1's buffers): no block.
    phases.staging = offload_optimizer ? 0 : io::state_staging_bytes;
    phases.device_resume_peak = step.between_steps_bytes;
    // After the first step the device also keeps cuBLASLt's workspace (GPT-2's biased linears make it).
    phases.device_save_peak = step.between_steps_bytes + step.cuda_runtime_bytes;
    phases.host_save_peak = step.host_between_steps_bytes + phases.staging;
    phases.pinned_peak = step.parked_working_copies + phases.staging;
    // A resume ends by refreshing the working copies from the masters it wrote: with the masters on the host, through
    // the step's rounded copy (bf16).
    phases.host_resume_peak = step.host_between_steps_bytes + std::max(phases.staging, step.host_rounding_bytes);
    return phases;
}

LoadPhasePrediction predict_load_phase(const nn::ModelConfig& config, Device device, bool built_on_host) {
    // A full fine-tune's f32 parameters (GPT-2's padded rows too) and gradients, and the constant buffers.
    const ModelState built = predict_model_state(config, DType::f32, OptimizerKind::adamw, 1);
    const size_t bytes = built.parameters + built.gradients;
    LoadPhasePrediction load;
    if (device == Device::cpu || built_on_host) load.host_peak = bytes;
    else load.device_peak = bytes;
    if (device == Device::cpu) load.device_peak = bytes; // one account
    return load;
}

} // namespace engine::planner
