// Hugging Face safetensors: read any file into host tensors, save a module's parameters under their
// GPT-2 names, and load a file into a module (a bad file changes nothing). docs/FORMATS.md describes the mapping.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace engine::nn {

// One tensor as a safetensors header describes it (offsets relative to the data section).
struct SafetensorsEntry {
    std::string name;
    std::string dtype; // "F32", "BF16", ...
    Shape shape;
    int64_t begin = 0, end = 0;
};

// The validated header of a file: sizes, dtypes and offsets are all checked against the file on open.
struct SafetensorsHeader {
    std::string path;
    int64_t data_start = 0; // 8 + header length
    std::vector<SafetensorsEntry> entries; // in file order (by begin offset)
    std::map<std::string, std::string> metadata;
    const SafetensorsEntry* find(const std::string& name) const;
};

// Throws EngineError naming the file (and the tensor) if the file is too short, the header length points
// beyond the file, the header is not JSON of the safetensors shape, a dtype is unknown, or offsets are out
// of range, overlap, or disagree with shape × dtype size.
SafetensorsHeader read_safetensors_header(const std::string& path);
// Reads one tensor as a host tensor: F32 and BF16 become f32, F64 becomes f64; other dtypes throw.
Tensor read_safetensors_tensor(const SafetensorsHeader& header, const SafetensorsEntry& entry);

// Every tensor of the file (F32/BF16 -> f32, F64 -> f64), on the host.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

// Writes every parameter under its module name (GPT: HF GPT-2 names without the `transformer.` prefix,
// Conv1D weights (in,out) as stored) in its own dtype (f32 -> F32, f64 -> F64), or in `file_dtype` when given
// (bf16 -> BF16, rounded to nearest even), with __metadata__ {"format":"pt"}. Under mixed precision the
// parameters are the f32 masters, so the default keeps them exact. Atomic: temporary file + rename.
// name_prefix goes in front of every name (train_gpt writes GPT-2 directories with transformers' "transformer.").
void save_safetensors(const Module& module, const std::string& path, std::optional<DType> file_dtype = std::nullopt,
                      const std::string& name_prefix = "");
// The same for named tensors (an adapter's, nn/io/peft.h), under the names given, in the order given.
void save_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
                      std::optional<DType> file_dtype = std::nullopt);

// Loads a file into `module`'s parameters (converted to each parameter's dtype and device).
// - A `transformer.` prefix on names is accepted.
// - The causal-mask buffers `*.attn.bias` and `*.attn.masked_bias` are skipped (never read).
// - `lm_head.weight` is accepted only when it equals `wte.weight` bitwise (the tied head) and is then
//   ignored; otherwise it is an error, since this model cannot hold an untied head.
// - Any other name that is not a parameter, a missing parameter, or a wrong shape is an error.
// Everything a file can be wrong about is checked before the module changes (names, shapes, dtypes, the data's
// place in the file, a tied head's values against its table's), so a bad file leaves it exactly as it was. Then each
// tensor is read a chunk at a time, converted, and copied into its parameter (on its device): the host holds two
// buffers of at most 2 MiB, never a copy of the model. A read that fails after the checks (the file shrank under the
// load, the disk failed) leaves the module part-loaded. Errors name the file and the tensor.
void load_safetensors_into(Module& module, const std::string& path);

// How a checkpoint's names meet a module's, for the general loader below.
struct CheckpointNames {
    std::string accepted_prefix = "transformer."; // a name may carry it in front (stripped)
    std::string tied_table = "wte.weight"; // a file's lm_head.weight must equal it bitwise when the module has no lm_head
};
// The same load over one or several files (a sharded checkpoint): every parameter must come from
// exactly one of them. Besides the GPT-2 mask buffers, Llama's old persistent `rotary_emb.inv_freq` buffers are
// skipped (the model builds its own tables).
void load_safetensors_into(Module& module, const std::vector<std::string>& paths, const CheckpointNames& names);

} // namespace engine::nn
