// Fuzz-target helper: readers that take a path get each input through one temporary file per process.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace engine::fuzz {

// Rewrites this process's temporary file with the input and returns its path.
inline const std::string& input_as_file(const uint8_t* data, size_t size, const char* extension) {
    static const std::string path = [&] {
        const char* directory = std::getenv("TMPDIR");
        return std::string(directory && *directory ? directory : "/tmp") + "/engine_fuzz_" +
               std::to_string(::getpid()) + extension;
    }();
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (file == nullptr || (size > 0 && std::fwrite(data, 1, size, file) != size) || std::fclose(file) != 0) {
        std::perror(path.c_str()); // an environment failure, not a finding in the reader
        std::abort();
    }
    return path;
}

} // namespace engine::fuzz
