// Saving a file the way an editor saves it (POSIX): every file the package writes goes
// through AtomicFile, from C++ (write_file_atomic in file_io.hpp) and from Python
// (files.atomic_open holds an AtomicFile and writes to its descriptor).
//
// The rules of a save:
//  - The new contents go to a temporary file in the target's folder, which is fsynced, then
//    renamed over the target, then the folder is fsynced (without that the rename itself may
//    be lost on a crash). Readers see the old file or the new one, never a half. On any
//    failure the temporary file is removed and the target is left as it was.
//  - A replaced file keeps its mode, and its owner and group where the saver may set them
//    (setuid/setgid bits only when both were kept). A new file gets 0666 & ~umask.
//  - Saving to a symbolic link writes the file the link (or chain of links) points to and
//    leaves the link in place; a dangling link creates its target. Hard links to the old
//    file keep the old contents: the save makes a new file.
//  - Only regular files are replaced: a folder, device, pipe or socket is refused.
//  - The temporary file is anonymous where the file system allows it (Linux O_TMPFILE): a
//    writer killed while writing leaves nothing behind. It is given a name only once its
//    contents are on disk, for the rename (O_TMPFILE can only be linked to a free name,
//    never over the target). Elsewhere, or when /proc is missing (linking an anonymous
//    file without privileges goes through /proc/self/fd), it is named from the start.
//  - A named temporary file is hidden and short whatever the target's name (so a name of
//    up to 255 bytes can be saved): ".STEM-NAMEHASH.HOST.PID.RANDOM.ngctmp", STEM being at
//    most 32 bytes of the name. It says which target and which writer it belongs to, so a
//    later save of the same target removes the ones left by writers that no longer exist
//    (killed mid-save) and never touches a live writer's. Only temporary files of this host
//    (HOST is a hash of its name) are judged, as a PID means nothing on another machine
//    sharing the folder; a PID reused by a live process keeps its file until a later save.
//  - Two threads or processes may save the same target at once: each has its own
//    temporary file and the last rename wins, leaving one complete file.
//  - Errors are PathError: an errno, a message and the path asked for.
//  - stop_saves() stops every save of the process, from any thread (a command's Ctrl-C):
//    once it returns, no save renames its file any more. A save in progress fails with
//    ECANCELED at its next write or at its commit, its temporary file removed, the target
//    left as it was; a save whose rename had begun has finished it. So the caller learns
//    for certain whether its output was replaced: the save returned, or it failed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "ngram.hpp"  // InputError

namespace ngramcache {

// A path with a NUL byte would be cut short by the C calls below (and name another file):
// refused, as Python's own open() refuses it.
inline void check_path(const std::string& path) {
    const size_t at = path.find('\0');
    if (at != std::string::npos)
        throw InputError("path contains a NUL byte (at offset " + std::to_string(at) + ")");
}

// An error about a file the caller named. Python sees OSError(err, message, path), of the
// subclass err picks (FileNotFoundError, PermissionError, IsADirectoryError, ...).
class PathError : public std::runtime_error {
public:
    PathError(int err, const std::string& message, const std::string& path)
        : std::runtime_error(path + ": " + message), err_(err), message_(message), path_(path) {}
    int err() const { return err_; }
    const std::string& message() const { return message_; }
    const std::string& path() const { return path_; }

private:
    int err_;
    std::string message_;
    std::string path_;
};

namespace detail {

inline std::string errno_text(int err) { return std::generic_category().message(err); }

// The folder part of `path` ("." for a bare name), and the name in it.
inline std::string folder_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

inline std::string name_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

inline uint64_t fnv1a(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

inline std::string hex(uint64_t v, int digits) {
    static const char* const xdigits = "0123456789abcdef";
    std::string s(static_cast<size_t>(digits), '0');
    for (int i = digits - 1; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = xdigits[v & 15];
    return s;
}

// At most `limit` bytes of `name`, not ending inside a UTF-8 character (the stem is only
// there for people listing the folder).
inline std::string stem_of(const std::string& name, size_t limit) {
    if (name.size() <= limit) return name;
    size_t end = limit;
    while (end > 0 && (static_cast<unsigned char>(name[end]) & 0xC0) == 0x80) --end;
    return name.substr(0, end);
}

inline std::string host_tag() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) return "00000000";
    return hex(fnv1a(host), 8);
}

inline uint32_t random_word() {
    thread_local std::mt19937_64 rng([] {
        std::random_device dev;
        const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        std::seed_seq seq{dev(), dev(), static_cast<unsigned>(t), static_cast<unsigned>(t >> 32),
                          static_cast<unsigned>(::getpid()),
                          static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()))};
        return std::mt19937_64(seq);
    }());
    return static_cast<uint32_t>(rng());
}

