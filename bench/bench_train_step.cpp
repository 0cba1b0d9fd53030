// One optimizer step of a GPT (engine::optim::Trainer::train_step: accum micro-batches of forward, loss
// and backward, then clip, AdamW, zero_grad) per iteration, reporting tokens/s and the step's peak memory
// by category (MiB, from StepResult.memory, the allocator's accounting).
//
//   bench_train_step                        CUDA when a device is present: GPT-2 124M (12 layers, width 768,
//                                           12 heads, vocab 50257), B 4, T 1024, fp32 and TF32;
//                                           else the CPU: a tiny GPT (2 layers, width 64, 4 heads, vocab
//                                           256), B 4, T 64, about 20 ms a step
//   bench_train_step --device=cpu --layers=12 --width=128 --seq=128 --vocab=512      any other size
//
// Flags (each --name=value): --layers --width --heads --seq --batch --accum --vocab, --device=cpu|cuda,
// --tf32=0|1 (CUDA only; both when absent). Anything else goes to Google Benchmark. Tokens are random ids,
// prepared on the device once, so the figures measure the step and not the data pipeline.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "nn/gpt.h"
#include "optim/trainer.h"
#include "engine/cuda/runtime.h"

namespace {

using namespace engine;

// 0 means "the device's default" (see the top of the file).
struct Options {
    int layers = 0, width = 0, heads = 0, seq = 0, batch = 0, accum = 0, vocab = 0;
    std::string device; // "", "cpu" or "cuda"
    int tf32 = -1;      // -1: both on CUDA
};

struct TrainShape {
    nn::GPTConfig model;
    int batch = 0;
    int accum = 0;
    Device device = Device::cpu;
};

bool cuda_available() { return engine::cuda::device_available(); }

TrainShape resolve(const Options& options, Device device) {
    const bool large = device == Device::cuda;
    const auto pick = [](int given, int fallback) { return given > 0 ? given : fallback; };
    TrainShape shape;
    shape.device = device;
    shape.model.n_layer = pick(options.layers, large ? 12 : 2);
    shape.model.n_embd = pick(options.width, large ? 768 : 64);
    shape.model.n_head = pick(options.heads, large ? 12 : 4);
    shape.model.max_seq_len = pick(options.seq, large ? 1024 : 64);
    shape.model.vocab_size = pick(options.vocab, large ? 50257 : 256);
    shape.model.dropout = 0.0f;
    shape.batch = pick(options.batch, 4);
    shape.accum = pick(options.accum, 1);
    return shape;
}

// The model, its trainer and the micro-batches, built once and shared by every call of the benchmark
// function (Google Benchmark calls it several times while it settles the iteration count).
struct Session {
    explicit Session(const TrainShape& shape) : model(shape.model, 1, shape.device, DType::f32) {
        optim::TrainerConfig config;
        config.shape.per_device_train_batch_size = shape.batch;
        config.shape.gradient_accumulation_steps = shape.accum;
        config.learning_rate = 3e-4;
        config.weight_decay = 0.1;
        config.max_steps = int64_t(1) << 40; // the constant schedule never ends inside a benchmark
        trainer = std::make_unique<optim::Trainer>(model, config);
        model.train(true);

        const int T = shape.model.max_seq_len;
        std::mt19937_64 generator(5);
        std::uniform_int_distribution<int32_t> token(0, shape.model.vocab_size - 1);
        for (int index = 0; index < shape.accum; ++index) {
            std::vector<int32_t> ids(static_cast<size_t>(shape.batch) * T);
            for (int32_t& id : ids) id = token(generator);
            nn::Batch batch;
            batch.inputs = Tensor::from_vector(ids, {shape.batch, T}, shape.device);
            batch.labels = batch.inputs; // unshifted, as Hugging Face: the trainer shifts them
            batches.push_back(batch);
        }
        for (const Tensor& parameter : model.parameters()) parameter_count += parameter.numel();
    }

    nn::BatchSource source() {
        return [this]() -> std::optional<nn::Batch> { return batches[next++ % batches.size()]; };
    }

