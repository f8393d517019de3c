// Reading, mapping and atomically replacing files (POSIX).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ngram.hpp"  // InputError

namespace ngramcache {

struct FileNotFound : std::runtime_error {   // -> FileNotFoundError
    using std::runtime_error::runtime_error;
};

// A path with a NUL byte would be cut short by the C calls below (and name another file):
// refused, as Python's own open() refuses it.
inline void check_path(const std::string& path) {
    const size_t at = path.find('\0');
    if (at != std::string::npos)
        throw InputError("path contains a NUL byte (at offset " + std::to_string(at) + ")");
}

inline std::vector<char> read_file(const std::string& path) {
    check_path(path);
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        throw std::system_error(EISDIR, std::generic_category(), path + " is a directory, not a cache file");
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
        if (errno == ENOENT) throw FileNotFound(path + ": no such file");
        throw std::system_error(errno, std::generic_category(), path);
    }
    std::vector<char> buf;
    char chunk[1 << 16];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) buf.insert(buf.end(), chunk, chunk + n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) throw std::system_error(EIO, std::generic_category(), path + ": read failed");
    return buf;
}

namespace detail {

// The folder part of `path` ("." for a bare name), for the fsync that makes a rename durable.
inline std::string folder_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// Best effort, as the Python side's atomic_open: some file systems refuse to sync a folder,
// and the data itself is already on disk by then.
inline void fsync_folder(const std::string& folder) {
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
}

}  // namespace detail

// Writes `data` to `path` so that an interrupted write never destroys the previous file:
// a temporary file in the same folder, fsync, rename over the target, fsync of the folder
// (without it the rename itself may be lost on a crash). The temporary file is removed on
// any failure.
inline void write_file_atomic(const std::string& path, const void* data, size_t size) {
    check_path(path);
    std::string tmpl = path + ".tmp.XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
        if (errno == ENOENT) throw FileNotFound(path + ": folder does not exist");
        throw std::system_error(errno, std::generic_category(), "cannot create a file beside " + path);
    }
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    int err = 0;
    while (left > 0) {
        const ssize_t w = ::write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        p += w;
        left -= static_cast<size_t>(w);
    }
    if (err == 0 && ::fchmod(fd, 0644) != 0) err = errno;
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && std::rename(name.data(), path.c_str()) != 0) err = errno;
    if (err != 0) {
        std::remove(name.data());
        throw std::system_error(err, std::generic_category(), "writing " + path);
    }
    detail::fsync_folder(detail::folder_of(path));
}

// Bytes that stay valid for as long as any holder keeps them (a file mapping or memory).
using SharedBytes = std::shared_ptr<const uint8_t>;

// A read-only mapping of a whole regular file. The descriptor is closed at once: the
// mapping stays valid without it, and later renames over the path do not affect it.
class FileMapping {
public:
    FileMapping() = default;
    FileMapping(const FileMapping&) = delete;
    FileMapping& operator=(const FileMapping&) = delete;
    FileMapping(FileMapping&& o) noexcept : data_(o.data_), size_(o.size_) {
        o.data_ = nullptr;
        o.size_ = 0;
    }
    ~FileMapping() {
        if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    }

    static FileMapping open(const std::string& path) {
        check_path(path);
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) throw FileNotFound(path + ": no such file");
            throw std::system_error(errno, std::generic_category(), path);
        }
        struct stat st;
        if (::fstat(fd, &st) != 0) {
            const int e = errno;
            ::close(fd);
            throw std::system_error(e, std::generic_category(), path);
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(fd);
            throw std::system_error(S_ISDIR(st.st_mode) ? EISDIR : EINVAL, std::generic_category(), path);
        }
        FileMapping m;
        m.size_ = static_cast<uint64_t>(st.st_size);
        if (m.size_ > 0) {
            void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                const int e = errno;
                ::close(fd);
                throw std::system_error(e, std::generic_category(), "mapping " + path);
            }
            m.data_ = static_cast<const uint8_t*>(p);
        }
        ::close(fd);
        return m;
    }

    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }

    // Hands the mapping over to shared ownership (unmapped when the last holder goes).
    SharedBytes release() {
        const uint64_t sz = size_;
        SharedBytes b(data_, [sz](const uint8_t* q) {
            if (q != nullptr) ::munmap(const_cast<uint8_t*>(q), sz);
        });
        data_ = nullptr;
        size_ = 0;
        return b;
    }

private:
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace ngramcache