// The path a save of `path` writes: symbolic links followed to their end (a dangling one
// to the file it would create).
inline std::string follow_links(const std::string& path) {
    std::string at = path;
    for (int hops = 0;; ++hops) {
        struct stat st;
        if (::lstat(at.c_str(), &st) != 0) {
            // A new file; a missing or unusable folder is reported when it is opened.
            const int err = errno;
            if (err == ENOENT || err == ENOTDIR) return at;
            throw PathError(err, errno_text(err), path);
        }
        if (!S_ISLNK(st.st_mode)) return at;
        if (hops == 40) throw PathError(ELOOP, errno_text(ELOOP), path);
        std::vector<char> buf(static_cast<size_t>(st.st_size > 0 ? st.st_size : 255) + 1);
        ssize_t n;
        while ((n = ::readlink(at.c_str(), buf.data(), buf.size())) >= static_cast<ssize_t>(buf.size()))
            buf.resize(buf.size() * 2);
        if (n < 0) {
            const int err = errno;
            throw PathError(err, "cannot read the link " + at + ": " + errno_text(err), path);
        }
        const std::string next(buf.data(), static_cast<size_t>(n));
        at = !next.empty() && next[0] == '/' ? next : folder_of(at) + "/" + next;
    }
}

// The stop of stop_saves(): the flag, and the lock a rename holds so that a stop waits for
// a rename under way rather than passing it.
inline std::atomic<bool>& saves_stopped() {
    static std::atomic<bool> stopped{false};
    return stopped;
}
inline std::mutex& rename_lock() {
    static std::mutex lock;
    return lock;
}

}  // namespace detail

// Stops every save of this process (see the top of this file); resume_saves() lets saves
// run again.
inline void stop_saves() {
    std::lock_guard<std::mutex> hold(detail::rename_lock());
    detail::saves_stopped().store(true);
}
inline void resume_saves() { detail::saves_stopped().store(false); }

