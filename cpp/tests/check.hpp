// A minimal test harness: TEST registers a function, CHECK* macros end the current test
// on the first failed check (later checks would only report the same root cause), and
// main runs every test, or the ones named on the command line.
//
// Exit status: 0 when every test ran and passed, 1 when one failed, 77 when every test
// skipped (CTest reports that as "Skipped" through SKIP_RETURN_CODE).
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace check {

struct Failed {
    std::string message;
};
struct Skipped {
    std::string reason;
};

struct Test {
    const char* name;
    void (*fn)();
};

inline std::vector<Test>& registry() {
    static std::vector<Test> tests;
    return tests;
}

struct Register {
    Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

template <class T, class = void>
struct Printable : std::false_type {};
template <class T>
struct Printable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};

// Small integer types print as numbers, not as characters.
template <class T>
std::string show(const T& v) {
    std::ostringstream os;
    if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>)
        os << static_cast<int>(v);
    else if constexpr (std::is_enum_v<T>)
        os << static_cast<long long>(v);
    else if constexpr (Printable<T>::value)
        os << v;
    else
        os << "<" << sizeof(T) << "-byte value>";
    return os.str();
}

template <class T>
std::string show(const std::vector<T>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) s += ", ";
        if (i == 32) {
            s += "... (" + std::to_string(v.size()) + " items)";
            break;
        }
        s += show(v[i]);
    }
    return s + "]";
}

inline std::string where(const char* file, int line) { return std::string(file) + ":" + std::to_string(line) + ": "; }

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
    throw Failed{where(file, line) + what};
}

template <class A, class B>
void check_eq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line,
              const std::string& note) {
    if (a == b) return;
    fail(file, line,
         std::string("CHECK_EQ(") + ea + ", " + eb + ") failed\n    left:  " + show(a) + "\n    right: " + show(b) +
             (note.empty() ? "" : "\n    " + note));
}

// Context for the next CHECK failures of a loop (seed, position, ...).
inline std::string& note() {
    static std::string n;
    return n;
}

inline int run_all(int argc, char** argv) {
    int passed = 0, failed = 0, skipped = 0, ran = 0;
    for (const Test& t : registry()) {
        bool wanted = argc < 2;
        for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], t.name) == 0;
        if (!wanted) continue;
        ++ran;
        note().clear();
        try {
            t.fn();
            ++passed;
            std::printf("[ pass ] %s\n", t.name);
        } catch (const Skipped& s) {
            ++skipped;
            std::printf("[ skip ] %s: %s\n", t.name, s.reason.c_str());
        } catch (const Failed& f) {
            ++failed;
            std::printf("[ FAIL ] %s\n  %s\n", t.name, f.message.c_str());
        } catch (const std::exception& e) {
            ++failed;
            std::printf("[ FAIL ] %s\n  unexpected exception: %s\n", t.name, e.what());
        } catch (...) {
            ++failed;
            std::printf("[ FAIL ] %s\n  unexpected exception of unknown type\n", t.name);
        }
        std::fflush(stdout);
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (ran == 0) {
        std::printf("no test matched the names given\n");
        return 1;
    }
    if (failed > 0) return 1;
    return skipped == ran ? 77 : 0;
}

}  // namespace check

#define CHECK_CAT2(a, b) a##b
#define CHECK_CAT(a, b) CHECK_CAT2(a, b)

#define TEST(name)                                                  \
    static void name();                                             \
    static const ::check::Register CHECK_CAT(check_reg_, name){#name, name}; \
    static void name()

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond))                                                                             \
            ::check::fail(__FILE__, __LINE__,                                                    \
                          std::string("CHECK(" #cond ") failed") +                               \
                              (::check::note().empty() ? "" : "\n    " + ::check::note()));      \
    } while (0)

#define CHECK_EQ(a, b) ::check::check_eq((a), (b), #a, #b, __FILE__, __LINE__, ::check::note())

// Runs `expr`; passes only if it throws `Type` (or a subclass) whose what() contains `substr`.
#define CHECK_THROWS_AS(expr, Type, substr)                                                           \
    do {                                                                                              \
        bool check_threw_ = false;                                                                    \
        try {                                                                                         \
            (void)(expr);                                                                             \
        } catch (const Type& e) {                                                                     \
            check_threw_ = true;                                                                      \
            if (std::string(e.what()).find(substr) == std::string::npos)                              \
                ::check::fail(__FILE__, __LINE__,                                                     \
                              std::string("CHECK_THROWS_AS(" #expr ", " #Type "): message \"") +      \
                                  e.what() + "\" lacks \"" + (substr) + "\"");                        \
        } catch (const ::check::Failed&) {                                                            \
            throw;                                                                                    \
        } catch (const std::exception& e) {                                                           \
            ::check::fail(__FILE__, __LINE__,                                                         \
                          std::string("CHECK_THROWS_AS(" #expr ", " #Type "): threw another type: ") + \
                              e.what());                                                              \
        }                                                                                             \
        if (!check_threw_)                                                                            \
            ::check::fail(__FILE__, __LINE__, "CHECK_THROWS_AS(" #expr ", " #Type "): nothing thrown"); \
    } while (0)

#define SKIP(reason) throw ::check::Skipped{reason}

#define CHECK_MAIN() \
    int main(int argc, char** argv) { return ::check::run_all(argc, argv); }
