// Immutable static n-gram table: the "NGST" file (docs/format.md describes every byte).
//
// llama.cpp's static cache is a headerless stream of records that must be parsed into
// hash maps before use. An NGST file is laid out for use in place: a 64-byte header, a
// bucket index over the keys, fixed-size key records (with the precomputed best token,
// its count and the sum, so static-only drafting is one lookup) and the (token, count)
// entries of every key with two or more continuations, sorted by token. A key with a
// single continuation (most keys of real text) keeps it in its record only.
//
// Opening maps the file and checks the header in O(1); `verify()` checks every byte
// (O(size)) on request. Lookups trust nothing beyond what open checked: every offset
// read from a record is clamped, so a damaged file gives wrong answers at worst, never
// an out-of-bounds read, and every probe loop is bounded by the key count.
//
// Tables are built by sorting packed n-gram ids (counting sorts), never by inserting
// into hash maps.
#pragma once

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.hpp"
#include "draft.hpp"
#include "lookup_file.hpp"
#include "ngram.hpp"

// Build phases call this hook with a name; profiling harnesses define it.
#ifndef NGST_PHASE
#define NGST_PHASE(name) ((void)0)
#endif

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

// Owned bytes of an image: a read-only file mapping or an anonymous mapping.
using Bytes = std::shared_ptr<const uint8_t>;

// Zero-filled anonymous memory for the big build arrays: the kernel zeroes pages as they
// are first touched, so there is no separate memset pass over hundreds of MB.
inline uint8_t* map_zeroed(uint64_t size) {
    const uint64_t sz = size == 0 ? kAlign : size;
#if defined(MADV_HUGEPAGE)
    // Huge pages where the kernel allows them: every page gets written, and 2 MiB pages
    // take 1/512 of the faults (the zeroing dominates what is left).
    void* p = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (sz >= (uint64_t(4) << 20)) ::madvise(p, sz, MADV_HUGEPAGE);
#else
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;  // every page gets written: faulting them in one go is cheaper
#endif
    void* p = ::mmap(nullptr, sz, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#endif
    return static_cast<uint8_t*>(p);
}

inline std::shared_ptr<uint8_t> alloc_image(uint64_t size) {
    const uint64_t sz = size == 0 ? kAlign : size;
    uint8_t* p = map_zeroed(sz);
    return std::shared_ptr<uint8_t>(p, [sz](uint8_t* q) { ::munmap(q, sz); });
}

// A fixed-size array of trivially copyable T in map_zeroed memory.
template <class T>
class BigArray {
public:
    explicit BigArray(size_t n) : n_(n), p_(reinterpret_cast<T*>(map_zeroed(bytes()))) {}
    BigArray(const BigArray&) = delete;
    BigArray& operator=(const BigArray&) = delete;
    ~BigArray() { ::munmap(p_, bytes()); }
    T* data() { return p_; }
    size_t size() const { return n_; }
    T& operator[](size_t i) { return p_[i]; }
    const T& operator[](size_t i) const { return p_[i]; }
    // Gives the whole pages of elements [from, to) back to the kernel: their memory is
    // freed, and they read as zeros if touched again.
    void discard(size_t from, size_t to) {
        const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
        const uint64_t lo = (uint64_t(from) * sizeof(T) + page - 1) / page * page;
        const uint64_t hi = to == n_ ? bytes() : uint64_t(to) * sizeof(T) / page * page;
        if (lo < hi) ::madvise(reinterpret_cast<uint8_t*>(p_) + lo, hi - lo, MADV_DONTNEED);
    }

private:
    uint64_t bytes() const { return n_ == 0 ? kAlign : uint64_t(n_) * sizeof(T); }
    size_t n_;
    T* p_;
};

// Sorts lists of distinct ids below a bound in O(length + id span / 4096): a two-level
// bitmap (one bit per id, one summary bit per 64-id word) that is set, then read back in
// order and cleared. Short lists use an insertion sort instead.
class DistinctSorter {
public:
    explicit DistinctSorter(uint64_t n_ids) : bits_((n_ids + 63) / 64, 0), top_((bits_.size() + 63) / 64, 0) {}
    void sort(std::vector<uint32_t>& v) {
        const size_t n = v.size();
        if (n <= 24) {
            for (size_t i = 1; i < n; ++i) {
                const uint32_t x = v[i];
                size_t j = i;
                for (; j > 0 && v[j - 1] > x; --j) v[j] = v[j - 1];
                v[j] = x;
            }
            return;
        }
        uint32_t lo = UINT32_MAX;
        for (uint32_t x : v) {
            bits_[x >> 6] |= uint64_t(1) << (x & 63);
            top_[x >> 12] |= uint64_t(1) << ((x >> 6) & 63);
            lo = std::min(lo, x);
        }
        size_t k = 0;
        for (size_t t = lo >> 12; k < n; ++t) {
            for (uint64_t tw = top_[t]; tw != 0; tw &= tw - 1) {
                const size_t wi = t * 64 + static_cast<size_t>(__builtin_ctzll(tw));
                for (uint64_t bw = bits_[wi]; bw != 0; bw &= bw - 1)
                    v[k++] = static_cast<uint32_t>(wi * 64 + static_cast<size_t>(__builtin_ctzll(bw)));
                bits_[wi] = 0;
            }
            top_[t] = 0;
        }
    }

private:
    std::vector<uint64_t> bits_, top_;
};

}  // namespace ngst