// One save of one file: the constructor opens the temporary file (fd() writes to it),
// commit() puts it in place, abort() (or the destructor) throws it away. Not copyable; use
// from one thread at a time.
class AtomicFile {
public:
    // `named_temp` skips the anonymous temporary file (tests use it to reach the fallback).
    explicit AtomicFile(const std::string& path, bool named_temp = false) : asked_(path) {
        check_path(path);
        if (path.empty()) throw PathError(ENOENT, "no file name given", path);
        if (detail::saves_stopped().load()) throw PathError(ECANCELED, "the save was stopped", path);
        target_ = detail::follow_links(path);
        folder_ = detail::folder_of(target_);
        name_ = detail::name_of(target_);
        if (name_.empty() || name_ == "." || name_ == "..")
            throw PathError(EISDIR, "is a directory", path);
        open_folder();
        check_target();
        const std::string stem = detail::stem_of(name_, 32);
        prefix_ = "." + stem + "-" + detail::hex(detail::fnv1a(name_), 16) + "." + detail::host_tag() + ".";
        const mode_t mode = have_old_ ? 0600 : 0666;  // the kernel applies the umask
        if (!named_temp) open_anonymous(mode);
        if (fd_ < 0) open_named(mode);
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile() { abort(); }

    int fd() const { return fd_; }
    const std::string& path() const { return asked_; }
    // The file the save replaces or creates: path() with symbolic links followed.
    const std::string& target() const { return target_; }
    // The temporary file's name in the target's folder; empty while it is anonymous.
    const std::string& temp_name() const { return temp_; }
    bool open() const { return fd_ >= 0; }

    void write(const void* data, size_t size) {
        require_open();
        const char* p = static_cast<const char*>(data);
        while (size > 0) {
            // in pieces, so that a stop is seen within one piece's time
            if (detail::saves_stopped().load()) fail(ECANCELED, "the save was stopped: ");
            const ssize_t w = ::write(fd_, p, std::min(size, kPiece));
            if (w < 0) {
                if (errno == EINTR) continue;
                fail(errno, "cannot write: ");
            }
            p += w;
            size -= static_cast<size_t>(w);
        }
    }

    void commit() {
        require_open();
        keep_attributes();
        if (::fsync(fd_) != 0) fail(errno, "cannot write: ");
        {
            // a stop comes before this point (the save fails) or after the rename
            std::lock_guard<std::mutex> hold(detail::rename_lock());
            if (detail::saves_stopped().load()) fail(ECANCELED, "the save was stopped: ");
            if (temp_.empty()) link_anonymous();
            const int fd = fd_;
            fd_ = -1;
            if (::close(fd) != 0) fail(errno, "cannot write: ");
            if (::renameat(dir_, temp_.c_str(), dir_, name_.c_str()) != 0)
                fail(errno, "cannot replace it: ");
        }
        temp_.clear();
        // Best effort: some file systems refuse to sync a folder (or the folder was opened
        // for search only), and the data itself is on disk already.
        ::fsync(dir_);
        remove_stale_temps();
        ::close(dir_);
        dir_ = -1;
    }

    void abort() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        if (!temp_.empty() && dir_ >= 0) ::unlinkat(dir_, temp_.c_str(), 0);
        temp_.clear();
        if (dir_ >= 0) ::close(dir_);
        dir_ = -1;
    }

private:
    static constexpr size_t kPiece = size_t(16) << 20;

    [[noreturn]] void fail(int err, const std::string& what) {
        abort();
        throw PathError(err, what + detail::errno_text(err), asked_);
    }

    void require_open() const {
        if (fd_ < 0) throw std::logic_error(asked_ + ": this save is already committed or aborted");
    }

