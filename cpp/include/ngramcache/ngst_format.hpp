// The NGST file format: constants, checksums, the key hash, bucket math, the header and
// the placement of the sections (docs/format.md describes every byte). Everything a reader
// or a writer of the format must agree on lives here, and nothing else.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "ngram.hpp"

namespace ngramcache {
namespace ngst {

constexpr char kMagic[4] = {'N', 'G', 'S', 'T'};
constexpr uint16_t kVersion = 1;
constexpr uint16_t kByteOrderMark = 0xFEFF;  // bytes FF FE in a little-endian file
constexpr size_t kHeaderSize = 64;
constexpr uint64_t kAlign = 64;              // every section starts on a cache line
constexpr uint64_t kMaxU32 = 0xFFFFFFFFull;  // key count, stored entries and sums are u32

// Where the counts came from; says what "first seen" meant for the best token.
enum class Source : uint8_t { tokens = 0, lookup = 1, cache = 2 };

inline const char* source_name(Source s) {
    switch (s) {
        case Source::tokens: return "tokens";
        case Source::lookup: return "lookup.bin";
        case Source::cache: return "NgramCache";
    }
    return "?";
}

inline void check_ngram_size(int n) {
    if (n < 1 || n > kNgramMax) throw InputError("ngram_size must be 1 to 4, got " + std::to_string(n));
}

// Images are used in place, so only a host with the file's byte order can read them.
inline void check_host() {
    if (!host_is_little_endian()) throw InputError("NGST tables need a little-endian host");
}

// Key record: fixed fields, then the key, padded to a multiple of 8 bytes.
constexpr size_t kRecBegin = 0;     // u32: first stored entry (the next record's is the end)
constexpr size_t kRecSum = 4;       // u32: sum of the key's counts
constexpr size_t kRecBestTok = 8;   // i32: best token (tie rule applied)
constexpr size_t kRecBestCnt = 12;  // u32: its count
constexpr size_t kRecKey = 16;      // n x i32: the n-gram
constexpr size_t kEntrySize = 8;    // (i32 token, i32 count)

inline uint32_t record_stride(int n) { return static_cast<uint32_t>((kRecKey + 4 * n + 7) / 8 * 8); }

inline uint64_t load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline uint32_t load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline int32_t loadi32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
inline void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void puti32(uint8_t* p, int32_t v) { std::memcpy(p, &v, 4); }

// Record fields and entries (the writers are used by the builders, the readers everywhere).
inline void write_key(uint8_t* rec, const token_t* key, int n) {
    for (int j = 0; j < n; ++j) puti32(rec + kRecKey + 4 * j, key[j]);
}
inline void write_best(uint8_t* rec, token_t tok, int64_t cnt, uint64_t sum) {
    puti32(rec + kRecBestTok, tok);
    put32(rec + kRecBestCnt, static_cast<uint32_t>(cnt));
    put32(rec + kRecSum, static_cast<uint32_t>(sum));
}
inline void write_entry(uint8_t* ent, size_t j, token_t tok, int64_t cnt) {
    puti32(ent + kEntrySize * j, tok);
    puti32(ent + kEntrySize * j + 4, static_cast<int32_t>(cnt));
}
// Keys compare as signed tokens, slot by slot: the order of a bucket's records.
inline bool key_less(const uint8_t* a, const uint8_t* b, int n) {
    for (int j = 0; j < n; ++j) {
        const token_t x = loadi32(a + 4 * j), y = loadi32(b + 4 * j);
        if (x != y) return x < y;
    }
    return false;
}

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Section checksum (part of the file format: changing it needs a version bump). Four
// independent lanes so the multiplies overlap (GB/s). Each step is a bijection of the
// lane for a fixed word and of the word for a fixed lane, so a change confined to one
// 8-byte word is always detected. `size` must be a multiple of 8.
inline uint64_t checksum(const uint8_t* p, uint64_t size) {
    constexpr uint64_t P = 0x9E3779B97F4A7C15ull;
    uint64_t v[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
                     0x082EFA98EC4E6C89ull};
    const uint64_t nw = size / 8;
    uint64_t i = 0;
    for (; i + 4 <= nw; i += 4) {
        v[0] = rotl((v[0] ^ load64(p + 8 * i)) * P, 31);
        v[1] = rotl((v[1] ^ load64(p + 8 * i + 8)) * P, 31);
        v[2] = rotl((v[2] ^ load64(p + 8 * i + 16)) * P, 31);
        v[3] = rotl((v[3] ^ load64(p + 8 * i + 24)) * P, 31);
    }
    const uint64_t rem = nw - i;  // 0..3 trailing words
    for (uint64_t k = 0; k < rem && k < 4; ++k) v[k] = rotl((v[k] ^ load64(p + 8 * (i + k))) * P, 31);
    uint64_t h = size * 0xC2B2AE3D27D4EB4Full;
    for (int k = 0; k < 4; ++k) h = fmix64(h ^ v[k]);
    return h;
}

// Bucket hash of a key (part of the file format). Order-sensitive, unlike llama.cpp's
// XOR of per-token hashes where "a b" and "b a" collide.
inline uint64_t key_hash(const token_t* key, int n) {
    uint64_t h = 0x6A09E667F3BCC909ull ^ static_cast<uint64_t>(n);
    for (int j = 0; j < n; ++j) {
        h ^= static_cast<uint32_t>(key[j]);
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return fmix64(h);
}

// The smallest b with 2^(b+1) >= n_keys: one to two keys per bucket on average. The
// keys of a bucket are adjacent records, so a second one is usually on the same line.
inline uint32_t bucket_bits_for(uint64_t n_keys) {
    uint32_t b = 0;
    while ((uint64_t(2) << b) < n_keys) ++b;
    return b;
}

// The bucket is the top `bits` bits of the hash (so also of its top 32 bits).
inline uint64_t bucket_of(uint64_t hash, uint32_t bits) { return bits == 0 ? 0 : hash >> (64 - bits); }
inline uint32_t bucket_of32(uint32_t hash_hi, uint32_t bits) { return bits == 0 ? 0 : hash_hi >> (32 - bits); }

inline uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct Header {
    uint16_t version = kVersion;
    int ngram_size = 2;
    uint32_t bucket_bits = 0;
    Source source = Source::tokens;
    uint64_t n_keys = 0;
    uint64_t n_entries = 0;  // (key, token) pairs: what llama.cpp's file holds
    uint64_t total = 0;     // sum of all counts
    uint64_t n_stored = 0;  // entries in the entries section (keys with >= 2 continuations)
    uint32_t ck_header = 0;
    uint64_t ck_index = 0, ck_records = 0, ck_entries = 0;
};

// Section placement: derived from the header's counts, so a damaged count shows up as a
// size mismatch at open (besides the header check).
struct Layout {
    uint32_t stride = 0;
    uint64_t n_buckets = 0;
    uint64_t index_off = 0, index_size = 0;
    uint64_t records_off = 0, records_size = 0;
    uint64_t entries_off = 0, entries_size = 0;
    uint64_t file_size = 0;
    // A section's checksum covers it up to the next section (zero padding included).
    uint64_t index_span() const { return records_off - index_off; }
    uint64_t records_span() const { return entries_off - records_off; }
    uint64_t entries_span() const { return file_size - entries_off; }
};

// Needs 1 <= n <= 4, bits <= 31 and counts below 2^32 (no sum below can overflow).
inline Layout layout_of(int n, uint32_t bits, uint64_t n_keys, uint64_t n_stored) {
    Layout L;
    L.stride = record_stride(n);
    L.n_buckets = uint64_t(1) << bits;
    L.index_off = kHeaderSize;
    L.index_size = 4 * (L.n_buckets + 1);
    L.records_off = align_up(L.index_off + L.index_size);
    L.records_size = uint64_t(L.stride) * n_keys;
    L.entries_off = align_up(L.records_off + L.records_size);
    L.entries_size = kEntrySize * n_stored;
    L.file_size = align_up(L.entries_off + L.entries_size);
    return L;
}

// Header check: the 64-bit checksum of the 64 header bytes with bytes 36..39 (where it
// is stored) zeroed, truncated to 32 bits.
inline uint32_t header_check(const uint8_t* p) {
    uint8_t tmp[kHeaderSize];
    std::memcpy(tmp, p, kHeaderSize);
    std::memset(tmp + 36, 0, 4);
    return static_cast<uint32_t>(checksum(tmp, kHeaderSize));
}

inline void encode_header(const Header& h, uint8_t* out) {
    std::memset(out, 0, kHeaderSize);
    std::memcpy(out, kMagic, 4);
    const uint16_t ver = h.version, bom = kByteOrderMark;
    std::memcpy(out + 4, &ver, 2);
    std::memcpy(out + 6, &bom, 2);
    out[8] = static_cast<uint8_t>(h.ngram_size);
    out[9] = static_cast<uint8_t>(h.bucket_bits);
    out[10] = static_cast<uint8_t>(h.source);
    out[11] = 0;
    put32(out + 12, static_cast<uint32_t>(h.n_keys));
    put64(out + 16, h.n_entries);
    put64(out + 24, h.total);
    put32(out + 32, static_cast<uint32_t>(h.n_stored));
    put64(out + 40, h.ck_index);
    put64(out + 48, h.ck_records);
    put64(out + 56, h.ck_entries);
    put32(out + 36, header_check(out));
}

inline std::string hex_bytes(const uint8_t* p, size_t n) {
    static const char* d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

// Decodes the 64 header bytes and checks them against the file's size: O(1). Throws
// FormatError naming `name` and the problem.
inline Header decode_header(const uint8_t* p, uint64_t file_size, const std::string& name) {
    auto fail = [&](const std::string& why) -> void {
        throw FormatError(name + ": not a valid static table (NGST): " + why);
    };
    if (file_size == 0) fail("empty file");
    if (file_size < kHeaderSize)
        fail("truncated: " + std::to_string(file_size) + " bytes, the header alone needs 64");
    if (std::memcmp(p, kMagic, 4) != 0)
        fail("bad magic 0x" + hex_bytes(p, 4) +
             " (expected \"NGST\"; a llama.cpp lookup.bin is imported with from_llama)");
    uint16_t ver, bom;
    std::memcpy(&ver, p + 4, 2);
    std::memcpy(&bom, p + 6, 2);
    if (bom != kByteOrderMark) {
        if (bom == 0xFFFE) fail("big-endian file (byte-order mark fe ff); NGST files are little-endian");
        fail("bad byte-order mark 0x" + hex_bytes(p + 6, 2) + " (expected ff fe)");
    }
    if (ver != kVersion)
        fail("unsupported format version " + std::to_string(ver) + " (this build reads version " +
             std::to_string(kVersion) + ")");
    Header h;
    h.version = ver;
    h.ck_header = load32(p + 36);
    if (header_check(p) != h.ck_header) fail("header check mismatch (the header is damaged)");
    h.ngram_size = p[8];
    h.bucket_bits = p[9];
    h.n_keys = load32(p + 12);
    h.n_entries = load64(p + 16);
    h.total = load64(p + 24);
    h.n_stored = load32(p + 32);
    h.ck_index = load64(p + 40);
    h.ck_records = load64(p + 48);
    h.ck_entries = load64(p + 56);
    if (h.ngram_size < 1 || h.ngram_size > kNgramMax)
        fail("n-gram size " + std::to_string(h.ngram_size) + " (must be 1 to 4)");
    if (p[10] > static_cast<uint8_t>(Source::cache)) fail("unknown source code " + std::to_string(p[10]));
    h.source = static_cast<Source>(p[10]);
    if (p[11] != 0) fail("reserved byte 11 is " + std::to_string(p[11]) + " (must be 0)");
    if (h.bucket_bits != bucket_bits_for(h.n_keys))
        fail("bucket bits " + std::to_string(h.bucket_bits) + " do not match " + std::to_string(h.n_keys) +
             " keys");
    // Every key has one continuation kept in its record, or two or more stored entries.
    const uint64_t singles = h.n_entries - h.n_stored;
    if (h.n_entries < h.n_stored || singles > h.n_keys || h.n_stored < 2 * (h.n_keys - singles) ||
        (h.n_keys == 0 && h.n_entries != 0))
        fail(std::to_string(h.n_entries) + " entries (" + std::to_string(h.n_stored) + " stored) for " +
             std::to_string(h.n_keys) + " keys are inconsistent");
    if (h.total < h.n_entries)
        fail("total count " + std::to_string(h.total) + " below the pair count " + std::to_string(h.n_entries) +
             " (every count is at least 1)");
    const Layout L = layout_of(h.ngram_size, h.bucket_bits, h.n_keys, h.n_stored);
    if (L.file_size != file_size) {
        if (file_size < L.file_size)
            fail("truncated: " + std::to_string(file_size) + " bytes, the header describes " +
                 std::to_string(L.file_size));
        fail(std::to_string(file_size) + " bytes, the header describes " + std::to_string(L.file_size) +
             " (trailing data)");
    }
    return h;
}

// decode_header() of a file's first `n` bytes, which may be fewer than the header's 64 (a
// short file): the missing bytes read as zeros, so the size check fails first and nothing
// is read past what was given.
inline Header decode_header_prefix(const uint8_t* p, size_t n, uint64_t file_size, const std::string& name) {
    uint8_t head[kHeaderSize] = {};
    if (n > 0) std::memcpy(head, p, std::min<size_t>(n, kHeaderSize));
    return decode_header(head, file_size, name);
}

// A header with everything it implies, as `ngramcache info` and StaticTable.read_header
// show it: the fields, the layout, and each section's place, size and checksum (the
// header's own is its 32-bit header check).
struct Description {
    struct Section {
        const char* name;
        uint64_t offset, size, checksum;
    };
    const char* magic = "NGST";
    const char* byte_order = "little";
    Header header;
    Layout layout;
    Section sections[4];  // header, index, records, entries
};

inline Description describe(const Header& h) {
    Description d;
    d.header = h;
    d.layout = layout_of(h.ngram_size, h.bucket_bits, h.n_keys, h.n_stored);
    const Layout& L = d.layout;
    d.sections[0] = {"header", 0, kHeaderSize, h.ck_header};
    d.sections[1] = {"index", L.index_off, L.index_size, h.ck_index};
    d.sections[2] = {"records", L.records_off, L.records_size, h.ck_records};
    d.sections[3] = {"entries", L.entries_off, L.entries_size, h.ck_entries};
    return d;
}

// Recomputes the section checksums and the header check of an image whose header
// otherwise decodes: lets tests (and repair tools) make files that pass the checksums
// but not the structural checks of verify().
inline void rewrite_checksums(uint8_t* img, uint64_t size, const std::string& name) {
    Header h = decode_header(img, size, name);
    const Layout L = layout_of(h.ngram_size, h.bucket_bits, h.n_keys, h.n_stored);
    h.ck_index = checksum(img + L.index_off, L.index_span());
    h.ck_records = checksum(img + L.records_off, L.records_span());
    h.ck_entries = checksum(img + L.entries_off, L.entries_span());
    encode_header(h, img);
}

}  // namespace ngst
}  // namespace ngramcache