class StaticTable {
public:
    using Ref = const uint8_t*;  // a key record, nullptr when the key is absent

    // ---- construction -------------------------------------------------------------

    // Counts every (n-gram -> next token) observation of `tokens`, as
    // NgramCache::update(tokens, n, n) does. A key's best token has the highest count;
    // among equal counts, the one whose first occurrence after this key comes latest in
    // the corpus (the core's tie rule).
    static StaticTable build(const token_t* tokens, size_t n_tokens, int n) {
        check_n(n);
        check_host();
        // Branch-free min/max (vectorised); the first negative id is searched only on error.
        token_t min_tok = 0, max_tok = 0;
        for (size_t i = 0; i < n_tokens; ++i) {
            min_tok = std::min(min_tok, tokens[i]);
            max_tok = std::max(max_tok, tokens[i]);
        }
        if (min_tok < 0) {
            const token_t* neg = std::find_if(tokens, tokens + n_tokens, [](token_t t) { return t < 0; });
            const size_t i = static_cast<size_t>(neg - tokens);
            throw InputError("tokens: negative token id " + std::to_string(tokens[i]) + " at index " +
                             std::to_string(i));
        }
        if (n_tokens <= static_cast<size_t>(n))
            return from_sorted_keys(n, ngst::Source::tokens, {}, {}, 0, [](size_t, uint8_t*, uint8_t*) {});
        // Observations are packed into one integer each; sparse huge ids are first
        // renumbered densely (order-preserving, so sorting ids still sorts tokens).
        std::vector<uint32_t> ids_store;
        std::vector<token_t> id_tok;
        const uint32_t* ids = reinterpret_cast<const uint32_t*>(tokens);
        uint64_t n_ids = uint64_t(max_tok) + 1;
        if (max_tok >= (1 << 21) && n_ids > 2 * uint64_t(n_tokens)) {
            id_tok.assign(tokens, tokens + n_tokens);
            std::sort(id_tok.begin(), id_tok.end());
            id_tok.erase(std::unique(id_tok.begin(), id_tok.end()), id_tok.end());
            ids_store.resize(n_tokens);
            for (size_t i = 0; i < n_tokens; ++i)
                ids_store[i] = static_cast<uint32_t>(std::lower_bound(id_tok.begin(), id_tok.end(), tokens[i]) -
                                                     id_tok.begin());
            ids = ids_store.data();
            n_ids = id_tok.size();
        }
        int w = 1;
        while ((uint64_t(1) << w) < n_ids) ++w;
        const token_t* map = id_tok.empty() ? nullptr : id_tok.data();
        if (n * w <= 64) return build_n<uint64_t>(ids, n_tokens, n, w, map, n_ids);
        __extension__ typedef unsigned __int128 u128;
        return build_n<u128>(ids, n_tokens, n, w, map, n_ids);
    }

