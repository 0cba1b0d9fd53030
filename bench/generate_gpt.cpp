// generate_gpt: samples from a checkpoint train_gpt --save wrote or a Hugging Face model directory: GPT-2 with a
// key/value cache (the prompt runs once, then each new token costs one position), a Llama-family directory without
// one (each new token runs the sequence so far; the head only over the newest position). A directory's config.json
// gives the model's shape; a bare GPT-2 safetensors file gives it from its tensors (wte (V,C), wpe (max_T,C), the
// h.N blocks) except the head count, which safetensors does not store. A directory with a tokenizer.json encodes
// the prompt and decodes the output with it (nn::Tokenizer, the ids tokenizers gives); else the byte vocabulary
// (V = 256, train_gpt's built-in corpus) is text and any other is comma-separated ids. Bad flags: one
// "generate_gpt: error: --flag: reason" line, exit 2.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "nn/generation.h"
#include "nn/io/pretrained.h"
#include "nn/io/safetensors.h"
#include "nn/io/tokenizer.h"
#include "train_gpt_options.h"
#include "engine/cuda/runtime.h"

namespace {

using namespace engine;
using train_gpt::UsageError;

constexpr int byte_vocabulary = 256;

struct Options {
    std::string checkpoint;
    int n_head = 0;
    std::optional<std::string> prompt;
    std::optional<int> max_new_tokens; // unset: 100, or fewer to fill the model's max length
    nn::SamplingOptions sampling{1.0, 0, 42};
    std::string device = "auto";
    bool ids = false; // with a tokenizer: print ids, not text
    bool help = false;
};

std::string usage() {
    return R"(usage: generate_gpt --checkpoint DIR [flags]   or   generate_gpt --checkpoint FILE.safetensors --n-head N [flags]

  --checkpoint DIR|FILE a model directory, GPT-2 or Llama (train_gpt --save DIR, or transformers' own: config.json
                        gives every size; its tokenizer.json, if any, turns text into ids and back), or a GPT-2
                        safetensors file train_gpt --save wrote (sizes read from its tensors)
  --n-head N            with a FILE only: attention heads (safetensors does not store them; tiny and small: 4)
  --prompt TEXT         text, with the directory's tokenizer or the byte vocabulary (V = 256); else comma-separated
                        token ids (default: a newline, or token 50256 / 0)
  --ids                 with a tokenizer: print the ids, comma-separated, instead of the text
  --max-new-tokens N    tokens to sample; prompt + N must fit the model's max length (default 100, or fewer
                        to fill that length)
  --temperature X       0: greedy argmax; else softmax(logits / X) (default 1)
  --top-k N             sample among the N most likely tokens (default 0: all)
  --seed N              seed of the sampler (default 42): the same seed gives the same text
  --device auto|cpu|cuda
  --help
)";
}

Options parse_options(const std::vector<std::string>& arguments) {
    Options options;
    const std::map<std::string, train_gpt::FlagSetter> valued = {
        {"--checkpoint", [&](auto& f, auto& v) {
             const std::string kind = train_gpt::path_kind(v);
             train_gpt::require(nn::is_pretrained_directory(v) || kind == "a regular file", f,
                                kind == "no such file" ? "no such file, or directory with a config.json, '" + v + "'"
                                : kind == "a directory" ? "'" + v + "' is a directory without a config.json"
                                                        : "'" + v + "' is " + kind + ", not a weights file or a model directory");
             options.checkpoint = v; }},
        {"--n-head", [&](auto& f, auto& v) { options.n_head = train_gpt::parse_int(f, v); train_gpt::require(options.n_head > 0, f, "must be positive"); }},
        {"--prompt", [&](auto&, auto& v) { options.prompt = v; }},
        {"--max-new-tokens", [&](auto& f, auto& v) { options.max_new_tokens = train_gpt::parse_int(f, v); train_gpt::require(*options.max_new_tokens > 0, f, "must be positive"); }},
        {"--temperature", [&](auto& f, auto& v) { options.sampling.temperature = train_gpt::parse_number(f, v); train_gpt::require(options.sampling.temperature >= 0, f, "must be >= 0 (0: greedy)"); }},
        {"--top-k", [&](auto& f, auto& v) { options.sampling.top_k = train_gpt::parse_int(f, v); train_gpt::require(options.sampling.top_k >= 0, f, "must be >= 0 (0: every token)"); }},
        {"--seed", [&](auto& f, auto& v) { const int64_t seed = train_gpt::parse_integer(f, v); train_gpt::require(seed >= 0, f, "must be >= 0"); options.sampling.seed = static_cast<uint64_t>(seed); }},
        {"--device", [&](auto& f, auto& v) { train_gpt::require(v == "auto" || v == "cpu" || v == "cuda", f, "'" + v + "' is not auto, cpu or cuda"); options.device = v; }},
    };
    train_gpt::apply_flags(arguments, valued, {{"--help", &options.help}, {"--ids", &options.ids}});
    if (options.help) return options;
    train_gpt::require(!options.checkpoint.empty(), "--checkpoint", "is required (a directory or file train_gpt --save wrote)");
    // A model directory's config.json has the head count; a bare safetensors file does not.
    if (nn::is_pretrained_directory(options.checkpoint))
        train_gpt::require(options.n_head == 0, "--n-head", "comes from " + options.checkpoint + "/config.json; leave it out");
    else
        train_gpt::require(options.n_head > 0, "--n-head", "is required (safetensors does not store the head count)");
    return options;
}

