// The flags the benchmarks over named models share (bench_loss_head, bench_fine_tune): --models, --device and the
// check of --seq against each model, each refusal one line and exit 2.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "nn/model_config.h"

namespace bench {

// `--models=a,b` as a list of ModelConfig::named names.
inline std::vector<std::string> model_list(const char* text) {
    std::vector<std::string> names;
    std::stringstream list(text);
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    return names;
}

// `--device=cpu|cuda`.
inline engine::Device device_flag(const char* program, const char* text) {
    if (std::strcmp(text, "cpu") != 0 && std::strcmp(text, "cuda") != 0) {
        std::fprintf(stderr, "%s: --device must be cpu or cuda, got '%s'\n", program, text);
        std::exit(2);
    }
    return std::strcmp(text, "cuda") == 0 ? engine::Device::cuda : engine::Device::cpu;
}

// Each named model, refused when unknown or shorter than `seq`.
inline std::vector<engine::nn::ModelConfig> named_models(const char* program, const std::vector<std::string>& names,
                                                         int seq) {
    std::vector<engine::nn::ModelConfig> configs;
    try {
        for (const std::string& name : names) {
            engine::nn::ModelConfig config = engine::nn::ModelConfig::named(name);
            if (seq > config.max_seq_len()) {
                std::fprintf(stderr, "%s: --seq %d exceeds %s's max_seq_len %d\n", program, seq, name.c_str(),
                             config.max_seq_len());
                std::exit(2);
            }
            configs.push_back(config);
        }
    } catch (const engine::EngineError& error) {
        std::fprintf(stderr, "%s: %s\n", program, error.what());
        std::exit(2);
    }
    return configs;
}

} // namespace bench
