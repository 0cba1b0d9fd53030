// The logits files that tests/golden/make_hf_*_files.py write from transformers (magic 'HFLG', version 1, B, T,
// V as i32, tokens i32[B*T], labels i32[B*T], logits f32[B*T*V], loss f64): read for the interop tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace engine::testing {

struct HuggingFaceReference {
    int batch = 0, time = 0, vocabulary = 0;
    std::vector<int32_t> tokens, labels; // (B,T) each; labels unshifted, -100 where padded
    std::vector<float> logits;           // (B,T,V)
    double loss = 0.0;                   // transformers' causal-LM loss: the token mean over shifted targets
};

inline HuggingFaceReference read_hf_reference(const std::string& path) {
    constexpr uint32_t magic = 0x48464C47, version = 1;
    std::ifstream file(path, std::ios::binary);
    ENGINE_CHECK(file.good(), "cannot open " << path);
    auto read = [&](void* destination, size_t bytes) {
        file.read(static_cast<char*>(destination), static_cast<std::streamsize>(bytes));
        ENGINE_CHECK(file.good(), path << " is truncated");
    };
    uint32_t header[2];
    read(header, sizeof header);
    ENGINE_CHECK(header[0] == magic && header[1] == version, path << ": bad magic or version");
    HuggingFaceReference reference;
    int32_t dimensions[3];
    read(dimensions, sizeof dimensions);
    reference.batch = dimensions[0], reference.time = dimensions[1], reference.vocabulary = dimensions[2];
    const size_t positions = static_cast<size_t>(reference.batch) * reference.time;
    reference.tokens.resize(positions);
    reference.labels.resize(positions);
    reference.logits.resize(positions * reference.vocabulary);
    read(reference.tokens.data(), positions * 4);
    read(reference.labels.data(), positions * 4);
    read(reference.logits.data(), reference.logits.size() * 4);
    read(&reference.loss, 8);
    ENGINE_CHECK(file.peek() == std::char_traits<char>::eof(), path << " has trailing bytes");
    return reference;
}

} // namespace engine::testing
