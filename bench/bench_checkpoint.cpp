// Checkpoint policies side by side: one GPT training step (forward, loss, backward, zero_grad) per
// iteration, reporting step time and the allocator's peak memory next to the memory model's prediction.
//
//   bench_checkpoint                                   small default model, a few seconds on 2 cores
//   bench_checkpoint --layers=12 --width=128 --seq=128 --batch=4 --vocab=512   a larger model (also --heads,
//                                                      --dropout_percent); docs/PERF.md has both tables
//   bench_checkpoint --benchmark_format=json           the same table as JSON
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "planner/memory_model.h"

namespace {

using engine::checkpoint::CheckpointPolicy;

struct BenchShape {
    engine::nn::GPTConfig config;
    int batch = 4;
    int seq_len = 64;
};

BenchShape default_shape() {
    BenchShape shape;
    shape.config.vocab_size = 256;
    shape.config.max_seq_len = 64;
    shape.config.n_layer = 8;
    shape.config.n_head = 4;
    shape.config.n_embd = 64;
    shape.config.dropout = 0.1f;
    return shape;
}

constexpr double mebibyte = 1024.0 * 1024.0;

void run_policy(benchmark::State& state, const BenchShape& shape, const CheckpointPolicy& policy) {
    using namespace engine;
    nn::GPT model(shape.config, 1, Device::cpu, DType::f32);
    model.train(true);
    model.set_checkpointing(policy);
    std::mt19937_64 generator(5);
    std::uniform_int_distribution<int32_t> token(0, shape.config.vocab_size - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(shape.batch * shape.seq_len)), targets(tokens.size());
    for (int32_t& value : tokens) value = token(generator);
    for (int32_t& value : targets) value = token(generator);
    const Tensor token_tensor = Tensor::from_vector(tokens, {shape.batch, shape.seq_len}, Device::cpu);
    const Tensor target_tensor = Tensor::from_vector(targets, {shape.batch, shape.seq_len}, Device::cpu);
    manual_seed(11);

    const MemoryStats before = memory_stats(Device::cpu);
    reset_peak(Device::cpu);
    size_t recomputed = 0;
    for (auto _ : state) {
        checkpoint::reset_recomputed_segment_count();
        {
            Tensor loss;
            {
                Tensor logits = model.forward_padded(token_tensor); // (B,T,Vp), as the trainer
                const double inverse_items = 1.0 / static_cast<double>(targets.size());
                loss = multiply(cross_entropy_in_place(logits, target_tensor, Reduction::sum, inverse_items,
                                                       default_ignore_index, shape.config.vocab_size),
                                inverse_items);
            }
            backward(loss);
        }
        model.zero_grad();
        recomputed = checkpoint::recomputed_segment_count();
    }
    const MemoryStats after = memory_stats(Device::cpu);
    const planner::MemoryPrediction predicted = planner::predict_memory(
        shape.config, shape.batch, shape.seq_len, policy, DType::f32, planner::OptimizerKind::none);
    const auto rise = [&](MemoryCategory category) {
        return static_cast<double>(after.peak(category) - before.current(category));
    };
    // Device total: parameters and gradients (live throughout) plus the step's joint peak of the rest.
    const double device_peak = static_cast<double>(after.peak_bytes - before.current_bytes) -
                               static_cast<double>(after.peak(MemoryCategory::pinned_host) -
                                                   before.current(MemoryCategory::pinned_host)) +
                               static_cast<double>(before.current(MemoryCategory::parameters) +
                                                   before.current(MemoryCategory::gradients));
    state.counters["act_MiB"] = rise(MemoryCategory::activations) / mebibyte;
    state.counters["act_pred_MiB"] = static_cast<double>(predicted.of(MemoryCategory::activations)) / mebibyte;
    state.counters["work_MiB"] = rise(MemoryCategory::workspace) / mebibyte;
    state.counters["device_MiB"] = device_peak / mebibyte;
    state.counters["pinned_MiB"] = rise(MemoryCategory::pinned_host) / mebibyte;
    state.counters["recomputed"] = static_cast<double>(recomputed);
    state.SetLabel(shape.config.to_string() + ", B " + std::to_string(shape.batch) + ", T " +
                   std::to_string(shape.seq_len));
}

// Takes --name=value for our own flags and leaves the rest for Google Benchmark.
bool take_flag(const char* argument, const char* name, int* value) {
    const size_t length = std::strlen(name);
    if (std::strncmp(argument, name, length) != 0 || argument[length] != '=') return false;
    *value = std::atoi(argument + length + 1);
    return true;
}

} // namespace

int main(int argc, char** argv) {
    BenchShape shape = default_shape();
    int dropout_percent = 10;
    std::vector<char*> remaining{argv[0]};
    for (int index = 1; index < argc; ++index) {
        const char* argument = argv[index];
        if (take_flag(argument, "--layers", &shape.config.n_layer) ||
            take_flag(argument, "--width", &shape.config.n_embd) ||
            take_flag(argument, "--heads", &shape.config.n_head) ||
            take_flag(argument, "--vocab", &shape.config.vocab_size) || take_flag(argument, "--seq", &shape.seq_len) ||
            take_flag(argument, "--batch", &shape.batch) || take_flag(argument, "--dropout_percent", &dropout_percent))
            continue;
        remaining.push_back(argv[index]);
    }
    shape.config.max_seq_len = shape.seq_len;
    shape.config.dropout = static_cast<float>(dropout_percent) / 100.0f;
    try {
        shape.config.validate();
    } catch (const engine::EngineError& error) {
        std::fprintf(stderr, "bench_checkpoint: %s\n", error.what());
        return 2;
    }
    int remaining_count = static_cast<int>(remaining.size());
    benchmark::Initialize(&remaining_count, remaining.data());

    const std::vector<std::pair<std::string, CheckpointPolicy>> policies = {
        {"none", CheckpointPolicy{false, 1, 1, false}},          {"every_n_1", CheckpointPolicy{true, 1, 1, false}},
        {"every_n_2", CheckpointPolicy{true, 2, 1, false}},      {"every_n_4", CheckpointPolicy{true, 4, 1, false}},
        {"segment_sqrt", CheckpointPolicy{true, 1, 0, false}},   {"every_n_1_offload", CheckpointPolicy{true, 1, 1, true}},
    };
    for (const auto& [name, policy] : policies) {
        benchmark::RegisterBenchmark(("checkpoint/" + name).c_str(),
                                     [shape, policy](benchmark::State& state) { run_policy(state, shape, policy); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime()
            // On a shared machine the fastest repetition is the one least disturbed by other processes.
            ->ComputeStatistics("min", [](const std::vector<double>& values) {
                return *std::min_element(values.begin(), values.end());
            });
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
