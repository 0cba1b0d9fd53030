// Real tokens per second on short documents: --data-layout padded (one document a row, the rest padding) against
// packed-documents (documents back to back in each row, positions restarting, attention inside each document),
// side by side in one run. One optimizer step of a trainer per iteration (Trainer::train_step over the loader:
// forward, loss, backward, clip, AdamW). Counters: `targets`, the real next-token targets trained per second
// (num_items_in_batch: padding and document boundaries excluded), and `targets_per_position`, the share of the B·T
// positions the timed steps computed that trained one; the same share over a whole epoch of the loader
// (`epoch_targets_per_position`, no model) and the rate it gives at the measured step time (`epoch_targets`), which a
// few B-row steps cannot sample well.
//
// The corpus: documents whose lengths are drawn from a log-normal distribution, median --median tokens (default
// 64) and sigma 1 (mean 1.65 x the median), at least 2 tokens, each ended by the end-of-text id 0, random ids
// otherwise; a fixed seed, so both layouts train on the same documents.
//
// Prediction (docs/PERF.md): a step costs the same B·T positions in either layout (the linears dominate; the
// packed attention skips only whole panels before a document's start), so the ratio of real targets per second
// is the ratio of targets per position: padded trains (mean length - 1) / T, about 104 / 512 = 20% (a document
// longer than T is cut to it); packed trains all but one target a document and the tail a row cannot take, about
// 85%; so packed-documents trains about 4x the real tokens per second.
//
//   bench_packing                              SmolLM-135M (the small Llama), B 2, T 512, f32, on the CPU
//   bench_packing --models=llama-tiny --seq=256 --batch=4 --median=32
//
// Flags (each --name=value): --models, --seq, --batch, --median, --device=cpu|cuda. Anything else goes to Google
// Benchmark. Names: packing/<model>/<padded|packed-documents>.
#include <benchmark/benchmark.h>

#include <cmath>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "engine/cuda/runtime.h"
#include "nn/io/token_data.h"
#include "nn/model_config.h"
#include "optim/trainer.h"