// The model's shape from the file's tensors: wte (V,C), wpe (max_T,C) and the highest h.N index.
nn::GPTConfig infer_config(const std::string& path, int heads) {
    nn::SafetensorsHeader header;
    try {
        header = nn::read_safetensors_header(path);
    } catch (const EngineError& error) {
        throw train_gpt::flag_error("--checkpoint", error);
    }
    auto table = [&](const std::string& name) {
        const nn::SafetensorsEntry* entry = header.find(name);
        if (!entry) entry = header.find("transformer." + name);
        if (!entry || entry->shape.size() != 2)
            throw UsageError("--checkpoint", "'" + path + "' has no 2-D " + name + ": not a GPT-2 checkpoint");
        return entry->shape;
    };
    const Shape token_table = table("wte.weight"), position_table = table("wpe.weight");
    const std::regex block_name(R"(^(transformer\.)?h\.(\d+)\.)");
    int layers = 0;
    for (const nn::SafetensorsEntry& entry : header.entries) {
        std::smatch match;
        if (std::regex_search(entry.name, match, block_name)) layers = std::max(layers, std::stoi(match[2]) + 1);
    }
    nn::GPTConfig config;
    config.vocab_size = static_cast<int>(token_table[0]);
    config.n_embd = static_cast<int>(token_table[1]);
    config.max_seq_len = static_cast<int>(position_table[0]);
    config.n_layer = layers;
    config.n_head = heads;
    config.dropout = 0.0f;
    train_gpt::require(layers > 0, "--checkpoint", "'" + path + "' has no h.N blocks: not a GPT-2 checkpoint");
    train_gpt::require(position_table[1] == token_table[1], "--checkpoint",
                       "'" + path + "': wte and wpe have different widths");
    train_gpt::require(config.n_embd % heads == 0, "--n-head",
                       std::to_string(heads) + " heads do not divide the width " + std::to_string(config.n_embd));
    return config;
}

// Text for the byte vocabulary, else comma-separated ids; ids outside the vocabulary name --prompt.
std::vector<int32_t> parse_prompt(const std::optional<std::string>& prompt, int vocabulary) {
    if (vocabulary == byte_vocabulary) {
        const std::string text = prompt.value_or("\n");
        train_gpt::require(!text.empty(), "--prompt", "is empty; it needs at least one byte");
        return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                    reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    }
    const std::string list = prompt.value_or(vocabulary > 50256 ? "50256" : "0");
    std::vector<int32_t> ids;
    std::stringstream items(list);
    for (std::string item; std::getline(items, item, ',');) {
        const int id = train_gpt::parse_int("--prompt", item);
        train_gpt::require(id >= 0 && id < vocabulary, "--prompt",
                           "token " + item + " is outside the vocabulary [0," + std::to_string(vocabulary) + ")");
        ids.push_back(id);
    }
    train_gpt::require(!ids.empty(), "--prompt", "has no token ids (comma-separated, the vocabulary is not bytes)");
    return ids;
}

Device resolve_device(const std::string& device) {
    const bool available = engine::cuda::device_available();
    train_gpt::require(available || device != "cuda", "--device",
                       engine::cuda::backend_built ? "no CUDA device is present" : "this build of libengine has no CUDA backend");
    return device != "cpu" && available ? Device::cuda : Device::cpu;
}

// A train_gpt --save directory or a Hugging Face one: its config.json is the model.
nn::ModelConfig directory_config(const std::string& directory) {
    try {
        return nn::read_pretrained_config(directory);
    } catch (const EngineError& error) {
        throw train_gpt::flag_error("--checkpoint", error);
    }
}

