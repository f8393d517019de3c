// llama.cpp's lookup.bin format (docs/llama-lookup.md §4): parsing, loading into an NgramCache,
// serialising one and saving it.
//
// Records follow each other with no header: key (4 x int32, -1 padded), int32 ntokens,
// then ntokens pairs of (int32 token, int32 count), all little-endian.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cache.hpp"
#include "file_io.hpp"
#include "ngram.hpp"

namespace ngramcache {

static_assert(sizeof(int32_t) == 4, "lookup.bin stores 32-bit integers");

inline int32_t load_i32(const char* p) {
    uint8_t b[4];
    std::memcpy(b, p, 4);
    return static_cast<int32_t>(uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 |
                                uint32_t(b[3]) << 24);
}

inline void store_i32(std::vector<char>& out, int32_t v) {
    const uint32_t u = static_cast<uint32_t>(v);
    const char b[4] = {char(u & 0xff), char((u >> 8) & 0xff), char((u >> 16) & 0xff), char(u >> 24)};
    out.insert(out.end(), b, b + 4);
}

// Checks that the 4 slots are a real n-gram: 1..4 non-negative tokens, then -1 padding.
inline bool valid_key(const Ngram& k) {
    int n = 0;
    while (n < kNgramMax && k.t[n] >= 0) ++n;
    if (n == 0) return false;
    for (int i = n; i < kNgramMax; ++i)
        if (k.t[i] != kTokenNull) return false;
    return true;
}

// Calls on_record(key, pairs, ntokens) for every record of a lookup.bin image, in file
// order; `pairs` points at 2*ntokens little-endian int32 values. Validates as it goes.
template <class OnRecord>
inline void parse_lookup(const char* data, size_t size, const std::string& name, OnRecord on_record) {
    auto fail = [&](size_t off, const std::string& why) {
        throw FormatError(name + ": not a valid lookup.bin: " + why + " at byte offset " +
                          std::to_string(off));
    };
    if (size % 4 != 0)
        fail(size - size % 4, "file size " + std::to_string(size) +
                                  " is not a multiple of 4 (records are made of int32 values)");
    size_t off = 0;
    while (off < size) {
        if (size - off < 20) fail(off, "truncated record (" + std::to_string(size - off) +
                                           " bytes left, a record needs at least 20)");
        Ngram key;
        for (int i = 0; i < kNgramMax; ++i) key.t[i] = load_i32(data + off + 4 * i);
        if (!valid_key(key)) fail(off, "invalid n-gram key (needs 1-4 token ids >= 0, then -1 padding)");
        const int32_t ntokens = load_i32(data + off + 16);
        if (ntokens <= 0) fail(off + 16, "ntokens = " + std::to_string(ntokens) + " (must be > 0)");
        const size_t need = 20 + 8 * static_cast<size_t>(ntokens);
        if (size - off < need)
            fail(off, "truncated record (needs " + std::to_string(need) + " bytes, " +
                          std::to_string(size - off) + " left)");
        const char* pairs = data + off + 20;
        for (int32_t j = 0; j < ntokens; ++j) {
            const int32_t tok = load_i32(pairs + 8 * j);
            const int32_t cnt = load_i32(pairs + 8 * j + 4);
            if (tok < 0) fail(off + 20 + 8 * j, "token id " + std::to_string(tok) + " < 0");
            if (cnt <= 0) fail(off + 24 + 8 * j, "count " + std::to_string(cnt) + " (must be > 0)");
        }
        on_record(key, pairs, ntokens);
        off += need;
    }
}

// Loads a lookup.bin image into `cache` (which should be empty). Pairs keep their file
// order as first-seen order. Like llama.cpp, a repeated key or token keeps the first one.
inline void load_lookup(NgramCache& cache, const char* data, size_t size, const std::string& name) {
    cache.reserve(size / 28);
    parse_lookup(data, size, name, [&](const Ngram& key, const char* pairs, int32_t ntokens) {
        Part& part = cache.get_or_insert(key);
        if (part.size() != 0) return;  // duplicate key
        for (int32_t j = 0; j < ntokens; ++j) {
            const token_t tok = load_i32(pairs + 8 * j);
            const int32_t cnt = load_i32(pairs + 8 * j + 4);
            if (part.count_of(tok) == 0) part.add_new(tok, cnt);
        }
    });
    cache.recount();
}

inline void load_lookup_file(NgramCache& cache, const std::string& path) {
    const std::vector<char> buf = read_file(path);
    load_lookup(cache, buf.data(), buf.size(), path);
}

// The file image of `cache`, in the order llama.cpp's common_ngram_cache_save writes it:
// records in the iteration order of its outer map, pairs in that of each part's map, for
// the insertion sequences the cache holds (byte for byte llama-lookup-create's file for
// the same tokens, and llama-lookup-merge's for the same files).
inline std::vector<char> serialize_lookup(const NgramCache& cache) {
    size_t bytes = 0;
    for (size_t i = 0; i < cache.size(); ++i) bytes += 20 + 8 * size_t(cache.part_at(i).size());
    std::vector<char> out;
    out.reserve(bytes);
    for (uint32_t i : cache.llama_key_order()) {
        const Part& p = cache.part_at(i);
        if (p.size() == 0) continue;
        const Ngram& k = cache.key_at(i);
        for (int s = 0; s < kNgramMax; ++s) store_i32(out, k.t[s]);
        store_i32(out, static_cast<int32_t>(p.size()));
        for (uint32_t j : libstdcxx::part_order(p.size(), [&](size_t x) { return p[uint32_t(x)].token; })) {
            store_i32(out, p[j].token);
            store_i32(out, p[j].count);
        }
    }
    return out;
}

inline void save_lookup_file(const NgramCache& cache, const std::string& path) {
    const std::vector<char> img = serialize_lookup(cache);
    write_file_atomic(path, img.data(), img.size());
}

}  // namespace ngramcache