namespace {

using namespace engine;

struct Options {
    std::vector<std::string> models = {"smollm-135m"};
    int seq = 512, batch = 2, median = 64;
    Device device = Device::cpu;
};

constexpr int32_t end_of_text = 0;

// About 400 rows' worth of documents at the mean length, so that every timed step draws fresh ones.
std::vector<int32_t> short_documents(int vocabulary, int seq, int median) {
    std::mt19937_64 generator(29);
    std::lognormal_distribution<double> length(std::log(static_cast<double>(median)), 1.0);
    std::uniform_int_distribution<int32_t> token(1, vocabulary - 1);
    std::vector<int32_t> tokens;
    const size_t target = static_cast<size_t>(seq) * 400;
    while (tokens.size() < target) {
        const int count = std::max(2, static_cast<int>(length(generator)));
        for (int index = 0; index + 1 < count; ++index) tokens.push_back(token(generator));
        tokens.push_back(end_of_text);
    }
    return tokens;
}

// The share of positions that train a real target over one whole epoch of the loader (a step draws only B rows,
// too few for a stable share): what the layout makes of the corpus, with no model involved.
double epoch_targets_per_position(const std::vector<int32_t>& tokens, const nn::DataLoaderOptions& options) {
    nn::DataLoader loader(tokens, options);
    int64_t targets = 0, positions = 0;
    for (int64_t batch = 0; batch < loader.batches_per_epoch(); ++batch) {
        const std::vector<int32_t> labels = loader.next()->labels.to_vector<int32_t>();
        const auto T = static_cast<size_t>(options.sequence_length);
        for (size_t index = 0; index < labels.size(); ++index)
            targets += index % T != 0 && labels[index] != default_ignore_index; // the target of position index - 1
        positions += static_cast<int64_t>(labels.size());
    }
    return static_cast<double>(targets) / static_cast<double>(positions);
}

void run_layout(benchmark::State& state, const nn::ModelConfig& config, const Options& options, nn::DataLayout layout) {
    int64_t targets = 0, positions = 0;
    double epoch_share = 0.0;
    optim::StepResult last;
    try {
        const std::unique_ptr<nn::CausalLM> model = config.build(1, options.device, DType::f32);
        nn::DataLoaderOptions loader_options;
        loader_options.batch_size = options.batch;
        loader_options.sequence_length = options.seq;
        loader_options.layout = layout;
        loader_options.end_of_text = end_of_text;
        loader_options.device = Device::cpu;
        const std::vector<int32_t> corpus = short_documents(config.vocab_size(), options.seq, options.median);
        epoch_share = epoch_targets_per_position(corpus, loader_options);
        nn::DataLoader loader(corpus, loader_options);
        optim::TrainerConfig trainer_config;
        trainer_config.shape.per_device_train_batch_size = options.batch;
        trainer_config.learning_rate = 3e-4;
        trainer_config.max_steps = int64_t(1) << 40;
        optim::Trainer trainer(*model, trainer_config);
        const nn::BatchSource source = loader.source();
        trainer.train_step(source); // warm-up: first touch, BLAS set-up
        engine::cuda::synchronize(options.device);
        for (auto _ : state) {
            last = *trainer.train_step(source);
            engine::cuda::synchronize(options.device);
            targets += last.num_items_in_batch;
            positions += last.tokens;
        }
    } catch (const std::exception& error) {
        state.SkipWithError(error.what());
        return;
    }
    state.counters["targets"] = benchmark::Counter(static_cast<double>(targets), benchmark::Counter::kIsRate);
    state.counters["targets_per_position"] =
        positions > 0 ? static_cast<double>(targets) / static_cast<double>(positions) : 0.0;
    // The epoch's share times the positions per second: the layout's real targets per second at this step time.
    state.counters["epoch_targets_per_position"] = epoch_share;
    state.counters["epoch_targets"] =
        benchmark::Counter(epoch_share * static_cast<double>(positions), benchmark::Counter::kIsRate);
    state.counters["peak_MiB"] = static_cast<double>(last.memory.peak_bytes) / (1024.0 * 1024.0);
    state.SetLabel(config.to_string() + ", B " + std::to_string(options.batch) + ", T " + std::to_string(options.seq) +
                   ", documents of median " + std::to_string(options.median) + " tokens, " +
                   nn::data_layout_name(layout));
}

int positive(const char* name, const char* text) { return bench::positive_flag("bench_packing", name, text); }

} // namespace

int main(int argc, char** argv) {
    Options options;
    std::vector<char*> remaining = bench::split_flags(argc, argv, {
        {"--models", [&](const char* text) { options.models = bench::model_list(text); }},
        {"--seq", [&](const char* text) { options.seq = positive("--seq", text); }},
        {"--batch", [&](const char* text) { options.batch = positive("--batch", text); }},
        {"--median", [&](const char* text) { options.median = positive("--median", text); }},
        {"--device", [&](const char* text) { options.device = bench::device_flag("bench_packing", text); }},
    });
    const std::vector<nn::ModelConfig> configs = bench::named_models("bench_packing", options.models, options.seq);
    if (!bench::start_benchmark(remaining)) return 2;
    for (size_t index = 0; index < configs.size(); ++index) {
        const nn::ModelConfig& config = configs[index];
        for (const nn::DataLayout layout : {nn::DataLayout::padded, nn::DataLayout::packed_documents}) {
            const std::string name = "packing/" + options.models[index] + "/" + nn::data_layout_name(layout);
            benchmark::RegisterBenchmark(name.c_str(), [config, options, layout](benchmark::State& state) {
                run_layout(state, config, options, layout);
            })->Unit(benchmark::kMillisecond)->UseRealTime();
        }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