    nn::GPT model;
    std::unique_ptr<optim::Trainer> trainer;
    std::vector<nn::Batch> batches;
    size_t next = 0;
    int64_t parameter_count = 0;
};

// The update is queued on the stream, not yet done.
void synchronize(Device device) { engine::cuda::synchronize(device); }

constexpr double mebibyte = 1024.0 * 1024.0;

void run_train_step(benchmark::State& state, const TrainShape& shape, std::shared_ptr<Session>* session, bool tf32) {
    if (shape.device == Device::cuda) {
        if (!engine::cuda::device_available()) {
            state.SkipWithError(engine::cuda::backend_built ? "no CUDA device" : "this build of libengine has no CUDA backend");
            return;
        }
        engine::cuda::set_tf32_enabled(tf32);
    }
    optim::StepResult last;
    try {
        if (!*session) {
            *session = std::make_shared<Session>(shape);
            (*session)->trainer->train_step((*session)->source()); // warm-up: first touch, BLAS set-up, pools
            synchronize(shape.device);
        }
        for (auto _ : state) {
            last = *(*session)->trainer->train_step((*session)->source());
            synchronize(shape.device);
        }
    } catch (const std::exception& error) { // out of memory at a large size, most likely
        state.SkipWithError(error.what());
    }
    if (shape.device == Device::cuda) engine::cuda::set_tf32_enabled(false);
    if (state.error_occurred()) return;
    const auto peak = [&](MemoryCategory category) {
        return static_cast<double>(last.memory.peak(category)) / mebibyte;
    };
    const double tokens = static_cast<double>(last.tokens) * static_cast<double>(state.iterations());
    state.counters["tokens"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
    state.counters["loss"] = last.loss;
    state.counters["params_M"] = static_cast<double>((*session)->parameter_count) / 1e6;
    state.counters["param_MiB"] = peak(MemoryCategory::parameters);
    state.counters["grad_MiB"] = peak(MemoryCategory::gradients);
    state.counters["optim_MiB"] = peak(MemoryCategory::optimizer_state);
    state.counters["act_MiB"] = peak(MemoryCategory::activations);
    state.counters["work_MiB"] = peak(MemoryCategory::workspace);
    state.counters["peak_MiB"] = static_cast<double>(last.memory.peak_bytes) / mebibyte;
    const nn::GPTConfig& model = shape.model;
    state.SetLabel(std::to_string(model.n_layer) + " layers, width " + std::to_string(model.n_embd) + ", " +
                   std::to_string(model.n_head) + " heads, vocab " + std::to_string(model.vocab_size) + ", B " +
                   std::to_string(shape.batch) + ", T " + std::to_string(model.max_seq_len) + ", accum " +
                   std::to_string(shape.accum));
}

} // namespace

int main(int argc, char** argv) {
    Options options;
    const auto size = [](const char* name, int* value) {
        return std::pair<const std::string, std::function<void(const char*)>>(
            name, [name, value](const char* text) { *value = bench::positive_flag("bench_train_step", name, text); });
    };
    std::vector<char*> remaining = bench::split_flags(argc, argv, {
        size("--layers", &options.layers), size("--width", &options.width), size("--heads", &options.heads),
        size("--seq", &options.seq), size("--batch", &options.batch), size("--accum", &options.accum),
        size("--vocab", &options.vocab),
        {"--device", [&](const char* text) { options.device = bench::device_flag("bench_train_step", text) == Device::cuda ? "cuda" : "cpu"; }},
        {"--tf32", [&](const char* text) {
             if (std::strcmp(text, "0") != 0 && std::strcmp(text, "1") != 0) {
                 std::fprintf(stderr, "bench_train_step: --tf32 must be 0 or 1, got '%s'\n", text);
                 std::exit(2);
             }
             options.tf32 = text[0] - '0';
         }},
    });
    // An explicit --device=cuda without a device still registers, so the run reports the skip.
    const bool use_cuda = options.device == "cuda" || (options.device.empty() && cuda_available());
    const Device device = use_cuda ? Device::cuda : Device::cpu;
    const TrainShape shape = resolve(options, device);
    try {
        shape.model.validate();
    } catch (const EngineError& error) {
        std::fprintf(stderr, "bench_train_step: %s\n", error.what());
        return 2;
    }
    if (!bench::start_benchmark(remaining)) return 2;

    std::vector<bool> math_modes{false};
    if (device == Device::cuda && options.tf32 < 0) math_modes = {false, true};
    if (device == Device::cuda && options.tf32 >= 0) math_modes = {options.tf32 == 1};
    // One session for every math mode: the model and optimizer state are allocated once.
    auto session = std::make_shared<std::shared_ptr<Session>>();
    for (const bool tf32 : math_modes) {
        std::string name = std::string("train_step/") + device_name(device);
        if (device == Device::cuda) name += tf32 ? "/tf32" : "/fp32";
        benchmark::RegisterBenchmark(name.c_str(),
                                     [shape, session, tf32](benchmark::State& state) {
                                         run_train_step(state, shape, session.get(), tf32);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
