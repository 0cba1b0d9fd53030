// A LoRA step and a QLoRA step against a full fine-tune step of the same model, side by side in one run: one
// optimizer step of a trainer per iteration (Trainer::train_step: forward, loss, backward, clip, AdamW), with every
// parameter training, with LoRA adapters (the base frozen: no weight-gradient GEMM, no optimizer state for it), and
// with the same adapters over an NF4 base (each linear weight dequantised for every use), reporting the step time,
// tokens/s and the step's joint peak. The QLoRA step less the LoRA step is the dequantisation's cost.
//
//   bench_fine_tune                          SmolLM-135M (the small Llama) and GPT-2 124M, B 1, T 512, f32, on the
//                                            CPU; LoRA r 16 on every linear layer but the head (all-linear)
//   bench_fine_tune --models=llama-tiny --seq=64 --batch=4 --rank=8      other sizes
//
// Flags (each --name=value): --models (comma-separated ModelConfig::named names), --seq, --batch, --rank,
// --device=cpu|cuda. Anything else goes to Google Benchmark. Names: fine_tune/<model>/<full|lora|qlora>.
#include <benchmark/benchmark.h>

#include <cstdio>
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
#include "nn/lora.h"
#include "nn/model_config.h"
#include "nn/qlora.h"
#include "optim/trainer.h"

namespace {

using namespace engine;

struct Options {
    std::vector<std::string> models = {"smollm-135m", "gpt2-124M"};
    int seq = 512, batch = 1, rank = 16;
    Device device = Device::cpu;
};

enum class Tuning { full, lora, qlora };
const char* tuning_name(Tuning tuning) {
    return tuning == Tuning::full ? "full" : tuning == Tuning::lora ? "lora" : "qlora";
}

// A model (built on the host, adapted and quantised there, then moved), its trainer and one fixed micro-batch.
struct Session {
    Session(const nn::ModelConfig& config, const Options& options, Tuning tuning)
        : model(config.build(1, Device::cpu, DType::f32)) {
        if (tuning != Tuning::full) {
            nn::LoraConfig lora;
            lora.r = options.rank;
            lora.lora_alpha = 2.0 * options.rank;
            lora.target_modules = {"all-linear"};
            nn::apply_lora(*model, lora);
        }
        if (tuning == Tuning::qlora) nn::quantize_nf4(*model);
        if (options.device != Device::cpu) model->to(options.device);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = options.batch;
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

void run_step(benchmark::State& state, const nn::ModelConfig& config, const Options& options, Tuning tuning) {
    optim::StepResult last;
    size_t trainable = 0, total = 0;
    try {
        Session session(config, options, tuning);
        trainable = session.model->trainable_parameter_count();
        total = session.model->parameter_count();
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
    state.counters["trainable"] = static_cast<double>(trainable);
    state.counters["peak_MiB"] = static_cast<double>(last.memory.peak_bytes) / mebibyte;
    state.SetLabel(config.to_string() + ", B " + std::to_string(options.batch) + ", T " + std::to_string(options.seq) +
                   ", " + tuning_name(tuning) + (tuning == Tuning::full ? "" : " r " + std::to_string(options.rank)) +
                   ", " + std::to_string(trainable) + " of " + std::to_string(total) + " parameters train");
}

int positive(const char* name, const char* text) { return bench::positive_flag("bench_fine_tune", name, text); }

} // namespace

int main(int argc, char** argv) {
    Options options;
    std::vector<char*> remaining = bench::split_flags(argc, argv, {
        {"--models", [&](const char* text) { options.models = bench::model_list(text); }},
        {"--seq", [&](const char* text) { options.seq = positive("--seq", text); }},
        {"--batch", [&](const char* text) { options.batch = positive("--batch", text); }},
        {"--rank", [&](const char* text) { options.rank = positive("--rank", text); }},
        {"--device", [&](const char* text) { options.device = bench::device_flag("bench_fine_tune", text); }},
    });
    const std::vector<nn::ModelConfig> configs = bench::named_models("bench_fine_tune", options.models, options.seq);
    if (!bench::start_benchmark(remaining)) return 2;
    for (size_t index = 0; index < configs.size(); ++index) {
        const nn::ModelConfig& config = configs[index];
        for (const Tuning tuning : {Tuning::full, Tuning::lora, Tuning::qlora}) {
            const std::string name = "fine_tune/" + options.models[index] + "/" + tuning_name(tuning);
            benchmark::RegisterBenchmark(name.c_str(), [config, options, tuning](benchmark::State& state) {
                run_step(state, config, options, tuning);
            })->Unit(benchmark::kMillisecond)->UseRealTime();
        }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
