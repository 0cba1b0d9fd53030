// The host step of optimizer offload (issue 26), on this machine: AdamW over the f32 masters and the rounding
// of each updated master into its bf16 working copy, through the code the trainer runs (optim::AdamW's step,
// then the working copies' conversion), at 100M+ parameters; beside it a STREAM-like triad that measures what
// the memory sustains in the same process. bench/compare_host_step.sh runs PyTorch's CPU AdamW beside it.
//   BM_triad                 a = b + s·c over three f32 arrays of the step's size: the bandwidth ceiling
//   BM_host_step/<threads>   AdamW (+ the bf16 write) over 100 tensors of 2^20 elements
// bytes_per_second: what each moves (the step: 30 B per parameter); bench/compare_host_step.sh divides them.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/engine.h"
#include "optim/optimizer.h"

namespace {

using namespace engine;

constexpr int tensor_count = 100;
constexpr int64_t tensor_elements = int64_t(1) << 20; // 104,857,600 parameters in all
constexpr double step_bytes_per_parameter = 30.0;    // p, g, m, v read; p, m, v written (f32); bf16 written

void BM_triad(benchmark::State& state) {
    omp_set_num_threads(static_cast<int>(state.range(0)));
    const size_t count = static_cast<size_t>(tensor_count) * static_cast<size_t>(tensor_elements);
    std::vector<float> a(count), b(count, 1.0f), c(count, 2.0f);
    const float scale = 3.0f;
    for (auto _ : state) {
        const auto start = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) a[i] = b[i] + scale * c[i];
        benchmark::DoNotOptimize(a.data());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        state.SetIterationTime(seconds);
    }
    // Three arrays move (two read, one written; the write's read-for-ownership is not counted, as STREAM does).
    const double bytes = 3.0 * sizeof(float) * static_cast<double>(count);
    state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void BM_host_step(benchmark::State& state) {
    omp_set_num_threads(static_cast<int>(state.range(0))); // the engine's CPU kernels' threads (libgomp)
    optim::NamedTensors named;
    std::vector<Tensor> working;
    for (int index = 0; index < tensor_count; ++index) {
        Tensor master = Tensor::full({tensor_elements}, 0.01, DType::f32, Device::cpu, MemoryCategory::parameters);
        master.set_requires_grad(true);
        master.grad().copy_from(Tensor::full({tensor_elements}, 1e-3, DType::f32, Device::cpu));
        named.emplace_back("p" + std::to_string(index), master);
        working.push_back(Tensor::empty({tensor_elements}, DType::bf16, Device::cpu, MemoryCategory::parameters));
    }
    optim::AdamW adamw(named, optim::AdamWOptions{1e-3, 0.9, 0.95, 1e-8, 0.1}, optim::decay_matrices_only);
    for (auto _ : state) {
        const auto start = std::chrono::steady_clock::now();
        adamw.step(1.0);
        for (size_t index = 0; index < working.size(); ++index) convert_into(working[index], named[index].second);
        state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double bytes = step_bytes_per_parameter * tensor_count * static_cast<double>(tensor_elements);
    state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
    state.counters["parameters"] = static_cast<double>(tensor_count) * static_cast<double>(tensor_elements);
}

BENCHMARK(BM_triad)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_host_step)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);

} // namespace

BENCHMARK_MAIN();
