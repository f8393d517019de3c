// Saving files (atomic_file.hpp): what replaces what, what a killed writer leaves, the
// new file's mode and owner, links, long names, the errors, and saves racing each other.
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/file_io.hpp"

using namespace ngramcache;

namespace {

std::string contents(const std::string& path) {
    const std::vector<char> b = read_file(path);
    return std::string(b.begin(), b.end());
}

void save(const std::string& path, const std::string& text) { write_file_atomic(path, text.data(), text.size()); }

mode_t mode_of(const std::string& path) {
    struct stat st;
    CHECK(::stat(path.c_str(), &st) == 0);
    return st.st_mode & 07777;
}

bool is_link(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Sets the umask for one scope.
struct Umask {
    explicit Umask(mode_t m) : old(::umask(m)) {}
    ~Umask() { ::umask(old); }
    mode_t old;
};

// The errno of the PathError `f` throws (0 when it throws none), checking it names `path`.
template <class F>
int path_error(F f, const std::string& path, std::string* message = nullptr) {
    try {
        f();
    } catch (const PathError& e) {
        CHECK_EQ(e.path(), path);
        if (message != nullptr) *message = e.message();
        return e.err();
    }
    return 0;
}

// A child process that starts a save of `path` with `text`, and is killed with SIGKILL
// while its temporary file exists.
void killed_while_saving(const std::string& path, const std::string& text, bool named_temp) {
    int ready[2];
    CHECK(::pipe(ready) == 0);
    const pid_t child = ::fork();
    CHECK(child >= 0);
    if (child == 0) {
        AtomicFile f(path, named_temp);
        f.write(text.data(), text.size());
        const char one = 1;
        if (::write(ready[1], &one, 1) != 1) ::_exit(3);
        ::pause();
        ::_exit(0);
    }
    char got = 0;
    CHECK_EQ(::read(ready[0], &got, 1), static_cast<ssize_t>(1));
    CHECK(::kill(child, SIGKILL) == 0);
    int status = 0;
    CHECK_EQ(::waitpid(child, &status, 0), child);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ::close(ready[0]);
    ::close(ready[1]);
}

}  // namespace

TEST(a_save_replaces_the_file_and_leaves_no_temporary) {
    test::TempDir dir;
    const std::string path = dir.file("cache.bin");
    save(path, "first, longer than the second");
    save(path, "second");
    CHECK_EQ(contents(path), std::string("second"));
    {
        AtomicFile named(path, true);
        CHECK(!named.temp_name().empty());
        named.write("third", 5);
        named.commit();
    }
    CHECK_EQ(contents(path), std::string("third"));
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
}

TEST(an_aborted_save_leaves_the_file_as_it_was) {
    test::TempDir dir;
    const std::string path = dir.file("cache.bin");
    save(path, "old");
    for (const bool named : {false, true}) {
        AtomicFile f(path, named);
        f.write("new", 3);
        f.abort();
        CHECK_THROWS_AS(f.commit(), std::logic_error, "already committed or aborted");
    }
    {
        AtomicFile dropped(path);  // the destructor aborts
        dropped.write("new", 3);
    }
    CHECK_EQ(contents(path), std::string("old"));
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
}

TEST(a_stop_fails_every_save_before_its_rename_and_none_after) {
    test::TempDir dir;
    const std::string path = dir.file("cache.bin");
    save(path, "old");
    for (const bool named : {false, true}) {
        AtomicFile writing(path, named);  // stopped while it writes
        writing.write("new", 3);
        stop_saves();
        CHECK_THROWS_AS(writing.write("more", 4), PathError, "the save was stopped");
        resume_saves();
        AtomicFile committing(path, named);  // stopped before its commit
        committing.write("new", 3);
        stop_saves();
        CHECK_THROWS_AS(committing.commit(), PathError, "the save was stopped");
        CHECK_THROWS_AS(save(path, "new"), PathError, "the save was stopped");  // not even begun
        resume_saves();
    }
    CHECK_EQ(contents(path), std::string("old"));
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
    AtomicFile done(path);  // committed before the stop: the stop changes nothing
    done.write("new", 3);
    done.commit();
    stop_saves();
    resume_saves();
    CHECK_EQ(contents(path), std::string("new"));
    // a stop from another thread while a long save writes: either it failed, the old file
    // whole, or it had renamed first and the new file is whole; never a temporary left
    const std::string big(size_t(64) << 20, 'x');
    std::atomic<bool> failed{false};
    std::thread writer([&] {
        try {
            save(path, big);
        } catch (const PathError& e) {
            failed = e.err() == ECANCELED;
        }
    });
    stop_saves();
    writer.join();
    resume_saves();
    CHECK(contents(path) == (failed ? std::string("new") : big));
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
}

TEST(a_killed_writer_leaves_the_old_file_and_the_next_save_removes_its_temporary) {
    test::TempDir dir;
    const std::string path = dir.file("cache.bin");
    save(path, "old");
    const std::string big(1 << 20, 'x');

    killed_while_saving(path, big, true);
    CHECK_EQ(contents(path), std::string("old"));
    const std::vector<std::string> left = dir.listing();
    CHECK_EQ(left.size(), size_t{2});
    CHECK(left[0].rfind(".cache.bin-", 0) == 0 && left[0].find(".ngctmp") == left[0].size() - 7);
    save(dir.file("other.bin"), "x");  // another target's save leaves it alone
    CHECK_EQ(dir.listing().size(), size_t{3});
    save(path, "new");
    CHECK_EQ(contents(path), std::string("new"));
    CHECK_EQ(dir.listing(), (std::vector<std::string>{"cache.bin", "other.bin"}));

    // Where the file system has anonymous temporary files nothing is left at all.
    killed_while_saving(path, big, false);
    CHECK_EQ(contents(path), std::string("new"));
    if (AtomicFile(path).temp_name().empty())
        CHECK_EQ(dir.listing(), (std::vector<std::string>{"cache.bin", "other.bin"}));
}

TEST(a_live_writers_temporary_file_is_never_removed) {
    test::TempDir dir;
    const std::string path = dir.file("cache.bin");
    int ready[2], done[2];
    CHECK(::pipe(ready) == 0 && ::pipe(done) == 0);
    const pid_t child = ::fork();
    CHECK(child >= 0);
    if (child == 0) {
        AtomicFile f(path, true);
        f.write("child", 5);
        const char one = 1;
        if (::write(ready[1], &one, 1) != 1) ::_exit(3);
        char go = 0;
        if (::read(done[0], &go, 1) != 1) ::_exit(4);
        f.commit();
        ::_exit(0);
    }
    char got = 0;
    CHECK_EQ(::read(ready[0], &got, 1), static_cast<ssize_t>(1));
    save(path, "parent");
    CHECK_EQ(dir.listing().size(), size_t{2});  // the child's temporary file is still there
    const char go = 1;
    CHECK_EQ(::write(done[1], &go, 1), static_cast<ssize_t>(1));
    int status = 0;
    CHECK_EQ(::waitpid(child, &status, 0), child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(contents(path), std::string("child"));
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
    for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
}

TEST(a_new_file_gets_0666_less_the_umask) {
    test::TempDir dir;
    for (const bool named : {false, true}) {
        for (const mode_t mask : {mode_t{022}, mode_t{077}, mode_t{002}}) {
            const std::string path = dir.file("new-" + std::to_string(mask) + (named ? "-named" : ""));
            Umask u(mask);
            AtomicFile f(path, named);
            f.write("x", 1);
            f.commit();
            CHECK_EQ(mode_of(path), static_cast<mode_t>(0666 & ~mask));
        }
    }
}

TEST(a_replaced_file_keeps_its_mode_and_owner) {
    test::TempDir dir;
    const std::string path = dir.file("kept.bin");
    save(path, "old");
    for (const mode_t mode : {mode_t{0640}, mode_t{0444}, mode_t{0755}}) {
        CHECK(::chmod(path.c_str(), mode) == 0);
        Umask u(077);
        save(path, "new");
        CHECK_EQ(mode_of(path), mode);
    }
    if (::geteuid() != 0) return;  // only root may give a file away
    CHECK(::chown(path.c_str(), 1234, 5678) == 0);
    save(path, "newer");
    struct stat st;
    CHECK(::stat(path.c_str(), &st) == 0);
    CHECK_EQ(st.st_uid, static_cast<uid_t>(1234));
    CHECK_EQ(st.st_gid, static_cast<gid_t>(5678));
}

TEST(saving_to_a_link_writes_its_target_and_keeps_the_link) {
    test::TempDir dir;
    CHECK(::mkdir(dir.file("real").c_str(), 0755) == 0);
    const std::string real = dir.file("real/data.bin");
    save(real, "old");
    CHECK(::symlink("real/data.bin", dir.file("one").c_str()) == 0);  // relative to its folder
    CHECK(::symlink(dir.file("one").c_str(), dir.file("two").c_str()) == 0);
    save(dir.file("two"), "through two links");
    CHECK(is_link(dir.file("one")) && is_link(dir.file("two")));
    CHECK_EQ(contents(real), std::string("through two links"));
    CHECK_EQ(dir.listing(), (std::vector<std::string>{"one", "real", "two"}));

    CHECK(::symlink("real/made.bin", dir.file("dangling").c_str()) == 0);
    save(dir.file("dangling"), "created");
    CHECK(is_link(dir.file("dangling")));
    CHECK_EQ(contents(dir.file("real/made.bin")), std::string("created"));

    CHECK(::symlink("loop", dir.file("loop").c_str()) == 0);
    CHECK_EQ(path_error([&] { save(dir.file("loop"), "x"); }, dir.file("loop")), ELOOP);
}

TEST(any_name_of_up_to_255_bytes_can_be_saved) {
    test::TempDir dir;
    for (const size_t n : {size_t{1}, size_t{200}, size_t{245}, size_t{250}, size_t{255}}) {
        const std::string path = dir.file(std::string(n, 'n'));
        save(path, "old");
        save(path, "new");
        CHECK_EQ(contents(path), std::string("new"));
        AtomicFile named(path, true);
        named.write("named", 5);
        named.commit();
        CHECK_EQ(contents(path), std::string("named"));
    }
    // Two characters of three bytes each cut at 32 bytes: the stem stops before them.
    std::string wide(31, 'w');
    wide += "\xe2\x82\xac\xe2\x82\xac";
    AtomicFile f(dir.file(wide), true);
    CHECK_EQ(f.temp_name().substr(0, 33), "." + std::string(31, 'w') + "-");
    f.abort();
    CHECK_EQ(path_error([&] { save(dir.file(std::string(256, 'n')), "x"); }, dir.file(std::string(256, 'n'))),
             ENAMETOOLONG);
}

TEST(errors_name_the_path_and_the_reason) {
    test::TempDir dir;
    std::string message;
    const std::string missing = dir.file("no/such/cache.bin");
    CHECK_EQ(path_error([&] { save(missing, "x"); }, missing, &message), ENOENT);
    CHECK(message.find("folder " + dir.file("no/such") + " does not exist") != std::string::npos);
    CHECK(dir.listing().empty());

    save(dir.file("file"), "x");
    CHECK_EQ(path_error([&] { save(dir.file("file/under"), "x"); }, dir.file("file/under"), &message), ENOTDIR);
    CHECK_EQ(path_error([&] { save(dir.path().string(), "x"); }, dir.path().string()), EISDIR);
    CHECK_EQ(path_error([&] { save(dir.file("."), "x"); }, dir.file(".")), EISDIR);
    CHECK_EQ(path_error([&] { save("", "x"); }, ""), ENOENT);
    CHECK(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
    CHECK_EQ(path_error([&] { save(dir.file("fifo"), "x"); }, dir.file("fifo"), &message), EINVAL);
    CHECK(message.find("not a regular file") != std::string::npos);
    CHECK_THROWS_AS(save(dir.file("a") + std::string(1, '\0') + "b", "x"), InputError, "NUL byte");

    struct stat st;
    if (::stat("/proc/self", &st) == 0) {
        const int err = path_error([&] { save("/proc/x.bin", "x"); }, "/proc/x.bin", &message);
        CHECK(err != 0);
        CHECK(message.find("does not exist") == std::string::npos);
        CHECK(message.find("cannot create a file in /proc: ") == 0);
    }
    if (::geteuid() != 0) {  // root writes anywhere
        CHECK(::mkdir(dir.file("locked").c_str(), 0555) == 0);
        CHECK_EQ(path_error([&] { save(dir.file("locked/x"), "x"); }, dir.file("locked/x"), &message), EACCES);
        CHECK(message.find("cannot create a file in " + dir.file("locked")) == 0);
    }
}

TEST(threads_saving_one_target_at_once_all_succeed) {
    test::TempDir dir;
    const std::string path = dir.file("shared.bin");
    const std::vector<std::string> versions = {std::string(100000, 'a'), std::string(70000, 'b'),
                                               std::string(130000, 'c'), std::string(1, 'd')};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (const std::string& v : versions) {
        threads.emplace_back([&, v] {
            for (int i = 0; i < 20; ++i) {
                try {
                    save(path, v);
                } catch (const std::exception&) {
                    ++failures;
                }
            }
        });
    }
    for (std::thread& t : threads) t.join();
    CHECK_EQ(failures.load(), 0);
    const std::string left = contents(path);
    bool whole = false;
    for (const std::string& v : versions) whole = whole || left == v;
    CHECK(whole);
    CHECK_EQ(dir.listing(), std::vector<std::string>{"shared.bin"});
}

CHECK_MAIN()
