// Reading and mapping files, and writing a buffer atomically (POSIX).
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

#include "atomic_file.hpp"  // check_path, PathError, AtomicFile

namespace ngramcache {

struct FileNotFound : std::runtime_error {   // -> FileNotFoundError
    using std::runtime_error::runtime_error;
};

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

// Writes `data` to `path` atomically, by the rules in atomic_file.hpp: an interrupted
// write never destroys the previous file.
inline void write_file_atomic(const std::string& path, const void* data, size_t size) {
    AtomicFile file(path);
    file.write(data, size);
    file.commit();
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
