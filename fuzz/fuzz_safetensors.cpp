// libFuzzer target: the safetensors readers (nn/io/safetensors.h): header validation plus reading every tensor
// whole, and the streamed load into a module (load_safetensors_into, a chunk at a time) whose parameters are the
// file's own loadable tensors, f32, with their names and shapes. EngineError is the expected answer to bad bytes;
// anything else is a finding, and so is a load that gives other values than the whole read.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fuzz_input_file.h"
#include "engine/ops.h"
#include "nn/io/safetensors.h"

namespace {

// A module holding one f32 parameter per entry: what the streamed load fills.
class FileShaped : public engine::nn::Module {
public:
    explicit FileShaped(const engine::nn::SafetensorsHeader& header) {
        for (const engine::nn::SafetensorsEntry& entry : header.entries)
            register_parameter(entry.name, engine::Tensor::zeros(entry.shape, engine::DType::f32, engine::Device::cpu));
    }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string& path = engine::fuzz::input_as_file(data, size, ".safetensors");
    try {
        const auto tensors = engine::nn::read_safetensors(path);
        const engine::nn::SafetensorsHeader header = engine::nn::read_safetensors_header(path);
        // A module of many tiny tensors is work per input that finds nothing more: a few are enough.
        if (header.entries.size() > 64) return 0;
        for (const engine::nn::SafetensorsEntry& entry : header.entries)
            if (entry.name.find('.') != std::string::npos || entry.name.empty()) return 0; // names a module can hold
        FileShaped module(header);
        engine::nn::CheckpointNames names;
        names.accepted_prefix = "";
        names.tied_table = "";
        engine::nn::load_safetensors_into(module, {path}, names);
        for (const auto& [name, parameter] : module.named_parameters()) {
            const engine::Tensor& whole = tensors.at(name);
            const engine::Tensor widened = whole.dtype() == engine::DType::f32 ? whole : engine::cast(whole, engine::DType::f32);
            if (std::memcmp(parameter.raw_data(), widened.raw_data(), parameter.nbytes()) != 0) std::abort();
        }
    } catch (const engine::EngineError&) {
    }
    return 0;
}
