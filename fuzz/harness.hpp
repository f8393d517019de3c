// What the C++ fuzz harnesses share: the rule for a failed property (print it and abort,
// which libFuzzer and the CTest replay both report with the input that caused it) and the
// fuzz input read as little-endian int32 token ids.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fuzz {

[[noreturn]] inline void finding(const char* what) {
    std::fprintf(stderr, "fuzz finding: %s\n", what);
    std::abort();
}

inline void require(bool ok, const char* what) {
    if (!ok) finding(what);
}

// Up to `max` token ids from bytes: each 2-byte little-endian word taken modulo `vocab`,
// so that a small input already draws tokens that the table under test knows.
inline std::vector<int32_t> tokens_from(const uint8_t* p, size_t n, int32_t vocab, size_t max) {
    std::vector<int32_t> out;
    for (size_t i = 0; i + 1 < n && out.size() < max; i += 2)
        out.push_back(static_cast<int32_t>((uint32_t(p[i]) | uint32_t(p[i + 1]) << 8) % uint32_t(vocab)));
    return out;
}

}  // namespace fuzz
