// Durable whole-file I/O on POSIX: atomic replacement (temp file, fsync, rename, directory fsync) and
// whole-file reads, with errors that name the file and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace engine::io {

using ByteSink = std::function<void(const void* bytes, size_t size)>;

// Calls `produce` with a sink into `path`.tmp-<pid> (same directory, so that rename is atomic), then
// fsyncs the file, renames it over `path` and fsyncs the directory. If anything throws or fails, the
// temporary file is removed and an existing `path` is left as it was. Throws EngineError.
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce);

// The whole file; throws EngineError naming it when it cannot be opened or read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// fsync of a directory, so that a rename or unlink in it survives a power loss.
void sync_directory(const std::string& directory);

// The suffix write_file_atomically puts on its temporary files (followed by the pid).
inline constexpr const char* temporary_suffix = ".tmp-";

} // namespace engine::io
