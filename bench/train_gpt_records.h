// What train_gpt writes about its steps (bench/train_gpt_records.cpp): the console line, the --log record, the
// profiler's table, the replica check of data parallelism, and the run's settings a training state keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/distributed/communicator.h"
#include "engine/profiling.h"
#include "optim/trainer.h"
#include "train_gpt_options.h"

namespace train_gpt {

double mebibytes(size_t bytes);

// FNV-1a over the bytes of every parameter and (unsharded) optimizer state: equal on two ranks only if (up to a
// 2^-64 chance) their replicas are bitwise equal.
uint64_t replica_hash(engine::optim::Trainer& trainer);
// Throws on every rank when some rank's replica differs from rank 0's (a broadcast and a count reduction,
// outside any step's counters).
void check_replicas(engine::distributed::Communicator& communicator, uint64_t hash, int64_t step);

// One step's --log line: loss, rate, norm, items, throughput, the peaks by category on both accounts, the collectives.
nlohmann::json step_record(const engine::optim::StepResult& result);
// --profile: the first steps fill the caches, the allocator's pools and OpenBLAS's buffers, so the table
// covers the steps after them (all steps when the run has no more).
constexpr int64_t profile_warmup_steps = 2;
// The profiler's table with the steps' wall time it covers, for the last --log line.
nlohmann::json profile_record(const engine::profiling::Snapshot& snapshot, double step_seconds, int64_t steps,
                              int64_t warmup_steps_excluded);
// The console's line for a step.
std::string step_line(const engine::optim::StepResult& result, int64_t max_steps);
// What a saved training state records about the run, for the reader of the file.
std::string run_config_json(const Options& options);

} // namespace train_gpt
