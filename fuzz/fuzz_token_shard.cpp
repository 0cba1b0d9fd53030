// libFuzzer target: the llm.c token-shard reader (uint16 and uint32 layouts) and the token loader that validates ids against a
// vocabulary (nn/io/token_data.h). EngineError is the expected answer to bad bytes; anything else is a
// finding.
#include <cstdint>

#include "fuzz_input_file.h"
#include "nn/io/token_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = engine::fuzz::input_as_file(data, size, ".bin");
    try {
        const auto tokens = engine::nn::read_token_shard(path);
        (void)tokens;
    } catch (const engine::EngineError&) {
    }
    try {
        const auto tokens = engine::nn::load_tokens(path, 50257);
        (void)tokens;
    } catch (const engine::EngineError&) {
    }
    return 0;
}