    // The keys of size n of `cache`. A key's continuations keep the cache's first-seen
    // order for the tie rule (the newest among the most frequent wins, as in drafting).
    static StaticTable from_cache(const NgramCache& cache, int n, ngst::Source src = ngst::Source::cache) {
        check_n(n);
        check_host();
        std::vector<uint32_t> idx;
        for (size_t i = 0; i < cache.size(); ++i)
            if (cache.key_at(i).size() == n && cache.part_at(i).size() != 0) idx.push_back(static_cast<uint32_t>(i));
        std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return cache.key_at(a) < cache.key_at(b); });
        std::vector<uint32_t> hash_hi(idx.size()), ntok(idx.size());
        uint64_t total = 0;
        for (size_t k = 0; k < idx.size(); ++k) {
            const Part& p = cache.part_at(idx[k]);
            if (static_cast<uint64_t>(p.sum()) > ngst::kMaxU32)
                throw InputError("a key's counts sum to " + std::to_string(p.sum()) +
                                 ", beyond the 2^32-1 an NGST record holds");
            hash_hi[k] = static_cast<uint32_t>(ngst::key_hash(cache.key_at(idx[k]).t, n) >> 32);
            ntok[k] = p.size();
            total += static_cast<uint64_t>(p.sum());
        }
        std::vector<Entry> sorted;
        auto fill = [&](size_t k, uint8_t* rec, uint8_t* ent) {
            const Part& p = cache.part_at(idx[k]);
            write_key(rec, cache.key_at(idx[k]).t, n);
            write_best(rec, newest_with_max(p), p.max_count(), static_cast<uint64_t>(p.sum()));
            if (p.size() < 2) return;
            sorted.assign(p.begin(), p.end());
            std::sort(sorted.begin(), sorted.end(), [](const Entry& x, const Entry& y) { return x.token < y.token; });
            for (size_t j = 0; j < sorted.size(); ++j) write_entry(ent, j, sorted[j].token, sorted[j].count);
        };
        return from_sorted_keys(n, src, std::move(hash_hi), ntok, total, fill);
    }

    // Imports a llama.cpp lookup.bin image exactly as NgramCache's loader reads it
    // (duplicate keys and tokens keep the first; the later token of a record wins ties).
    // n = 0 infers the n-gram size, which must then be the same for every key.
    static StaticTable from_lookup(const char* data, size_t size, const std::string& name, int n) {
        NgramCache cache;
        load_lookup(cache, data, size, name);
        if (n == 0) {
            unsigned sizes = 0;
            for (size_t i = 0; i < cache.size(); ++i) sizes |= 1u << cache.key_at(i).size();
            if (sizes == 0) {
                n = kNgramStatic;
            } else if ((sizes & (sizes - 1)) != 0) {
                std::string list;
                for (int s = 1; s <= kNgramMax; ++s)
                    if (sizes & (1u << s)) list += (list.empty() ? "" : ", ") + std::to_string(s);
                throw InputError(name + ": holds n-grams of sizes " + list +
                                 "; a static table holds one size: pass ngram_size to keep one of them");
            } else {
                while (!(sizes & (1u << n))) ++n;
            }
        }
        return from_cache(cache, n, ngst::Source::lookup);
    }

    static StaticTable from_lookup_file(const std::string& path, int n) {
        Mapping m = Mapping::open(path);
        return from_lookup(reinterpret_cast<const char*>(m.data), m.size, path, n);
    }

    // Maps `path` read-only and checks its header and section bounds: O(1).
    static StaticTable open(const std::string& path) {
        check_host();
        Mapping m = Mapping::open(path);
        if (m.size == 0) throw FormatError(path + ": not a valid static table (NGST): empty file");
        StaticTable t;
        t.attach(m.release(), path, true);
        return t;
    }

    // A copy of an in-memory image (e.g. Python bytes), checked like open().
    static StaticTable from_image(const void* data, size_t size, const std::string& name) {
        check_host();
        ngst::decode_header(static_cast<const uint8_t*>(data), size, name);  // before allocating
        std::shared_ptr<uint8_t> img = ngst::alloc_image(size);
        std::memcpy(img.get(), data, size);
        StaticTable t;
        t.attach({img, size}, name, false);
        return t;
    }

    // ---- properties -----------------------------------------------------------------

    int ngram_size() const { return h_.ngram_size; }
    uint64_t n_keys() const { return h_.n_keys; }
    uint64_t n_entries() const { return h_.n_entries; }
    uint64_t total() const { return h_.total; }
    uint64_t nbytes() const { return size_; }
    bool mapped() const { return mapped_; }
    const std::string& name() const { return name_; }
    const uint8_t* data() const { return base_.get(); }
    const ngst::Header& header() const { return h_; }
    const ngst::Layout& layout() const { return L_; }
    Ref record(uint64_t i) const { return records_ + i * L_.stride; }

    // ---- lookups (never read outside the image, whatever the file holds) -----------

    Ref find(const token_t* key) const {
        const int n = h_.ngram_size;
        const uint64_t b = ngst::bucket_of(ngst::key_hash(key, n), h_.bucket_bits);
        const uint32_t lo = ngst::load32(buckets_ + 4 * b), hi = ngst::load32(buckets_ + 4 * b + 4);
        if (hi > h_.n_keys || lo > hi) return nullptr;
        for (uint64_t i = lo; i < hi; ++i) {
            const uint8_t* rec = records_ + i * L_.stride;
            int j = 0;
            while (j < n && ngst::loadi32(rec + ngst::kRecKey + 4 * j) == key[j]) ++j;
            if (j == n) return rec;
        }
        return nullptr;
    }

    // The Static interface of draft.hpp, for 2-gram tables (the caller checks the size):
    // find() with the key compared as one 64-bit word.
    Ref find2(token_t a, token_t b) const {
        const token_t key[2] = {a, b};
        const uint64_t b64 = ngst::bucket_of(ngst::key_hash(key, 2), h_.bucket_bits);
        const uint32_t lo = ngst::load32(buckets_ + 4 * b64), hi = ngst::load32(buckets_ + 4 * b64 + 4);
        if (hi > h_.n_keys || lo > hi) return nullptr;
        const uint64_t want = uint64_t(uint32_t(a)) | uint64_t(uint32_t(b)) << 32;
        for (uint64_t i = lo; i < hi; ++i) {
            const uint8_t* rec = records_ + i * L_.stride;
            if (ngst::load64(rec + ngst::kRecKey) == want) return rec;
        }
        return nullptr;
    }

    // The stored entries of a record, clamped to the entries section. Empty means the
    // key has a single continuation: its best token.
    std::pair<const uint8_t*, uint64_t> stored(Ref r) const {
        const uint64_t b = ngst::load32(r + ngst::kRecBegin);
        const uint64_t e = r + L_.stride < records_end_ ? ngst::load32(r + L_.stride + ngst::kRecBegin) : h_.n_stored;
        if (b >= e || e > h_.n_stored) return {entries_, 0};
        return {entries_ + ngst::kEntrySize * b, e - b};
    }

    int64_t count(Ref r, token_t tok) const {
        auto [p, len] = stored(r);
        if (len == 0) return tok == best_token(r) ? best_count(r) : 0;
        uint64_t lo = 0, hi = len;  // binary search: tokens ascending
        while (lo < hi) {
            const uint64_t mid = lo + (hi - lo) / 2;
            const token_t t = ngst::loadi32(p + ngst::kEntrySize * mid);
            if (t == tok) return ngst::loadi32(p + ngst::kEntrySize * mid + 4);
            if (t < tok) lo = mid + 1;
            else hi = mid;
        }
        return 0;
    }

    // llama.cpp's try_static on the precomputed best token, count and sum.
    bool best(Ref r, token_t& tok) const {
        if (r == nullptr || !static_thresholds_pass(best_count(r), sum(r))) return false;
        tok = best_token(r);
        return true;
    }

    token_t best_token(Ref r) const { return ngst::loadi32(r + ngst::kRecBestTok); }
    int64_t best_count(Ref r) const { return ngst::load32(r + ngst::kRecBestCnt); }
    int64_t sum(Ref r) const { return ngst::load32(r + ngst::kRecSum); }
    const uint8_t* key_ptr(Ref r) const { return r + ngst::kRecKey; }

    // Calls f(token, count) for every continuation of a record, tokens ascending.
    template <class F>
    void for_each_entry(Ref r, F f) const {
        auto [p, len] = stored(r);
        if (len == 0) f(best_token(r), best_count(r));
        for (uint64_t j = 0; j < len; ++j) f(ngst::loadi32(p + 8 * j), ngst::loadi32(p + 8 * j + 4));
    }

    // ---- whole-file checks and exports ---------------------------------------------

    // Checks every section's checksum, then that the contents are a table this code
    // could have written (index consistent with the keys, entries sorted, best tokens
    // and sums right, padding zero). O(size). Throws FormatError with the first problem.
    void verify() const {
        const uint8_t* base = base_.get();
        auto fail = [&](const std::string& why) -> void {
            throw FormatError(name_ + ": static table failed verification: " + why);
        };
        struct Sec {
            const char* name;
            uint64_t off, span, expect;
        } secs[3] = {{"index", L_.index_off, L_.index_span(), h_.ck_index},
                     {"records", L_.records_off, L_.records_span(), h_.ck_records},
                     {"entries", L_.entries_off, L_.entries_span(), h_.ck_entries}};
        for (const Sec& s : secs)
            if (ngst::checksum(base + s.off, s.span) != s.expect)
                fail("checksum mismatch in the " + std::string(s.name) + " section (bytes " + std::to_string(s.off) +
                     ".." + std::to_string(s.off + s.span) + ")");
        auto zero = [&](uint64_t from, uint64_t to, const char* what) {
            for (uint64_t i = from; i < to; ++i)
                if (base[i] != 0) fail(std::string("non-zero padding after the ") + what + " section");
        };
        zero(L_.index_off + L_.index_size, L_.records_off, "index");
        zero(L_.records_off + L_.records_size, L_.entries_off, "records");
        zero(L_.entries_off + L_.entries_size, L_.file_size, "entries");

        const int n = h_.ngram_size;
        const uint64_t nk = h_.n_keys;
        if (ngst::load32(buckets_) != 0 || ngst::load32(buckets_ + 4 * L_.n_buckets) != nk)
            fail("the bucket index does not span the records");
        uint64_t next = 0, total = 0, pairs = 0;
        for (uint64_t b = 0; b < L_.n_buckets; ++b) {
            const uint32_t lo = ngst::load32(buckets_ + 4 * b), hi = ngst::load32(buckets_ + 4 * b + 4);
            if (lo > hi || hi > nk) fail("bucket " + std::to_string(b) + " out of order");
            for (uint64_t i = lo; i < hi; ++i) {
                const uint8_t* rec = record(i);
                const std::string at = "record " + std::to_string(i) + ": ";
                token_t key[kNgramMax];
                std::memcpy(key, rec + ngst::kRecKey, 4 * size_t(n));
                for (int j = 0; j < n; ++j)
                    if (key[j] < 0) fail(at + "negative token in the key");
                if (ngst::bucket_of(ngst::key_hash(key, n), h_.bucket_bits) != b)
                    fail(at + "key stored in the wrong bucket");
                if (i > lo && !key_less(record(i - 1) + ngst::kRecKey, rec + ngst::kRecKey, n))
                    fail(at + "keys of a bucket not strictly increasing");
                for (size_t j = ngst::kRecKey + 4 * size_t(n); j < L_.stride; ++j)
                    if (rec[j] != 0) fail(at + "non-zero padding");
                if (ngst::load32(rec + ngst::kRecBegin) != next) fail(at + "entry offset out of sequence");
                auto [p, len] = stored(rec);
                if (len == 1) fail(at + "a single stored entry (it belongs in the record)");
                next += len;
                uint64_t sum = 0, n_best = 0;
                int64_t best = 0;
                token_t prev = kTokenNull;
                bool ok = true;
                for_each_entry(rec, [&](token_t t, int64_t c) {
                    ok &= t >= 0 && t > prev && c > 0 && c <= INT32_MAX;
                    prev = t;
                    sum += static_cast<uint64_t>(c);
                    best = std::max(best, c);
                    n_best += t == best_token(rec);
                });
                if (!ok) fail(at + "entries not sorted, or a negative token or count");
                if (static_cast<int64_t>(sum) != this->sum(rec)) fail(at + "stored sum differs from the entries");
                if (best != best_count(rec) || n_best != 1 || count(rec, best_token(rec)) != best)
                    fail(at + "stored best token is not a most frequent entry");
                total += sum;
                pairs += len == 0 ? 1 : len;
            }
        }
        if (next != h_.n_stored) fail("the records do not cover the stored entries");
        if (pairs != h_.n_entries) fail("the header's entry count differs from the records");
        if (total != h_.total) fail("the header's total differs from the sum of all counts");
    }

    // llama.cpp lookup.bin image: records in table order, pairs sorted by token except
    // that the best token goes last, so llama.cpp and NgramCache::load pick the same
    // best token on a tie (the later token of a record wins there).
    std::vector<char> to_lookup() const {
        std::vector<char> out;
        out.reserve(20 * h_.n_keys + 8 * h_.n_entries);
        const int n = h_.ngram_size;
        for (uint64_t i = 0; i < h_.n_keys; ++i) {
            const uint8_t* rec = record(i);
            for (int j = 0; j < kNgramMax; ++j)
                store_i32(out, j < n ? ngst::loadi32(rec + ngst::kRecKey + 4 * j) : kTokenNull);
            auto [p, len] = stored(rec);
            store_i32(out, static_cast<int32_t>(len == 0 ? 1 : len));
            const token_t bt = best_token(rec);
            for_each_entry(rec, [&](token_t t, int64_t c) {
                if (t == bt) return;
                store_i32(out, t);
                store_i32(out, static_cast<int32_t>(c));
            });
            store_i32(out, bt);
            store_i32(out, static_cast<int32_t>(count(rec, bt)));
        }
        return out;
    }

    void save(const std::string& path) const { write_file_atomic(path, base_.get(), size_); }

    static void check_n(int n) {
        if (n < 1 || n > kNgramMax) throw InputError("ngram_size must be 1 to 4, got " + std::to_string(n));
    }

