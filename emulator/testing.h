// Controls of the emulated CUDA device (ENGINE_CUDA=EMULATE) for tests and the emulator's own tools. The
// engine never calls these; the environment sets the same things for a whole process:
//   ENGINE_EMULATOR_SCHEDULES  "all" or a comma list of round-robin, round-robin-reverse, greedy,
//                              greedy-reverse, random (default round-robin). With several, every launch runs
//                              under each from the same memory and must give bitwise equal results.
//   ENGINE_EMULATOR_SEED       seed of the random schedule (default 0x5eed)
//   ENGINE_EMULATOR_MEMORY_GIB the emulated device's memory (default 16)
//   ENGINE_EMULATOR_STATISTICS 1: print launches, blocks, threads and fiber switches at exit
//   CUDA_VISIBLE_DEVICES       empty (or not starting with 0) hides the one emulated device, as on a GPU
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace engine::emulator {

void set_schedules(const std::vector<std::string>& names);
std::vector<std::string> schedules();

// Forgets a fault (which otherwise ends the emulated context, as a device fault does), so that a test
// that provoked one on purpose leaves a usable device behind. Queued work was dropped by the fault.
void clear_fault();

// The message of the last call into the emulated cuBLAS/cuBLASLt that was refused because it asks for
// something not emulated (also printed to stderr when refused); "" when none was.
std::string last_refusal();

struct EmulatorStatistics {
    uint64_t launches = 0;
    uint64_t blocks = 0;
    uint64_t threads = 0;
    uint64_t switches = 0; // fiber resumptions: one per thread start and one per sync point passed
};
EmulatorStatistics statistics();

// Every operation queued on a stream since the last reset, by kind: a kernel's name, a cuBLAS or cuBLASLt call
// ("cublasGemmEx", "cublasLtMatmul"), a runtime call ("cudaMemsetAsync", "cudaMemcpyAsync", "cudaEventRecord",
// "cudaStreamWaitEvent"). On a GPU each but the event calls is a launch with its gap: the step's census
// (bench/roofline.py counts from it).
std::map<std::string, uint64_t> stream_operations();
void reset_stream_operations();

} // namespace engine::emulator
