// Read helpers shared by the file readers in nn/io: sized binary reads whose errors name the file.
// (Atomic writes come from engine/io/atomic_file.h.)
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace engine::nn::io_detail {

// Opens `path` for binary reading and returns its size in bytes; throws EngineError naming the file.
std::ifstream open_for_reading(const std::string& path, int64_t* size_bytes);
// Reads exactly `bytes` at `offset`; throws EngineError naming the file and `what` on a short read.
void read_exactly(std::ifstream& file, const std::string& path, int64_t offset, void* destination, int64_t bytes,
                  const std::string& what);

} // namespace engine::nn::io_detail
