// The streaming LM head against the whole logits, and the tiled MLP against the whole MLP, side by side in one run:
// one optimizer step of a trainer per iteration (Trainer::train_step: forward, loss, backward, clip, AdamW), with
// --loss-chunk-tokens off, auto and a small chunk (the MLP whole), then the MLP in small tiles (the head off) and
// both small, reporting the step time, tokens/s and the step's activation and joint peaks.
//
//   bench_loss_head                          GPT-2 124M and SmolLM-135M (the small Llama), B 1, T 1024, f32,
//                                            on the CPU (a step takes seconds: --benchmark_min_time=0.01 keeps
//                                            the run to a few minutes)
//   bench_loss_head --models=tiny,llama-tiny --seq=64 --batch=4      other sizes
//
// Flags (each --name=value): --models (comma-separated ModelConfig::named names), --seq, --batch,
// --small-chunk and --small-tile (tokens; default 256 each), --device=cpu|cuda. Anything else goes to Google
// Benchmark. Names: loss_head/<model>/<chunk>/mlp_<tile>.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "engine/cuda/runtime.h"
#include "nn/model_config.h"
#include "optim/trainer.h"
#include "planner/memory_model.h"

namespace {

using namespace engine;

struct Options {
    std::vector<std::string> models = {"gpt2-124M", "smollm-135m"};
    int seq = 1024, batch = 1, small_chunk = 256, small_tile = 256;
    Device device = Device::cpu;
};

// A model, its trainer and one fixed micro-batch per (model, chunk, tile): built on the benchmark's first call.
struct Session {
    Session(const nn::ModelConfig& config, const Options& options, int chunk, int tile)
        : model(config.build(1, options.device, DType::f32)) {
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = options.batch;
        trainer_config.shape.loss_chunk_tokens = chunk;
        trainer_config.shape.mlp_tile_tokens = tile;
        trainer_config.learning_rate = 3e-4;
        trainer_config.max_steps = int64_t(1) << 40;
        trainer = std::make_unique<optim::Trainer>(*model, trainer_config);
        std::mt19937_64 generator(5);
        std::uniform_int_distribution<int32_t> token(0, config.vocab_size() - 1);
        std::vector<int32_t> ids(static_cast<size_t>(options.batch) * options.seq);
        for (int32_t& id : ids) id = token(generator);
        batch.inputs = Tensor::from_vector(ids, {options.batch, options.seq}, options.device);
        batch.labels = batch.inputs;
    }
    nn::BatchSource source() {
        return [this]() -> std::optional<nn::Batch> { return batch; };
    }
    std::unique_ptr<nn::CausalLM> model;
    std::unique_ptr<optim::Trainer> trainer;
    nn::Batch batch;
};

constexpr double mebibyte = 1024.0 * 1024.0;

void run_step(benchmark::State& state, const nn::ModelConfig& config, const Options& options, int chunk, int tile) {
    optim::StepResult last;
    try {
        Session session(config, options, chunk, tile);
        session.trainer->train_step(session.source()); // warm-up: first touch, BLAS set-up
        engine::cuda::synchronize(options.device);
        for (auto _ : state) {
            last = *session.trainer->train_step(session.source());
            engine::cuda::synchronize(options.device);
        }
    } catch (const std::exception& error) {
        state.SkipWithError(error.what());
        return;
    }
    state.counters["tokens"] =
        benchmark::Counter(static_cast<double>(last.tokens) * static_cast<double>(state.iterations()),
                           benchmark::Counter::kIsRate);
    state.counters["loss"] = last.loss;
    state.counters["act_MiB"] = static_cast<double>(last.memory.peak(MemoryCategory::activations)) / mebibyte;
    state.counters["peak_MiB"] = static_cast<double>(last.memory.peak_bytes) / mebibyte;
    state.SetLabel(config.to_string() + ", B " + std::to_string(options.batch) + ", T " + std::to_string(options.seq) +
                   ", loss chunks " + (chunk == 0 ? std::string("off") : std::to_string(chunk)) + ", MLP tiles " +
                   (tile == 0 ? std::string("off") : std::to_string(tile)));
}

int positive(const char* name, const char* text) { return bench::positive_flag("bench_loss_head", name, text); }

} // namespace

int main(int argc, char** argv) {
    Options options;
    std::vector<char*> remaining = bench::split_flags(argc, argv, {
        {"--models", [&](const char* text) { options.models = bench::model_list(text); }},
        {"--seq", [&](const char* text) { options.seq = positive("--seq", text); }},
        {"--batch", [&](const char* text) { options.batch = positive("--batch", text); }},
        {"--small-chunk", [&](const char* text) { options.small_chunk = positive("--small-chunk", text); }},
        {"--small-tile", [&](const char* text) { options.small_tile = positive("--small-tile", text); }},
        {"--device", [&](const char* text) { options.device = bench::device_flag("bench_loss_head", text); }},
    });
    const std::vector<nn::ModelConfig> configs = bench::named_models("bench_loss_head", options.models, options.seq);
    if (!bench::start_benchmark(remaining)) return 2;
    for (size_t index = 0; index < configs.size(); ++index) {
        const nn::ModelConfig& config = configs[index];
        const int automatic = planner::automatic_loss_chunk(config, options.batch, options.seq, DType::f32);
        const int automatic_tile = planner::automatic_mlp_tile(config, options.batch, options.seq, DType::f32);
        const std::string chunk = std::to_string(options.small_chunk), tile = std::to_string(options.small_tile);
        struct Variant {
            std::string chunk_name, tile_name;
            int chunk, tile;
        };
        for (const Variant& variant : {Variant{"off", "off", 0, 0}, Variant{"auto", "auto", automatic, automatic_tile},
                                       Variant{chunk, "off", options.small_chunk, 0},
                                       Variant{"off", tile, 0, options.small_tile},
                                       Variant{chunk, tile, options.small_chunk, options.small_tile}}) {
            const std::string name =
                "loss_head/" + options.models[index] + "/" + variant.chunk_name + "/mlp_" + variant.tile_name;
            benchmark::RegisterBenchmark(name.c_str(), [config, options, variant](benchmark::State& state) {
                run_step(state, config, options, variant.chunk, variant.tile);
            })->Unit(benchmark::kMillisecond)->UseRealTime();
        }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