private:
    StaticTable() = default;  // unattached: only the factories above hand out tables

    static void check_host() {
        if (!host_is_little_endian()) throw InputError("NGST tables need a little-endian host");
    }

    struct Image {
        ngst::Bytes bytes;
        uint64_t size;
    };

    // A read-only mapping of a whole file (for open and for importing lookup.bin).
    struct Mapping {
        const uint8_t* data = nullptr;
        uint64_t size = 0;
        Mapping() = default;
        Mapping(const Mapping&) = delete;
        Mapping& operator=(const Mapping&) = delete;
        Mapping(Mapping&& o) noexcept : data(o.data), size(o.size) {
            o.data = nullptr;
            o.size = 0;
        }
        ~Mapping() {
            if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
        }
        static Mapping open(const std::string& path) {
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
            Mapping m;
            m.size = static_cast<uint64_t>(st.st_size);
            if (m.size > 0) {
                void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
                if (p == MAP_FAILED) {
                    const int e = errno;
                    ::close(fd);
                    throw std::system_error(e, std::generic_category(), "mapping " + path);
                }
                m.data = static_cast<const uint8_t*>(p);
            }
            ::close(fd);  // the mapping stays valid without the descriptor
            return m;
        }
        Image release() {
            const uint64_t sz = size;
            Image img{ngst::Bytes(data, [sz](const uint8_t* q) { ::munmap(const_cast<uint8_t*>(q), sz); }), sz};
            data = nullptr;
            size = 0;
            return img;
        }
    };

    void attach(Image img, const std::string& name, bool mapped) {
        const uint8_t* p = img.bytes.get();
        h_ = ngst::decode_header(p, img.size, name);
        L_ = ngst::layout_of(h_.ngram_size, h_.bucket_bits, h_.n_keys, h_.n_stored);
        base_ = std::move(img.bytes);
        size_ = img.size;
        name_ = name;
        mapped_ = mapped;
        buckets_ = p + L_.index_off;
        records_ = p + L_.records_off;
        records_end_ = records_ + L_.records_size;
        entries_ = p + L_.entries_off;
    }

    static bool key_less(const uint8_t* a, const uint8_t* b, int n) {
        for (int j = 0; j < n; ++j) {
            const token_t x = ngst::loadi32(a + 4 * j), y = ngst::loadi32(b + 4 * j);
            if (x != y) return x < y;
        }
        return false;
    }

    static void write_key(uint8_t* rec, const token_t* key, int n) {
        for (int j = 0; j < n; ++j) ngst::puti32(rec + ngst::kRecKey + 4 * j, key[j]);
    }
    static void write_best(uint8_t* rec, token_t tok, int64_t cnt, uint64_t sum) {
        ngst::puti32(rec + ngst::kRecBestTok, tok);
        ngst::put32(rec + ngst::kRecBestCnt, static_cast<uint32_t>(cnt));
        ngst::put32(rec + ngst::kRecSum, static_cast<uint32_t>(sum));
    }
    static void write_entry(uint8_t* ent, size_t j, token_t tok, int64_t cnt) {
        ngst::puti32(ent + ngst::kEntrySize * j, tok);
        ngst::puti32(ent + ngst::kEntrySize * j + 4, static_cast<int32_t>(cnt));
    }

    // Lays out K keys given in key order (hash_hi[k]: top 32 bits of the key's hash,
    // ntok[k]: its continuations): records grouped by bucket, stably, so a bucket's keys
    // stay in key order and equal contents give equal files. Then calls
    // fill(k, record, stored_entries) for k = 0..K-1 in order; fill writes the record's
    // key, best token and sum, and its entries when it has two or more.
    template <class Fill>
    static StaticTable from_sorted_keys(int n, ngst::Source src, std::vector<uint32_t> hash_hi,
                                        const std::vector<uint32_t>& ntok, uint64_t total, Fill fill) {
        const uint64_t K = hash_hi.size();
        if (K > ngst::kMaxU32) throw InputError("too many keys for a static table (" + std::to_string(K) + ")");
        ngst::Header h;
        h.ngram_size = n;
        h.source = src;
        h.n_keys = K;
        h.bucket_bits = ngst::bucket_bits_for(K);
        h.total = total;
        for (uint32_t c : ntok) {
            h.n_entries += c;
            h.n_stored += c >= 2 ? c : 0;
        }
        if (h.n_stored > ngst::kMaxU32)
            throw InputError("too many (key, token) entries for a static table (" + std::to_string(h.n_entries) + ")");
        const ngst::Layout L = ngst::layout_of(n, h.bucket_bits, K, h.n_stored);
        std::shared_ptr<uint8_t> img = ngst::alloc_image(L.file_size);
        uint8_t* base = img.get();
        uint8_t* buckets = base + L.index_off;
        uint8_t* records = base + L.records_off;
        uint8_t* entries = base + L.entries_off;
        NGST_PHASE("image");

        // Counting sort by bucket (stable: the source is in key order). hash_hi becomes
        // each key's slot; the record's begin field first holds its stored entry count.
        std::vector<uint32_t> start(L.n_buckets + 1, 0);
        for (uint64_t k = 0; k < K; ++k) ++start[ngst::bucket_of32(hash_hi[k], h.bucket_bits) + 1];
        for (uint64_t b = 0; b < L.n_buckets; ++b) start[b + 1] += start[b];
        for (uint64_t b = 0; b <= L.n_buckets; ++b) ngst::put32(buckets + 4 * b, start[b]);
        // These loops touch random places of big arrays: fetch the lines ahead of time.
        constexpr uint64_t kAhead = 16;
        std::vector<uint32_t>& slot = hash_hi;
        for (uint64_t k = 0; k < K; ++k) {
            if (k + kAhead < K) __builtin_prefetch(&start[ngst::bucket_of32(hash_hi[k + kAhead], h.bucket_bits)], 1);
            slot[k] = start[ngst::bucket_of32(hash_hi[k], h.bucket_bits)]++;
        }
        std::vector<uint32_t>().swap(start);
        for (uint64_t k = 0; k < K; ++k) {
            if (k + kAhead < K) __builtin_prefetch(records + uint64_t(slot[k + kAhead]) * L.stride, 1);
            ngst::put32(records + uint64_t(slot[k]) * L.stride + ngst::kRecBegin, ntok[k] >= 2 ? ntok[k] : 0);
        }
        uint32_t run = 0;
        for (uint64_t s = 0; s < K; ++s) {
            uint8_t* rec = records + s * L.stride;
            const uint32_t c = ngst::load32(rec + ngst::kRecBegin);
            ngst::put32(rec + ngst::kRecBegin, run);
            run += c;
        }
        NGST_PHASE("slots");
        for (uint64_t k = 0; k < K; ++k) {
            if (k + kAhead < K) __builtin_prefetch(records + uint64_t(slot[k + kAhead]) * L.stride, 1);
            if (k + kAhead / 2 < K)
                __builtin_prefetch(
                    entries + ngst::kEntrySize *
                                  ngst::load32(records + uint64_t(slot[k + kAhead / 2]) * L.stride + ngst::kRecBegin),
                    1);
            uint8_t* rec = records + uint64_t(slot[k]) * L.stride;
            fill(k, rec, entries + ngst::kEntrySize * ngst::load32(rec + ngst::kRecBegin));
        }
        NGST_PHASE("fill");
        h.ck_index = ngst::checksum(base + L.index_off, L.index_span());
        h.ck_records = ngst::checksum(base + L.records_off, L.records_span());
        h.ck_entries = ngst::checksum(base + L.entries_off, L.entries_span());
        ngst::encode_header(h, base);
        NGST_PHASE("checksums");
        StaticTable t;
        t.attach({img, L.file_size}, "<memory>", false);
        return t;
    }

    // The n-gram size as a compile-time constant, so the per-observation loops unroll.
    template <class E>
    static StaticTable build_n(const uint32_t* ids, size_t N, int n, int w, const token_t* id_tok, uint64_t n_ids) {
        switch (n) {
            case 1: return build_packed<E, 1>(ids, N, w, id_tok, n_ids);
            case 2: return build_packed<E, 2>(ids, N, w, id_tok, n_ids);
            case 3: return build_packed<E, 3>(ids, N, w, id_tok, n_ids);
            default: return build_packed<E, 4>(ids, N, w, id_tok, n_ids);
        }
    }

    // build() for dense ids below 2^w, where n ids of w bits fit E.
    //
    // 1. A counting sort by the first token scatters every observation, its other key
    //    ids and its next id packed into one E, into its first token's group. Stable, so
    //    a group keeps corpus order. One pass over the tokens and one write of 8 bytes
    //    per observation: the only pass over memory-sized data that moves observations.
    // 2. Each group is sorted by the rest of its key while it is in cache (groups average
    //    N / vocabulary observations), then reduced: every key run becomes its entries
    //    (next id, count; the best one flagged), written back over observations already
    //    read, so the array ends up holding the table's entries in key order.
    // 3. from_sorted_keys lays the keys out and copies each key's entries to its slot.
    template <class E, int n>
    static StaticTable build_packed(const uint32_t* ids, size_t N, int w, const token_t* id_tok, uint64_t n_ids) {
        NGST_PHASE("start");
        const size_t M = N - n;  // observations: positions n..N-1
        // end[a]: first the size of group a, then where it starts, and after the scatter
        // where it ends (so group a is [end[a-1], end[a]), with end[-1] = 0).
        std::vector<size_t> end(n_ids, 0);
        for (size_t i = 0; i < M; ++i) ++end[ids[i]];
        size_t biggest = 0, run = 0;
        for (uint64_t a = 0; a < n_ids; ++a) {
            const size_t c = end[a];
            biggest = std::max(biggest, c);
            end[a] = run;
            run += c;
        }
        NGST_PHASE("histogram");
        ngst::BigArray<E> obs(M);
        NGST_PHASE("alloc");
        for (size_t i = 0; i < M; ++i) {
            E v = 0;
            for (int j = 1; j <= n; ++j) v = (v << w) | E(ids[i + j]);
            obs[end[ids[i]]++] = v;
        }
        NGST_PHASE("scatter");

        const E mask = (E(1) << w) - 1;
        auto tok_of = [&](uint64_t id) { return id_tok ? id_tok[id] : static_cast<token_t>(id); };
        // cnt[id] counts inside one group or key run; `seen` lists the ids counted, in
        // first-occurrence order. Both are cleared after every use.
        std::vector<uint32_t> cnt(n_ids, 0);
        std::vector<uint32_t> seen;
        ngst::DistinctSorter sorter(n_ids);
        std::unique_ptr<E[]> tmp;  // a group's second buffer (sized for the biggest group)
        // Stable sort of group g[0..m) by the key ids after the first: insertion sort for
        // small groups, else one counting sort per key id, last id first (LSD). Returns
        // where the sorted group lies (g or tmp).
        auto sort_group = [&](E* g, size_t m) -> E* {
            if (n == 1) return g;
            if (m <= 32) {
                for (size_t i = 1; i < m; ++i) {
                    const E v = g[i];
                    size_t j = i;
                    for (; j > 0 && (g[j - 1] >> w) > (v >> w); --j) g[j] = g[j - 1];
                    g[j] = v;
                }
                return g;
            }
            E* src = g;
            for (int s = 1; s < n; ++s) {
                auto digit = [&](E v) { return static_cast<uint32_t>((v >> (s * w)) & mask); };
                for (size_t i = 0; i < m; ++i)
                    if (cnt[digit(src[i])]++ == 0) seen.push_back(digit(src[i]));
                if (seen.size() > 1) {
                    sorter.sort(seen);
                    uint32_t at = 0;
                    for (uint32_t d : seen) {
                        const uint32_t c = cnt[d];
                        cnt[d] = at;
                        at += c;
                    }
                    if (!tmp) tmp.reset(new E[biggest]);
                    E* dst = src == g ? tmp.get() : g;
                    for (size_t i = 0; i < m; ++i) dst[cnt[digit(src[i])]++] = src[i];
                    src = dst;
                }
                for (uint32_t d : seen) cnt[d] = 0;
                seen.clear();
            }
            return src;
        };

        // Per key, in key order: its tokens, the top 32 bits of its hash, its entry count.
        std::vector<token_t> keys;
        std::vector<uint32_t> hash_hi, ntok;
        constexpr uint64_t kBest = uint64_t(1) << 31;  // counts stay below 2^31
        E* out = obs.data();  // entries so far: never beyond the observations already read
        token_t key[n];
        size_t begin = 0, freed = 0;
        constexpr size_t kFreeChunk = (size_t(8) << 20) / sizeof(E);
        for (uint64_t a = 0; a < n_ids; ++a) {
            const size_t m = end[a] - begin;
            if (m == 0) continue;
            // The observations between the entries written and this group have been
            // read: give their memory back as it accumulates, so the entries and the
            // key arrays grow into memory the observations free.
            if (begin - freed >= kFreeChunk) {
                freed = begin;
                obs.discard(static_cast<size_t>(out - obs.data()) + kFreeChunk / 4, begin);
            }
            const E* g = sort_group(obs.data() + begin, m);
            begin = end[a];
            key[0] = tok_of(a);
            for (size_t r = 0; r < m;) {
                const E kb = g[r] >> w;
                // Most keys of real text have one next token: a run of equal observations
                // that ends the key's run needs no counters.
                size_t e = r + 1;
                while (e < m && g[e] == g[r]) ++e;
                const uint32_t first = static_cast<uint32_t>(g[r] & mask);
                const bool single = e == m || (g[e] >> w) != kb;
                if (!single) {
                    cnt[first] = static_cast<uint32_t>(std::min<size_t>(e - r, ngst::kMaxU32));
                    seen.push_back(first);
                    for (; e < m && (g[e] >> w) == kb; ++e) {
                        const uint32_t t = static_cast<uint32_t>(g[e] & mask);
                        if (cnt[t]++ == 0) seen.push_back(t);
                    }
                }
                if (e - r > ngst::kMaxU32)  // the record's u32 sum (counts are then int32 too)
                    throw InputError("a key occurs " + std::to_string(e - r) +
                                     " times, beyond the 2^32-1 an NGST record holds");
                E kk = kb;
                for (int j = n - 1; j >= 1; --j, kk >>= w) key[j] = tok_of(static_cast<uint64_t>(kk & mask));
                keys.insert(keys.end(), key, key + n);
                hash_hi.push_back(static_cast<uint32_t>(ngst::key_hash(key, n) >> 32));
                if (single) {
                    if (e - r > size_t(INT32_MAX))
                        throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
                    ntok.push_back(1);
                    *out++ = E(uint64_t(first) << 32 | (e - r) | kBest);
                    r = e;
                    continue;
                }
                ntok.push_back(static_cast<uint32_t>(seen.size()));
                uint32_t best = 0, best_cnt = 0;
                for (uint32_t t : seen) {  // '>=': the latest first occurrence wins a tie
                    if (cnt[t] > uint32_t(INT32_MAX))
                        throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
                    if (cnt[t] >= best_cnt) {
                        best = t;
                        best_cnt = cnt[t];
                    }
                }
                sorter.sort(seen);
                for (uint32_t t : seen) {
                    *out++ = E(uint64_t(t) << 32 | cnt[t] | (t == best ? kBest : 0));
                    cnt[t] = 0;
                }
                seen.clear();
                r = e;
            }
        }
        const size_t n_entries = static_cast<size_t>(out - obs.data());
        std::vector<size_t>().swap(end);
        std::vector<uint32_t>().swap(cnt);
        tmp.reset();
        obs.discard(n_entries, obs.size());  // before the image is allocated
        NGST_PHASE("groups");

        size_t cursor = 0;
        auto fill = [&](size_t k, uint8_t* rec, uint8_t* ent) {
            write_key(rec, &keys[k * n], n);
            const uint32_t c = ntok[k];
            token_t best = 0;
            uint32_t best_cnt = 0;
            uint64_t sum = 0;
            for (uint32_t j = 0; j < c; ++j) {
                const uint64_t x = static_cast<uint64_t>(obs[cursor + j]);
                const token_t t = tok_of(x >> 32);
                const uint32_t cn = static_cast<uint32_t>(x) & uint32_t(INT32_MAX);
                if (x & kBest) {
                    best = t;
                    best_cnt = cn;
                }
                sum += cn;
                if (c >= 2) write_entry(ent, j, t, cn);
            }
            cursor += c;
            write_best(rec, best, best_cnt, sum);
        };
        return from_sorted_keys(n, ngst::Source::tokens, std::move(hash_hi), ntok, M, fill);
    }

    ngst::Bytes base_;
    uint64_t size_ = 0;
    std::string name_;
    bool mapped_ = false;
    ngst::Header h_;
    ngst::Layout L_;
    const uint8_t* buckets_ = nullptr;
    const uint8_t* records_ = nullptr;
    const uint8_t* records_end_ = nullptr;
    const uint8_t* entries_ = nullptr;
};

}  // namespace ngramcache
