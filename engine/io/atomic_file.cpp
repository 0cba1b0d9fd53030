// Durable file replacement with POSIX calls: a reader sees either the old file or the complete new one,
// never a prefix, even if the process is killed or the machine loses power part way.
#include "engine/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/error.h"

namespace engine::io {
namespace {

std::string system_reason() { return std::strerror(errno); }

std::string parent_directory(const std::string& path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    return parent.empty() ? "." : parent.string();
}

// Closes on scope exit unless released; close errors on the write path are checked explicitly.
class FileDescriptor {
public:
    explicit FileDescriptor(int descriptor) : descriptor_(descriptor) {}
    ~FileDescriptor() {
        if (descriptor_ >= 0) ::close(descriptor_);
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    int get() const { return descriptor_; }
    int release() { return std::exchange(descriptor_, -1); }

private:
    int descriptor_;
};

void write_all(int descriptor, const void* bytes, size_t size, const std::string& path) {
    const auto* cursor = static_cast<const char*>(bytes);
    while (size > 0) {
        const ssize_t written = ::write(descriptor, cursor, size);
        if (written < 0 && errno == EINTR) continue;
        ENGINE_CHECK(written > 0, "writing " << path << " failed: " << system_reason());
        cursor += written;
        size -= static_cast<size_t>(written);
    }
}

} // namespace

void sync_directory(const std::string& directory) {
    FileDescriptor handle(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ENGINE_CHECK(handle.get() >= 0, "opening directory " << directory << " to sync it failed: " << system_reason());
    ENGINE_CHECK(::fsync(handle.get()) == 0, "fsync of directory " << directory << " failed: " << system_reason());
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& produce) {
    const std::string temporary = path + temporary_suffix + std::to_string(::getpid());
    FileDescriptor handle(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ENGINE_CHECK(handle.get() >= 0, "creating " << temporary << " (to replace " << path << ") failed: "
                                                << system_reason());
    try {
        produce([&](const void* bytes, size_t size) { write_all(handle.get(), bytes, size, temporary); });
        ENGINE_CHECK(::fsync(handle.get()) == 0, "fsync of " << temporary << " failed: " << system_reason());
        ENGINE_CHECK(::close(handle.release()) == 0, "closing " << temporary << " failed: " << system_reason());
        ENGINE_CHECK(::rename(temporary.c_str(), path.c_str()) == 0,
                     "renaming " << temporary << " over " << path << " failed: " << system_reason());
    } catch (...) {
        ::unlink(temporary.c_str());
        throw;
    }
    sync_directory(parent_directory(path));
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
    FileDescriptor handle(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ENGINE_CHECK(handle.get() >= 0, "cannot open " << path << ": " << system_reason());
    struct stat status {};
    ENGINE_CHECK(::fstat(handle.get(), &status) == 0, "cannot stat " << path << ": " << system_reason());
    ENGINE_CHECK(S_ISREG(status.st_mode), path << " is not a regular file");
    std::vector<uint8_t> bytes(static_cast<size_t>(status.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t got = ::read(handle.get(), bytes.data() + done, bytes.size() - done);
        if (got < 0 && errno == EINTR) continue;
        ENGINE_CHECK(got >= 0, "reading " << path << " failed: " << system_reason());
        ENGINE_CHECK(got > 0, "reading " << path << ": the file shrank to " << done << " bytes while being read");
        done += static_cast<size_t>(got);
    }
    return bytes;
}

} // namespace engine::io
