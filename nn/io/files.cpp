// Binary read helpers for nn/io: reads whose errors name the file.
#include "nn/io/files.h"

#include <filesystem>
#include <system_error>

#include "base/error.h"

namespace engine::nn::io_detail {

std::ifstream open_for_reading(const std::string& path, int64_t* size_bytes) {
    std::error_code error;
    ENGINE_CHECK(std::filesystem::is_regular_file(path, error), "cannot read '" << path << "': not a regular file");
    const uintmax_t size = std::filesystem::file_size(path, error);
    ENGINE_CHECK(!error, "cannot read '" << path << "': " << error.message());
    std::ifstream file(path, std::ios::binary);
    ENGINE_CHECK(file.good(), "cannot open '" << path << "' for reading");
    *size_bytes = static_cast<int64_t>(size);
    return file;
}

void read_exactly(std::ifstream& file, const std::string& path, int64_t offset, void* destination, int64_t bytes,
                  const std::string& what) {
    file.clear();
    file.seekg(offset);
    file.read(static_cast<char*>(destination), bytes);
    ENGINE_CHECK(file.good() && file.gcount() == bytes,
                 "'" << path << "': short read of " << what << " (" << bytes << " bytes at offset " << offset << ")");
}

} // namespace engine::nn::io_detail
