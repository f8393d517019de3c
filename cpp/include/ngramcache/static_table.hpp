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
// The format itself is in ngst_format.hpp, the builders (sorting, never hashing) in
// ngst_build.hpp; this class only reads an image, whoever made it.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cache.hpp"
#include "draft.hpp"
#include "file_io.hpp"
#include "lookup_file.hpp"
#include "ngram.hpp"
#include "ngst_build.hpp"
#include "ngst_format.hpp"

namespace ngramcache {

class StaticTable {
public:
    using Ref = const uint8_t*;  // a key record, nullptr when the key is absent

    // ---- construction -------------------------------------------------------------

    // Counts every (n-gram -> next token) observation of `tokens`, as
    // NgramCache::update(tokens, n, n) does. A key's best token has the highest count;
    // among equal counts, the one whose first occurrence after this key comes latest in
    // the corpus (the core's tie rule).
    static StaticTable build(const token_t* tokens, size_t n_tokens, int n) {
        return adopt(ngst::build_image(tokens, n_tokens, n), "<memory>");
    }

    // The keys of size n of `cache`. A key's continuations keep the cache's first-seen
    // order for the tie rule (the newest among the most frequent wins, as in drafting).
    static StaticTable from_cache(const NgramCache& cache, int n, ngst::Source src = ngst::Source::cache) {
        return adopt(ngst::image_from_cache(cache, n, src), "<memory>");
    }

    // Imports a llama.cpp lookup.bin image exactly as NgramCache's loader reads it
    // (duplicate keys and tokens keep the first; the later token of a record wins ties).
    // n = 0 infers the n-gram size, which must then be the same for every key.
    static StaticTable from_lookup(const char* data, size_t size, const std::string& name, int n) {
        return adopt(ngst::image_from_lookup(data, size, name, n), "<memory>");
    }

    static StaticTable from_lookup_file(const std::string& path, int n) {
        if (n != 0) check_n(n);
        const FileMapping m = FileMapping::open(path);
        return from_lookup(reinterpret_cast<const char*>(m.data()), m.size(), path, n);
    }

    // Maps `path` read-only and checks its header and section bounds: O(1).
    static StaticTable open(const std::string& path) {
        ngst::check_host();
        FileMapping m = FileMapping::open(path);
        if (m.size() == 0) throw FormatError(path + ": not a valid static table (NGST): empty file");
        const uint64_t size = m.size();
        return adopt({m.release(), size}, path, true);
    }

    // A copy of an in-memory image (e.g. Python bytes), checked like open().
    static StaticTable from_image(const void* data, size_t size, const std::string& name) {
        ngst::check_host();
        ngst::decode_header(static_cast<const uint8_t*>(data), size, name);  // before allocating
        std::shared_ptr<uint8_t> img = ngst::alloc_image(size);
        std::memcpy(img.get(), data, size);
        return adopt({img, size}, name);
    }

