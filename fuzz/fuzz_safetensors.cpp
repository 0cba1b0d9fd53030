// libFuzzer target: the safetensors reader (nn/io/safetensors.h), header validation plus reading every
// tensor. EngineError is the expected answer to bad bytes; anything else is a finding.
#include <cstdint>

#include "fuzz_input_file.h"
#include "nn/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = engine::fuzz::input_as_file(data, size, ".safetensors");
    try {
        const auto tensors = engine::nn::read_safetensors(path);
        (void)tensors;
    } catch (const engine::EngineError&) {
    }
    return 0;
}
