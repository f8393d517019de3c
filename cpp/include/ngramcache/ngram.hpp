// N-gram keys: 4 x int32, unused slots -1 (llama.cpp's common_ngram layout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ngramcache {

using token_t = int32_t;

constexpr int kNgramMax = 4;          // LLAMA_NGRAM_MAX: slots in a key
constexpr int kNgramStatic = 2;       // LLAMA_NGRAM_STATIC
constexpr token_t kTokenNull = -1;    // LLAMA_TOKEN_NULL

// Errors the bindings translate into specific Python exceptions.
struct FormatError : std::runtime_error {   // -> ngramcache.CacheFormatError
    using std::runtime_error::runtime_error;
};
struct InputError : std::invalid_argument {  // -> ValueError
    using std::invalid_argument::invalid_argument;
};

struct Ngram {
    token_t t[kNgramMax] = {kTokenNull, kTokenNull, kTokenNull, kTokenNull};

    Ngram() = default;
    // The n tokens at p[0..n-1], padded with -1.
    Ngram(const token_t* p, int n) {
        for (int i = 0; i < n; ++i) t[i] = p[i];
    }
    // The same from a caller's array, whose length is not trusted.
    static Ngram checked(const token_t* p, size_t n) {
        if (n < 1 || n > size_t(kNgramMax))
            throw InputError("an n-gram is 1 to 4 token ids, got " + std::to_string(n));
        return Ngram(p, static_cast<int>(n));
    }
    static Ngram of2(token_t a, token_t b) {
        Ngram k;
        k.t[0] = a;
        k.t[1] = b;
        return k;
    }
    int size() const {
        int n = 0;
        while (n < kNgramMax && t[n] != kTokenNull) ++n;
        return n;
    }
    friend bool operator==(const Ngram& a, const Ngram& b) {
        return std::memcmp(a.t, b.t, sizeof a.t) == 0;
    }
    friend bool operator!=(const Ngram& a, const Ngram& b) { return !(a == b); }
    // Lexicographic over signed slots: the canonical order of cache-stats.jsonl.
    friend bool operator<(const Ngram& a, const Ngram& b) {
        for (int i = 0; i < kNgramMax; ++i)
            if (a.t[i] != b.t[i]) return a.t[i] < b.t[i];
        return false;
    }
};
static_assert(sizeof(Ngram) == 16, "an n-gram key is 16 bytes, as in llama.cpp");

// Asks the CPU to start loading the cache line at p (a hint: never faults, whatever p is).
// Drafting issues these for every table slot a step may read before it reads any, so that
// the misses of independent lookups overlap instead of following one another.
inline void prefetch_read(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0, 3);
#else
    (void)p;
#endif
}

// murmur3's 64-bit finaliser: a bijection that spreads every input bit over the output.
inline uint64_t fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

// Order-sensitive (unlike llama.cpp's XOR of per-token hashes, where "a b" and "b a" collide).
// Two 64-bit lanes, multiplied by odd constants, combined with a rotation, then the
// murmur3 finaliser so that every input bit reaches the high bits used for fingerprints.
inline uint64_t hash_ngram(const Ngram& k) {
    uint64_t a, b;
    std::memcpy(&a, &k.t[0], 8);
    std::memcpy(&b, &k.t[2], 8);
    uint64_t h = a * 0x9E3779B97F4A7C15ull;
    h ^= (b * 0xC2B2AE3D27D4EB4Full);
    h = (h << 29) | (h >> 35);
    h += a ^ 0x165667B19E3779F9ull;
    return fmix64(h);
}

inline bool host_is_little_endian() {
    const uint16_t one = 1;
    uint8_t b;
    std::memcpy(&b, &one, 1);
    return b == 1;
}

}  // namespace ngramcache