int run(const Options& options) {
    const bool directory = nn::is_pretrained_directory(options.checkpoint);
    const nn::ModelConfig config = directory ? directory_config(options.checkpoint)
                                             : nn::ModelConfig(infer_config(options.checkpoint, options.n_head));
    const int vocabulary = config.vocab_size(), max_length = config.max_seq_len();
    std::optional<nn::Tokenizer> tokenizer;
    if (directory && std::filesystem::is_regular_file(std::filesystem::path(options.checkpoint) / "tokenizer.json")) {
        try {
            tokenizer = nn::Tokenizer::from_directory(options.checkpoint);
        } catch (const EngineError& error) {
            throw train_gpt::flag_error("--checkpoint", error);
        }
        train_gpt::require(tokenizer->vocab_size() <= vocabulary, "--checkpoint",
                           "its tokenizer.json has " + std::to_string(tokenizer->vocab_size()) +
                               " ids but the model's vocabulary is " + std::to_string(vocabulary));
    }
    train_gpt::require(tokenizer || !options.ids, "--ids", "needs a directory with a tokenizer.json");
    std::vector<int32_t> prompt;
    if (tokenizer) {
        // A text longer than the model's length times the longest token makes too many ids anyway: refused before
        // the encoding spends time on it.
        const size_t limit = static_cast<size_t>(max_length) * tokenizer->longest_token_bytes();
        train_gpt::require(options.prompt.value_or("").size() <= limit, "--prompt",
                           std::to_string(options.prompt->size()) + " bytes make more tokens than the model's max length " +
                               std::to_string(max_length));
        try {
            prompt = tokenizer->encode(options.prompt.value_or("\n"));
        } catch (const EngineError& error) {
            throw train_gpt::flag_error("--prompt", error);
        }
        train_gpt::require(!prompt.empty(), "--prompt", "is empty; it needs at least one token");
    } else {
        prompt = parse_prompt(options.prompt, vocabulary);
    }
    const int room = max_length - static_cast<int>(prompt.size()); // positions left after the prompt
    train_gpt::require(room > 0 || options.prompt.has_value(), "--checkpoint", "the model has a single position");
    train_gpt::require(room > 0, "--prompt",
                       std::to_string(prompt.size()) + " tokens leave no room in the model's max length " +
                           std::to_string(max_length));
    const int max_new_tokens = options.max_new_tokens.value_or(std::min(100, room));
    train_gpt::require(max_new_tokens <= room, "--max-new-tokens",
                       std::to_string(max_new_tokens) + " after a prompt of " + std::to_string(prompt.size()) +
                           " tokens exceeds the model's max length " + std::to_string(max_length));
    train_gpt::require(options.sampling.top_k <= vocabulary, "--top-k",
                       std::to_string(options.sampling.top_k) + " exceeds the vocabulary " + std::to_string(vocabulary));
    const Device device = resolve_device(options.device);

    const std::unique_ptr<nn::CausalLM> model = config.build(0, device, DType::f32);
    try {
        if (directory) nn::load_pretrained_into(*model, options.checkpoint);
        else nn::load_safetensors_into(*model, options.checkpoint);
    } catch (const EngineError& error) {
        throw train_gpt::flag_error("--checkpoint", error);
    }
    model->train(false);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> sequence = nn::generate(*model, prompt, max_new_tokens, options.sampling);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    if (tokenizer && !options.ids) {
        std::cout << tokenizer->decode(sequence) << "\n";
    } else if (!tokenizer && vocabulary == byte_vocabulary) {
        const std::string text(sequence.begin(), sequence.end());
        std::cout << text << "\n";
    } else {
        for (size_t index = 0; index < sequence.size(); ++index) std::cout << (index ? "," : "") << sequence[index];
        std::cout << "\n";
    }
    std::cerr << "generate_gpt: " << max_new_tokens << " tokens after a prompt of " << prompt.size() << " in "
              << seconds << " s on " << device_name(device) << " (" << config.to_string() << ")\n";
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
        if (options.help) {
            std::cout << usage();
            return 0;
        }
        return run(options);
    } catch (const UsageError& error) {
        std::cerr << "generate_gpt: error: " << error.what() << "\n";
        return 2;
    } catch (const std::exception& error) {
        std::cerr << "generate_gpt: error: " << error.what() << "\n";
        return 1;
    }
}
