// safetensors: bitwise round trip of a GPT, BF16 loading, Hugging Face naming (transformer. prefix, mask
// buffers, tied lm_head), and every bad file: an error naming the file and tensor, and a model untouched.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "nn/gpt.h"
#include "nn/io/safetensors.h"

namespace engine::testing {
namespace {

nn::GPTConfig small_config() { return {32, 8, 2, 2, 16, 0.0f}; }

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "safetensors_" + name; }

// Every parameter's bytes, for bitwise comparisons.
std::vector<std::vector<char>> snapshot(const nn::Module& module) {
    std::vector<std::vector<char>> out;
    for (const auto& [name, parameter] : module.named_parameters()) {
        std::vector<char> bytes(parameter.nbytes());
        std::memcpy(bytes.data(), parameter.raw_data(), bytes.size());
        out.push_back(std::move(bytes));
    }
    return out;
}

// A tensor as a hand-written file will hold it; offsets are laid out in order unless given.
struct RawTensor {
    std::string name;
    std::string dtype;
    std::string shape_json;   // e.g. "[2,3]"
    std::string bytes;
    std::string offsets_json; // empty: the next free range
};

std::string shape_json(const Shape& shape) {
    std::string text = "[";
    for (size_t index = 0; index < shape.size(); ++index) text += (index ? "," : "") + std::to_string(shape[index]);
    return text + "]";
}

RawTensor raw_f32(const std::string& name, const Tensor& tensor) {
    return {name, "F32", shape_json(tensor.shape()),
            std::string(static_cast<const char*>(tensor.raw_data()), tensor.nbytes()), ""};
}

std::vector<RawTensor> model_tensors(const nn::Module& module, const std::string& prefix = "") {
    std::vector<RawTensor> out;
    for (const auto& [name, parameter] : module.named_parameters()) out.push_back(raw_f32(prefix + name, parameter));
    return out;
}

// header_override replaces the JSON header; truncate_bytes cuts the end of the file.
void write_raw(const std::string& path, const std::vector<RawTensor>& tensors, const std::string& header_override = "",
               size_t truncate_bytes = 0) {
    std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
    std::string data;
    for (const RawTensor& tensor : tensors) {
        const std::string offsets = tensor.offsets_json.empty()
                                        ? "[" + std::to_string(data.size()) + "," + std::to_string(data.size() + tensor.bytes.size()) + "]"
                                        : tensor.offsets_json;
        header += ",\"" + tensor.name + "\":{\"dtype\":\"" + tensor.dtype + "\",\"shape\":" + tensor.shape_json +
                  ",\"data_offsets\":" + offsets + "}";
        data += tensor.bytes;
    }
    header += "}";
    if (!header_override.empty()) header = header_override;
    std::string file(8, '\0');
    for (int index = 0; index < 8; ++index) file[static_cast<size_t>(index)] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * index));
    file += header + data;
    file.resize(file.size() - truncate_bytes);
    std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
}

TEST(Safetensors, GptRoundTripIsBitwise) {
    for (DType dtype : {DType::f32, DType::f64}) {
        const std::string path = temp_path("round_trip.safetensors");
        nn::GPT saved(small_config(), 1, Device::cpu, dtype);
        nn::save_safetensors(saved, path);
        nn::GPT loaded(small_config(), 2, Device::cpu, dtype);
        ASSERT_NE(snapshot(saved), snapshot(loaded)) << "different seeds must give different weights";
        nn::load_safetensors_into(loaded, path);
        EXPECT_EQ(snapshot(saved), snapshot(loaded));

        const nn::SafetensorsHeader header = nn::read_safetensors_header(path);
        EXPECT_EQ(header.metadata.at("format"), "pt");
        EXPECT_EQ(header.data_start % 8, 0) << "data section is 8-byte aligned";
        const nn::SafetensorsEntry* c_attn = header.find("h.1.attn.c_attn.weight");
        ASSERT_NE(c_attn, nullptr);
        EXPECT_EQ(c_attn->shape, (Shape{16, 48})) << "Conv1D layout (in,out)";
        EXPECT_EQ(c_attn->dtype, dtype == DType::f32 ? "F32" : "F64");
        EXPECT_EQ(header.find("transformer.wte.weight"), nullptr);
        EXPECT_EQ(header.entries.size(), saved.named_parameters().size());
        std::remove(path.c_str());
    }
}

