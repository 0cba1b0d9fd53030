// What the emulated CUDA device costs (ENGINE_CUDA=EMULATE builds only): a thread's start, a block barrier
// and a warp shuffle, per thread, under one schedule and under all five (each launch replayed per schedule).
// The design budget was about 20 ns per thread per barrier; docs/PERF.md has the measurements.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "base/cuda/launch.h"
#include "emulator/testing.h"

namespace {

constexpr int threads_per_block = 256;
constexpr int sync_points = 64;

__global__ void empty_kernel(float* out) {
    if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}

__global__ void barrier_kernel(float* out) {
    float value = static_cast<float>(threadIdx.x);
    for (int round = 0; round < sync_points; ++round) {
        value += 1.0f;
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

__global__ void shuffle_kernel(float* out) {
    float value = static_cast<float>(threadIdx.x);
    for (int round = 0; round < sync_points; ++round) value += __shfl_xor_sync(0xffffffffu, value, round % 32);
    out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

template <void (*kernel)(float*)>
void run_kernel(benchmark::State& state, const char* name, bool all_schedules, int sync_points_per_thread) {
    const int blocks = static_cast<int>(state.range(0));
    engine::emulator::set_schedules(all_schedules ? std::vector<std::string>{"round-robin", "round-robin-reverse", "greedy",
                                                                             "greedy-reverse", "random"}
                                                  : std::vector<std::string>{"round-robin"});
    float* out = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float) * blocks * threads_per_block));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (auto _ : state) {
        (void)::engine::emulator::launch(name, kernel, blocks, threads_per_block, 0, stream, out);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    const double thread_runs = double(blocks) * threads_per_block * (all_schedules ? 5 : 1);
    state.counters["ns_per_thread"] =
        benchmark::Counter(thread_runs, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
    if (sync_points_per_thread > 0) {
        state.counters["ns_per_thread_sync"] = benchmark::Counter(thread_runs * sync_points_per_thread,
                                                                  benchmark::Counter::kIsIterationInvariantRate |
                                                                      benchmark::Counter::kInvert);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaFree(out));
    engine::emulator::set_schedules({"round-robin"});
}

void BM_ThreadStart(benchmark::State& state) { run_kernel<empty_kernel>(state, "empty_kernel", false, 0); }
void BM_Barrier(benchmark::State& state) { run_kernel<barrier_kernel>(state, "barrier_kernel", false, sync_points); }
void BM_Shuffle(benchmark::State& state) { run_kernel<shuffle_kernel>(state, "shuffle_kernel", false, sync_points); }
void BM_BarrierAllSchedules(benchmark::State& state) {
    run_kernel<barrier_kernel>(state, "barrier_kernel", true, sync_points);
}

BENCHMARK(BM_ThreadStart)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Barrier)->Arg(16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Shuffle)->Arg(16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BarrierAllSchedules)->Arg(16)->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
