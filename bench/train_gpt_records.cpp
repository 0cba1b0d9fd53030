// What train_gpt writes about its steps: the console line, the --log record, the profiler's table, the replica
// check of data parallelism, and the run's settings a training state keeps.
#include "train_gpt_records.h"

#include <cstdio>
#include <sstream>

#include "nn/io/token_data.h"

namespace train_gpt {

using namespace engine;

double mebibytes(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// FNV-1a over the bytes of every parameter and optimizer state: equal on two ranks only if (up to a 2^-64
// chance) their replicas are bitwise equal.
uint64_t replica_hash(optim::Trainer& trainer) {
    uint64_t hash = 0xcbf29ce484222325ull;
    auto add = [&](const Tensor& tensor) {
        const Tensor host = tensor.to(Device::cpu);
        const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
        for (size_t index = 0; index < host.nbytes(); ++index) hash = (hash ^ bytes[index]) * 0x100000001b3ull;
    };
    // ZeRO-3's released parameters are each rank's shard, different by design: the ones kept whole.
    for (const auto& [name, parameter] : trainer.model().named_parameters())
        if (!parameter.storage_released()) add(parameter);
    // Sharded (ZeRO-1) optimizer state differs between ranks by design: then the weights alone.
    if (!trainer.optimizer().sharded())
        for (const auto& [name, state] : trainer.optimizer().named_state()) add(state);
    return hash;
}

// Throws on every rank when some rank's replica differs from rank 0's (a broadcast and a count reduction,
// outside any step's counters).
void check_replicas(distributed::Communicator& communicator, uint64_t hash, int64_t step) {
    const uint64_t own = hash;
    const Tensor root = Tensor::from_vector<int32_t>({static_cast<int32_t>(hash & 0xFFFFFFFFu), static_cast<int32_t>(hash >> 32)},
                                                     {2}, Device::cpu);
    communicator.broadcast(root, 0);
    const std::vector<int32_t> halves = root.to_vector<int32_t>();
    const uint64_t root_hash = static_cast<uint32_t>(halves[0]) | uint64_t{static_cast<uint32_t>(halves[1])} << 32;
    const int64_t differing = communicator.all_reduce_count(own != root_hash ? 1 : 0);
    ENGINE_CHECK(differing == 0, "after step " << step << ", " << differing << " of " << communicator.world_size()
                                               << " ranks hold weights or optimizer state that differ from rank 0's");
}

nlohmann::json step_record(const optim::StepResult& result) {
    nlohmann::json peak_mib;
    for (int index = 0; index < memory_category_count; ++index)
        peak_mib[memory_category_name(static_cast<MemoryCategory>(index))] = mebibytes(result.memory.peak_by_category[index]);
    nlohmann::json host_peak_mib; // the host's account: the offloaded model state and pinned inputs
    for (int index = 0; index < memory_category_count; ++index)
        host_peak_mib[memory_category_name(static_cast<MemoryCategory>(index))] =
            mebibytes(result.host_memory.peak_by_category[index]);
    const distributed::CommunicatorCounters& calls = result.communication;
    return {{"step", result.step},
            {"loss", result.loss},
            {"lr", result.learning_rate},
            {"grad_norm", result.grad_norm},
            {"tokens", result.tokens},
            {"num_items_in_batch", result.num_items_in_batch},
            {"rank_num_items_in_batch", result.rank_num_items_in_batch},
            {"micro_batches", result.micro_batches},
            {"seconds", result.seconds},
            {"tokens_per_second", result.tokens_per_second},
            {"peak_mib", peak_mib},
            {"peak_total_mib", mebibytes(result.memory.peak_bytes)},
            {"peak_total_bytes", result.memory.peak_bytes},
            {"host_peak_mib", host_peak_mib},
            {"host_peak_total_bytes", result.host_memory.peak_bytes},
            {"skipped", result.skipped},
            {"redone", result.redone},
            {"communication", {{"gradient_all_reduces", calls.gradient_all_reduces},
                               {"reduce_scatters", calls.reduce_scatters},
                               {"all_gathers", calls.all_gathers},
                               {"reduces", calls.reduces},
                               {"count_all_reduces", calls.count_all_reduces},
                               {"value_all_reduces", calls.value_all_reduces},
                               {"broadcasts", calls.broadcasts},
                               {"barriers", calls.barriers},
                               {"backend_calls", calls.backend_calls},
                               {"bytes_reduced", calls.bytes_reduced}}}};
}

// The profiler's table with the steps' wall time it covers, for the last --log line.
nlohmann::json profile_record(const profiling::Snapshot& snapshot, double step_seconds, int64_t steps,
                              int64_t warmup_steps_excluded) {
    nlohmann::json ops = nlohmann::json::array();
    for (const profiling::OpRecord& record : snapshot.records)
        ops.push_back({{"op", record.op},
                       {"phase", profiling::phase_name(record.phase)},
                       {"category", record.category},
                       {"calls", record.calls},
                       {"seconds", record.seconds}});
    nlohmann::json categories = nlohmann::json::object();
    for (const profiling::OpRecord& record : snapshot.records)
        categories[record.category] = categories.value(record.category, 0.0) + record.seconds;
    const double gemm = snapshot.seconds_in_category("gemm");
    return {{"steps", steps},
            {"warmup_steps_excluded", warmup_steps_excluded},
            {"step_seconds", step_seconds},
            {"profiled_seconds", snapshot.total_seconds},
            {"unprofiled_seconds", step_seconds - snapshot.total_seconds},
            {"gemm_share_of_step", step_seconds > 0.0 ? gemm / step_seconds : 0.0},
            {"gemm_share_of_profiled", snapshot.total_seconds > 0.0 ? gemm / snapshot.total_seconds : 0.0},
            {"category_seconds", categories},
            {"ops", ops}};
}

std::string step_line(const optim::StepResult& result, int64_t max_steps) {
    char head[256];
    std::snprintf(head, sizeof head, "step %4lld/%lld | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | peak MiB:",
                  static_cast<long long>(result.step), static_cast<long long>(max_steps), result.loss,
                  result.learning_rate, result.grad_norm, result.tokens_per_second);
    std::ostringstream line;
    line << head;
    char figure[64];
    for (int index = 0; index < memory_category_count; ++index) {
        std::snprintf(figure, sizeof figure, " %s %.2f", memory_category_name(static_cast<MemoryCategory>(index)),
                      mebibytes(result.memory.peak_by_category[index]));
        line << figure;
    }
    std::snprintf(figure, sizeof figure, " | total %.2f", mebibytes(result.memory.peak_bytes));
    line << figure;
    if (result.skipped) line << " | SKIPPED: non-finite loss or gradients, no update";
    if (result.redone > 0) line << " | window redone " << result.redone << "x (--batch-invariant: a gradient past its bound)";
    return line.str();
}

// What a saved training state records about the run, for the reader of the file.
std::string run_config_json(const Options& options) {
    const optim::TrainerConfig& trainer = options.trainer;
    return nlohmann::json{{"model", options.model_name},
                          {"model_config", options.model.to_string()},
                          {"seq_len", options.seq_len},
                          {"data", options.data.empty() ? "built-in corpus" : options.data},
                          {"data_layout", nn::data_layout_name(options.data_layout)},
                          {"eot_token", options.eot_token},
                          {"max_tokens_per_micro_batch", options.max_tokens_per_micro_batch},
                          {"per_device_train_batch_size", trainer.shape.per_device_train_batch_size},
                          {"gradient_accumulation_steps", trainer.shape.gradient_accumulation_steps},
                          {"learning_rate", trainer.learning_rate},
                          {"lr_scheduler_type", trainer.lr_scheduler_type},
                          {"max_steps", trainer.max_steps},
                          {"seed", trainer.seed},
                          {"optimizer", optimizer_kind_name(trainer.optimizer)},
                          {"gradient_checkpointing", trainer.shape.checkpointing.enabled},
                          {"zero_stage", trainer.shape.zero_stage},
                          {"offload_optimizer", trainer.shape.offload_optimizer},
                          {"offload_gradients", gradient_offload_name(trainer.shape.offload_gradients)},
                          {"offload_parameters", trainer.shape.offload_parameters},
                          {"loss_chunk_tokens", trainer.shape.loss_chunk_tokens},
                          {"mlp_tile_tokens", trainer.shape.mlp_tile_tokens},
                          {"precision", precision_name(trainer.shape.precision)},
                          {"load_in_4bit", options.load_in_4bit}}
        .dump();
}

} // namespace train_gpt