TEST(Safetensors, ReadsAndConvertsBf16Exactly) {
    // bfloat16 is the top half of a float32: these values have 8 significant bits, so they are exact.
    const std::vector<float> values = {1.5f, -2.0f, 0.15625f, 3.0f / 1024.0f, -384.0f, 0.0f};
    std::string bf16;
    for (float value : values) {
        uint32_t bits;
        std::memcpy(&bits, &value, 4);
        ASSERT_EQ(bits & 0xFFFFu, 0u) << value << " is not exactly representable";
        bf16.push_back(static_cast<char>((bits >> 16) & 0xFF));
        bf16.push_back(static_cast<char>(bits >> 24));
    }
    const std::string path = temp_path("bf16.safetensors");
    write_raw(path, {{"values", "BF16", "[2,3]", bf16, ""}});
    const auto tensors = nn::read_safetensors(path);
    const Tensor& tensor = tensors.at("values");
    EXPECT_EQ(tensor.dtype(), DType::f32);
    EXPECT_EQ(tensor.shape(), (Shape{2, 3}));
    EXPECT_EQ(tensor.to_vector<float>(), values);

    // A whole GPT stored in BF16 loads into both f32 and f64 models.
    nn::GPT source(small_config(), 3);
    std::vector<RawTensor> tensors_bf16;
    std::vector<std::vector<float>> rounded;
    for (const auto& [name, parameter] : source.named_parameters()) {
        std::string bytes;
        std::vector<float> truncated;
        for (float value : parameter.to_vector<float>()) {
            uint32_t bits;
            std::memcpy(&bits, &value, 4);
            bytes.push_back(static_cast<char>((bits >> 16) & 0xFF));
            bytes.push_back(static_cast<char>(bits >> 24));
            bits &= 0xFFFF0000u;
            std::memcpy(&value, &bits, 4);
            truncated.push_back(value);
        }
        tensors_bf16.push_back({name, "BF16", shape_json(parameter.shape()), bytes, ""});
        rounded.push_back(truncated);
    }
    write_raw(path, tensors_bf16);
    nn::GPT target(small_config(), 4);
    nn::load_safetensors_into(target, path);
    nn::GPT target64(small_config(), 4, Device::cpu, DType::f64);
    nn::load_safetensors_into(target64, path);
    const auto parameters = target.named_parameters();
    const auto parameters64 = target64.named_parameters();
    for (size_t index = 0; index < parameters.size(); ++index) {
        EXPECT_EQ(parameters[index].second.to_vector<float>(), rounded[index]) << parameters[index].first;
        const std::vector<double> widened(rounded[index].begin(), rounded[index].end());
        EXPECT_EQ(parameters64[index].second.to_vector<double>(), widened) << parameters64[index].first;
    }
    std::remove(path.c_str());
}

TEST(Safetensors, AcceptsTransformerPrefixSkipsMaskBuffersAndChecksTiedHead) {
    const std::string path = temp_path("hf.safetensors");
    nn::GPT source(small_config(), 5);
    std::vector<RawTensor> tensors = model_tensors(source, "transformer.");
    const Tensor mask = Tensor::full({1, 1, 8, 8}, 1.0, DType::f32, Device::cpu);
    tensors.push_back(raw_f32("transformer.h.0.attn.bias", mask));
    tensors.push_back({"transformer.h.1.attn.masked_bias", "F32", "[]", std::string("\0\0\x1c\xc6", 4), ""});
    tensors.push_back(raw_f32("lm_head.weight", source.wte.weight));
    write_raw(path, tensors);
    nn::GPT target(small_config(), 6);
    nn::load_safetensors_into(target, path);
    EXPECT_EQ(snapshot(source), snapshot(target));

    // An lm_head that is not wte cannot be held by a tied model: rejected, model untouched.
    nn::GPT other(small_config(), 7);
    tensors.back() = raw_f32("lm_head.weight", other.wte.weight);
    write_raw(path, tensors);
    nn::GPT untouched(small_config(), 8);
    const auto before = snapshot(untouched);
    expect_error([&] { nn::load_safetensors_into(untouched, path); }, {path, "lm_head.weight", "wte"});
    EXPECT_EQ(snapshot(untouched), before);
    std::remove(path.c_str());
}

// The load streams a chunk at a time, but a tensor whose file dtype is its parameter's arrives as its bytes: a
// signalling NaN's payload, negative zero and subnormals included (a round trip through double would quiet the NaN).
TEST(Safetensors, StreamedLoadKeepsEveryBitOfAnF32Tensor) {
    const std::string path = temp_path("bits.safetensors");
    nn::GPT source(small_config(), 21);
    std::vector<RawTensor> tensors = model_tensors(source);
    const uint32_t patterns[] = {0x7f800001u, 0xffa00005u, 0x80000000u, 0x00000001u, 0x7fc01234u};
    for (size_t index = 0; index < std::size(patterns); ++index)
        std::memcpy(tensors[0].bytes.data() + 4 * index, &patterns[index], 4);
    write_raw(path, tensors);
    nn::GPT target(small_config(), 22);
    nn::load_safetensors_into(target, path);
    const Tensor loaded = target.named_parameters().front().second; // a handle: the list is a temporary
    ASSERT_EQ(loaded.nbytes(), tensors[0].bytes.size());
    EXPECT_EQ(std::memcmp(loaded.raw_data(), tensors[0].bytes.data(), loaded.nbytes()), 0);
    std::remove(path.c_str());
}