    // Takes over an image after checking its header and bounds (O(1), as open()).
    // `mapped` says that the bytes are a mapping of the file `name`.
    static StaticTable adopt(ngst::Image img, const std::string& name, bool mapped = false) {
        ngst::check_host();
        StaticTable t;
        const uint8_t* p = img.bytes.get();
        t.h_ = ngst::decode_header(p, img.size, name);
        t.L_ = ngst::layout_of(t.h_.ngram_size, t.h_.bucket_bits, t.h_.n_keys, t.h_.n_stored);
        t.base_ = std::move(img.bytes);
        t.size_ = img.size;
        t.name_ = name;
        t.mapped_ = mapped;
        t.buckets_ = p + t.L_.index_off;
        t.records_ = p + t.L_.records_off;
        t.records_end_ = t.records_ + t.L_.records_size;
        t.entries_ = p + t.L_.entries_off;
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

    // (key K x n, offsets K + 1, tokens, counts, best token, best count, sum per key) in
    // table order, into arrays the caller sized from n_keys() and n_entries(). A damaged
    // (unverified) table may hold more entries than its header says: they are left out.
    void export_arrays(int32_t* keys, int64_t* offsets, int32_t* toks, int32_t* cnts, int32_t* best_tok,
                       int64_t* best_cnt, int64_t* sums) const {
        const int n = h_.ngram_size;
        const uint64_t m = h_.n_entries;
        uint64_t j = 0;
        offsets[0] = 0;
        for (uint64_t i = 0; i < h_.n_keys; ++i) {
            const Ref r = record(i);
            std::memcpy(keys + i * n, key_ptr(r), 4 * size_t(n));
            for_each_entry(r, [&](token_t tok, int64_t c) {
                if (j < m) {
                    toks[j] = tok;
                    cnts[j] = static_cast<int32_t>(c);
                    ++j;
                }
            });
            offsets[i + 1] = static_cast<int64_t>(j);
            best_tok[i] = best_token(r);
            best_cnt[i] = best_count(r);
            sums[i] = sum(r);
        }
    }

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

    // find() for a key of `len` tokens from a caller, which must be the table's n-gram size.
    Ref find(const token_t* key, size_t len) const {
        if (len != static_cast<size_t>(h_.ngram_size))
            throw InputError("ngram: this table holds " + std::to_string(h_.ngram_size) + "-grams, got " +
                             std::to_string(len) + " token ids");
        return find(key);
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

    // Starts loading the bucket of the 2-gram (a, b), which find2 reads first.
    void prefetch2(token_t a, token_t b) const {
        const token_t key[2] = {a, b};
        prefetch_read(buckets_ + 4 * ngst::bucket_of(ngst::key_hash(key, 2), h_.bucket_bits));
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
                if (i > lo && !ngst::key_less(record(i - 1) + ngst::kRecKey, rec + ngst::kRecKey, n))
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

    // llama.cpp lookup.bin image: records in table order, pairs in an order that makes
    // llama.cpp's loader (and NgramCache::load) break a tie toward the stored best token.
    std::vector<char> to_lookup() const {
        std::vector<char> out;
        out.reserve(20 * h_.n_keys + 8 * h_.n_entries);
        const int n = h_.ngram_size;
        std::vector<Entry> es;
        for (uint64_t i = 0; i < h_.n_keys; ++i) {
            const uint8_t* rec = record(i);
            for (int j = 0; j < kNgramMax; ++j)
                store_i32(out, j < n ? ngst::loadi32(rec + ngst::kRecKey + 4 * j) : kTokenNull);
            es.clear();
            const token_t bt = best_token(rec);
            const int64_t bc = best_count(rec);
            size_t at_best = 0, first = 0;
            for_each_entry(rec, [&](token_t t, int64_t c) {
                if (t == bt) first = es.size();
                at_best += c == bc;
                es.push_back(Entry{t, static_cast<int32_t>(c)});
            });
            store_i32(out, static_cast<int32_t>(es.size()));
            if (at_best < 2) {  // no tie to steer: sorted by token
                for (const Entry& e : es) {
                    store_i32(out, e.token);
                    store_i32(out, e.count);
                }
                continue;
            }
            for (uint32_t j : libstdcxx::order_putting_first(
                     es.size(), first, [&](size_t x) { return es[x].token; },
                     [&](size_t x) { return es[x].count == bc; })) {
                store_i32(out, es[j].token);
                store_i32(out, es[j].count);
            }
        }
        return out;
    }

    // The NGST file (atomically replaced: a table mapped from `path` keeps its old mapping).
    void save(const std::string& path) const { write_file_atomic(path, base_.get(), size_); }

    // to_lookup() after verify(): an export must not spread damage (it is O(size) anyway).
    std::vector<char> to_lookup_verified() const {
        verify();
        return to_lookup();
    }

    // llama.cpp's lookup.bin (atomically), verified first.
    void save_lookup(const std::string& path) const {
        const std::vector<char> img = to_lookup_verified();
        write_file_atomic(path, img.data(), img.size());
    }

    // Replaces the contents of `out` with the table's counts, as NgramCache::load reads
    // the to_lookup() image: on a tie, drafting with the cache picks the table's best
    // token. Verifies first, as save_lookup.
    void to_cache(NgramCache& out) const {
        const std::vector<char> img = to_lookup_verified();
        NgramCache fresh;
        load_lookup(fresh, img.data(), img.size(), "static table");
        out.swap(fresh);
    }

    static void check_n(int n) { ngst::check_ngram_size(n); }

private:
    StaticTable() = default;  // unattached: only the factories above hand out tables

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