    void open_folder() {
        dir_ = ::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_ < 0 && errno == EACCES) dir_ = ::open(folder_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir_ >= 0) return;
        const int err = errno;
        if (err == ENOENT) throw PathError(err, "the folder " + folder_ + " does not exist", asked_);
        if (err == ENOTDIR) throw PathError(err, folder_ + " is not a folder", asked_);
        throw PathError(err, "cannot open the folder " + folder_ + ": " + detail::errno_text(err), asked_);
    }

    void check_target() {
        struct stat st;
        if (::fstatat(dir_, name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) return;
            const int err = errno;
            ::close(dir_);
            dir_ = -1;
            throw PathError(err, detail::errno_text(err), asked_);
        }
        const char* refusal = nullptr;
        int err = EINVAL;
        if (S_ISDIR(st.st_mode)) {
            refusal = "is a directory";
            err = EISDIR;
        } else if (!S_ISREG(st.st_mode)) {
            refusal = "is not a regular file (a save replaces the file, which would replace this "
                      "device, pipe or socket)";
        }
        if (refusal != nullptr) {
            ::close(dir_);
            dir_ = -1;
            throw PathError(err, refusal, asked_);
        }
        have_old_ = true;
        old_ = st;
    }

    void open_anonymous(mode_t mode) {
#ifdef O_TMPFILE
        // Linking it needs /proc/self/fd without privileges: without /proc, name it at once.
        if (::access("/proc/self/fd", X_OK) != 0 && ::geteuid() != 0) return;
        fd_ = ::openat(dir_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
        if (fd_ >= 0) return;
        const int err = errno;
        // The file system (or kernel) has no anonymous files: fall back to a named one.
        if (err == EOPNOTSUPP || err == EISDIR || err == EINVAL || err == ENOENT) return;
        creation_failed(err);
#else
        (void)mode;
#endif
    }

    void open_named(mode_t mode) {
        for (int tries = 0;; ++tries) {
            temp_ = fresh_temp_name();
            fd_ = ::openat(dir_, temp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
            if (fd_ >= 0) return;
            const int err = errno;
            temp_.clear();
            if (err != EEXIST || tries == 100) creation_failed(err);
        }
    }

    [[noreturn]] void creation_failed(int err) {
        std::string why = "cannot create a file in " + folder_ + ": " + detail::errno_text(err);
        // The folder was opened, so ENOENT here comes from a file system that takes no new
        // files (/proc, /sys), not from a missing folder.
        if (err == ENOENT) why += " (the folder exists; its file system refuses new files)";
        abort();
        throw PathError(err, why, asked_);
    }

    std::string fresh_temp_name() const {
        return prefix_ + std::to_string(::getpid()) + "." + detail::hex(detail::random_word(), 8) + ".ngctmp";
    }

    // Mode, then owner and group, of the file being replaced. chown may clear setuid and
    // setgid, so the mode comes after it; those bits are kept only with the owner and group.
    void keep_attributes() {
        if (!have_old_) return;
        bool owners_kept = ::fchown(fd_, old_.st_uid, old_.st_gid) == 0;
        if (!owners_kept) {
            // Another user's file: keeping at least its group is allowed when we belong to it.
            if (::fchown(fd_, static_cast<uid_t>(-1), old_.st_gid) != 0) {
                // Not permitted either: the new file is the saver's, as with any editor.
            }
        }
        const mode_t mode = old_.st_mode & (owners_kept ? 07777 : 01777);
        if (::fchmod(fd_, mode) != 0) fail(errno, "cannot set the file's mode: ");
    }

    void link_anonymous() {
        const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
        for (int tries = 0;; ++tries) {
            temp_ = fresh_temp_name();
            // AT_EMPTY_PATH needs privileges on older kernels; /proc/self/fd does not.
            if (::linkat(fd_, "", dir_, temp_.c_str(), AT_EMPTY_PATH) == 0) return;
            if (errno != EEXIST &&
                ::linkat(AT_FDCWD, proc.c_str(), dir_, temp_.c_str(), AT_SYMLINK_FOLLOW) == 0)
                return;
            const int err = errno;
            temp_.clear();
            if (err != EEXIST || tries == 100) fail(err, "cannot name the new file: ");
        }
    }

    // Temporary files of this target, from this host, whose writer is gone.
    void remove_stale_temps() noexcept {
        const int fd = ::openat(dir_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return;
        DIR* d = ::fdopendir(fd);
        if (d == nullptr) {
            ::close(fd);
            return;
        }
        const pid_t self = ::getpid();
        std::vector<std::string> stale;
        static const std::string suffix = ".ngctmp";
        while (const dirent* e = ::readdir(d)) {
            const std::string name = e->d_name;
            if (name.size() <= prefix_.size() + suffix.size() || name.compare(0, prefix_.size(), prefix_) != 0 ||
                name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
                continue;
            const std::string rest = name.substr(prefix_.size(), name.size() - prefix_.size() - suffix.size());
            const size_t dot = rest.find('.');
            if (dot == 0 || dot == std::string::npos || dot > 10) continue;
            if (rest.find_first_not_of("0123456789") != dot) continue;
            const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
            if (pid <= 0 || pid == self) continue;  // our own: another thread's live save
            if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(name);
        }
        for (const std::string& name : stale) ::unlinkat(dirfd(d), name.c_str(), 0);
        ::closedir(d);
    }

    std::string asked_, target_, folder_, name_, prefix_, temp_;
    int dir_ = -1;
    int fd_ = -1;
    bool have_old_ = false;
    struct stat old_ {};
};

}  // namespace ngramcache