// Each case writes a damaged version of a valid file; loading must throw naming `parts` and leave the
// model bitwise as it was.
struct BadCase {
    std::string label;
    std::function<void(const std::string& path, std::vector<RawTensor>& tensors)> write;
    std::vector<std::string> parts;
};

TEST(Safetensors, EveryBadFileIsRejectedAndLeavesTheModelUntouched) {
    nn::GPT source(small_config(), 9);
    const std::vector<BadCase> cases = {
        {"file too short", [](const std::string& path, auto&) { std::ofstream(path, std::ios::binary) << "abc"; },
         {"too short"}},
        {"header length beyond the file",
         [](const std::string& path, auto& tensors) {
             write_raw(path, tensors);
             std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
             const char huge[8] = {0, 0, 0, 0x10, 0, 0, 0, 0};
             file.write(huge, 8);
         },
         {"header length", "beyond the file"}},
        {"invalid JSON", [](const std::string& path, auto& tensors) { write_raw(path, tensors, "{\"wte.weight\": [1,"); },
         {"not valid JSON"}},
        {"unknown dtype",
         [&](const std::string& path, auto& tensors) {
             tensors[4].dtype = "F33";
             write_raw(path, tensors);
         },
         {"h.0.attn.c_attn.weight", "unknown dtype 'F33'"}},
        {"unsupported dtype",
         [&](const std::string& path, auto& tensors) {
             tensors[4].dtype = "I32";
             write_raw(path, tensors);
         },
         {"h.0.attn.c_attn.weight", "I32"}},
        {"truncated data", [](const std::string& path, auto& tensors) { write_raw(path, tensors, "", 6); },
         {"ln_f.bias", "outside"}},
        {"offsets beyond the data",
         [&](const std::string& path, auto& tensors) {
             tensors[0].offsets_json = "[0,99999999]";
             write_raw(path, tensors);
         },
         {"wte.weight", "outside"}},
        {"offsets disagree with the shape",
         [&](const std::string& path, auto& tensors) {
             tensors[1].shape_json = "[8,15]";
             write_raw(path, tensors);
         },
         {"wpe.weight", "needs"}},
        {"overlapping tensors",
         [&](const std::string& path, auto& tensors) {
             const size_t wte_bytes = tensors[0].bytes.size();
             tensors[1].offsets_json = "[" + std::to_string(wte_bytes - 4) + "," +
                                       std::to_string(wte_bytes - 4 + tensors[1].bytes.size()) + "]";
             write_raw(path, tensors);
         },
         {"overlaps", "wte.weight"}},
        {"missing tensor",
         [&](const std::string& path, auto& tensors) {
             tensors.erase(tensors.begin() + 7); // h.0.attn.c_proj.bias
             write_raw(path, tensors);
         },
         {"h.0.attn.c_proj.bias", "missing"}},
        {"wrong shape",
         [&](const std::string& path, auto& tensors) {
             tensors[1].shape_json = "[16,8]"; // same byte count, transposed
             write_raw(path, tensors);
         },
         {"wpe.weight", "(16,8)"}},
        {"unknown tensor",
         [&](const std::string& path, auto& tensors) {
             tensors.push_back(raw_f32("h.2.ln_1.weight", source.h[0]->ln_1.weight));
             write_raw(path, tensors);
         },
         {"h.2.ln_1.weight", "matches no parameter"}},
    };
    for (const BadCase& bad : cases) {
        SCOPED_TRACE(bad.label);
        const std::string path = temp_path("bad.safetensors");
        std::vector<RawTensor> tensors = model_tensors(source);
        ASSERT_EQ(tensors[4].name, "h.0.attn.c_attn.weight");
        ASSERT_EQ(tensors[7].name, "h.0.attn.c_proj.bias");
        bad.write(path, tensors);
        nn::GPT model(small_config(), 10);
        const auto before = snapshot(model);
        std::vector<std::string> parts = bad.parts;
        parts.push_back(path);
        expect_error([&] { nn::load_safetensors_into(model, path); }, parts);
        EXPECT_EQ(snapshot(model), before) << "the model changed";
        std::remove(path.c_str());
    }
}

TEST(Safetensors, SaveIsAtomicAndReplacesAnExistingFile) {
    const std::string path = temp_path("atomic.safetensors");
    nn::GPT first(small_config(), 11), second(small_config(), 12);
    nn::save_safetensors(first, path);
    nn::save_safetensors(second, path);
    nn::GPT loaded(small_config(), 13);
    nn::load_safetensors_into(loaded, path);
    EXPECT_EQ(snapshot(loaded), snapshot(second));
    // A directory that does not exist: the save fails with the path and leaves nothing behind.
    expect_error([&] { nn::save_safetensors(first, temp_path("no_such_dir/model.safetensors")); }, {"no_such_dir"});
    std::remove(path.c_str());
}

} // namespace
} // namespace engine::testing
