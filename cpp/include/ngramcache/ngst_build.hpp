// Building NGST images by sorting, never by inserting into hash maps: from tokens (a
// grouped counting sort of packed n-gram ids), from an NgramCache and from a llama.cpp
// lookup.bin. Every builder ends in image_from_sorted_keys, which lays out keys given in
// key order, so equal contents give byte-identical files whatever the source.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cache.hpp"
#include "build_support.hpp"
#include "draft.hpp"
#include "file_io.hpp"
#include "lookup_file.hpp"
#include "ngram.hpp"
#include "ngst_format.hpp"

// Build phases call this hook with a name; profiling harnesses define it.
#ifndef NGST_PHASE
#define NGST_PHASE(name) ((void)0)
#endif

namespace ngramcache {
namespace ngst {

// Owned bytes of an image: a read-only file mapping or an anonymous mapping.
using Bytes = SharedBytes;

// A whole table image and its size; StaticTable adopts one after checking its header.
struct Image {
    Bytes bytes;
    uint64_t size = 0;
};

// Lays out K keys given in key order (hash_hi[k]: top 32 bits of the key's hash,
// ntok[k]: its continuations): records grouped by bucket, stably, so a bucket's keys
// stay in key order and equal contents give equal files. Then calls
// fill(k, record, stored_entries) for k = 0..K-1 in order; fill writes the record's
// key, best token and sum, and its entries when it has two or more.
template <class Fill>
inline Image image_from_sorted_keys(int n, Source src, std::vector<uint32_t> hash_hi,
                                   const std::vector<uint32_t>& ntok, uint64_t total, Fill fill) {
    const uint64_t K = hash_hi.size();
    if (K > kMaxU32) throw InputError("too many keys for a static table (" + std::to_string(K) + ")");
    Header h;
    h.ngram_size = n;
    h.source = src;
    h.n_keys = K;
    h.bucket_bits = bucket_bits_for(K);
    h.total = total;
    for (uint32_t c : ntok) {
        h.n_entries += c;
        h.n_stored += c >= 2 ? c : 0;
    }
    if (h.n_stored > kMaxU32)
        throw InputError("too many (key, token) entries for a static table (" + std::to_string(h.n_entries) + ")");
    const Layout L = layout_of(n, h.bucket_bits, K, h.n_stored);
    std::shared_ptr<uint8_t> img = alloc_image(L.file_size);
    uint8_t* base = img.get();
    uint8_t* buckets = base + L.index_off;
    uint8_t* records = base + L.records_off;
    uint8_t* entries = base + L.entries_off;
    NGST_PHASE("image");

    // Counting sort by bucket (stable: the source is in key order). hash_hi becomes
    // each key's slot; the record's begin field first holds its stored entry count.
    std::vector<uint32_t> start(L.n_buckets + 1, 0);
    for (uint64_t k = 0; k < K; ++k) ++start[bucket_of32(hash_hi[k], h.bucket_bits) + 1];
    for (uint64_t b = 0; b < L.n_buckets; ++b) start[b + 1] += start[b];
    for (uint64_t b = 0; b <= L.n_buckets; ++b) put32(buckets + 4 * b, start[b]);
    // These loops touch random places of big arrays: fetch the lines ahead of time.
    constexpr uint64_t kAhead = 16;
    std::vector<uint32_t>& slot = hash_hi;
    for (uint64_t k = 0; k < K; ++k) {
        if (k + kAhead < K) __builtin_prefetch(&start[bucket_of32(hash_hi[k + kAhead], h.bucket_bits)], 1);
        slot[k] = start[bucket_of32(hash_hi[k], h.bucket_bits)]++;
    }
    std::vector<uint32_t>().swap(start);
    for (uint64_t k = 0; k < K; ++k) {
        if (k + kAhead < K) __builtin_prefetch(records + uint64_t(slot[k + kAhead]) * L.stride, 1);
        put32(records + uint64_t(slot[k]) * L.stride + kRecBegin, ntok[k] >= 2 ? ntok[k] : 0);
    }
    uint32_t run = 0;
    for (uint64_t s = 0; s < K; ++s) {
        uint8_t* rec = records + s * L.stride;
        const uint32_t c = load32(rec + kRecBegin);
        put32(rec + kRecBegin, run);
        run += c;
    }
    NGST_PHASE("slots");
    for (uint64_t k = 0; k < K; ++k) {
        if (k + kAhead < K) __builtin_prefetch(records + uint64_t(slot[k + kAhead]) * L.stride, 1);
        if (k + kAhead / 2 < K)
            __builtin_prefetch(
                entries + kEntrySize *
                              load32(records + uint64_t(slot[k + kAhead / 2]) * L.stride + kRecBegin),
                1);
        uint8_t* rec = records + uint64_t(slot[k]) * L.stride;
        fill(k, rec, entries + kEntrySize * load32(rec + kRecBegin));
    }
    NGST_PHASE("fill");
    h.ck_index = checksum(base + L.index_off, L.index_span());
    h.ck_records = checksum(base + L.records_off, L.records_span());
    h.ck_entries = checksum(base + L.entries_off, L.entries_span());
    encode_header(h, base);
    NGST_PHASE("checksums");
    return Image{img, L.file_size};
}

namespace detail {

// build_image() for dense ids below 2^w, where n ids of w bits fit E.
//
// 1. A counting sort by the first token scatters every observation, its other key
//    ids and its next id packed into one E, into its first token's group. Stable, so
//    a group keeps corpus order. One pass over the tokens and one write of 8 bytes
//    per observation: the only pass over memory-sized data that moves observations.
// 2. Each group is sorted by the rest of its key while it is in cache (groups average
//    N / vocabulary observations), then reduced: every key run becomes its entries
//    (next id, count; the best one flagged), written back over observations already
//    read, so the array ends up holding the table's entries in key order.
// 3. image_from_sorted_keys lays the keys out and copies each key's entries to its slot.
template <class E, int n>
inline Image build_packed(const uint32_t* ids, size_t N, int w, const token_t* id_tok, uint64_t n_ids) {
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
    BigArray<E> obs(M);
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
    DistinctSorter sorter(n_ids);
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
                cnt[first] = static_cast<uint32_t>(std::min<size_t>(e - r, kMaxU32));
                seen.push_back(first);
                for (; e < m && (g[e] >> w) == kb; ++e) {
                    const uint32_t t = static_cast<uint32_t>(g[e] & mask);
                    if (cnt[t]++ == 0) seen.push_back(t);
                }
            }
            if (e - r > kMaxU32)  // the record's u32 sum (counts are then int32 too)
                throw InputError("a key occurs " + std::to_string(e - r) +
                                 " times, beyond the 2^32-1 an NGST record holds");
            E kk = kb;
            for (int j = n - 1; j >= 1; --j, kk >>= w) key[j] = tok_of(static_cast<uint64_t>(kk & mask));
            keys.insert(keys.end(), key, key + n);
            hash_hi.push_back(static_cast<uint32_t>(key_hash(key, n) >> 32));
            if (single) {
                if (e - r > size_t(INT32_MAX))
                    throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
                ntok.push_back(1);
                *out++ = E(uint64_t(first) << 32 | (e - r) | kBest);
                r = e;
                continue;
            }
            ntok.push_back(static_cast<uint32_t>(seen.size()));
            uint32_t best_cnt = 0, n_at_best = 0;
            for (uint32_t t : seen) {
                if (cnt[t] > uint32_t(INT32_MAX))
                    throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
                if (cnt[t] > best_cnt) {
                    best_cnt = cnt[t];
                    n_at_best = 1;
                } else if (cnt[t] == best_cnt) {
                    ++n_at_best;
                }
            }
            // A tie goes to the token llama.cpp visits first in the lookup.bin that
            // llama-lookup-create writes from the same corpus, once loaded.
            const uint32_t best = seen[n_at_best == 1
                ? std::find_if(seen.begin(), seen.end(), [&](uint32_t t) { return cnt[t] == best_cnt; }) - seen.begin()
                : libstdcxx::first_after_reload(
                      seen.size(), [&](size_t i) { return tok_of(seen[i]); },
                      [&](size_t i) { return cnt[seen[i]] == best_cnt; })];
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
    return image_from_sorted_keys(n, Source::tokens, std::move(hash_hi), ntok, M, fill);
}

// The n-gram size as a compile-time constant, so the per-observation loops unroll.
template <class E>
inline Image build_n(const uint32_t* ids, size_t N, int n, int w, const token_t* id_tok, uint64_t n_ids) {
    switch (n) {
        case 1: return build_packed<E, 1>(ids, N, w, id_tok, n_ids);
        case 2: return build_packed<E, 2>(ids, N, w, id_tok, n_ids);
        case 3: return build_packed<E, 3>(ids, N, w, id_tok, n_ids);
        default: return build_packed<E, 4>(ids, N, w, id_tok, n_ids);
    }
}

}  // namespace detail

// Counts every (n-gram -> next token) observation of `tokens`, as
// NgramCache::update(tokens, n, n) does. A key's best token has the highest count;
// among equal counts, the one whose first occurrence after this key comes latest in
// the corpus (the core's tie rule).
inline Image build_image(const token_t* tokens, size_t n_tokens, int n) {
    check_ngram_size(n);
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
        return image_from_sorted_keys(n, Source::tokens, {}, {}, 0, [](size_t, uint8_t*, uint8_t*) {});
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
    if (n * w <= 64) return detail::build_n<uint64_t>(ids, n_tokens, n, w, map, n_ids);
    __extension__ typedef unsigned __int128 u128;
    return detail::build_n<u128>(ids, n_tokens, n, w, map, n_ids);
}

// The keys of size n of `cache`. A key's best token is the one drafting with the cache as
// the static cache picks (best_by_count: llama.cpp's order for the cache's insertion
// sequence, which for a loaded lookup.bin is its file order).
inline Image image_from_cache(const NgramCache& cache, int n, Source src = Source::cache) {
    check_ngram_size(n);
    check_host();
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < cache.size(); ++i)
        if (cache.key_at(i).size() == n && cache.part_at(i).size() != 0) idx.push_back(static_cast<uint32_t>(i));
    std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return cache.key_at(a) < cache.key_at(b); });
    std::vector<uint32_t> hash_hi(idx.size()), ntok(idx.size());
    uint64_t total = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
        const Part& p = cache.part_at(idx[k]);
        if (static_cast<uint64_t>(p.sum()) > kMaxU32)
            throw InputError("a key's counts sum to " + std::to_string(p.sum()) +
                             ", beyond the 2^32-1 an NGST record holds");
        hash_hi[k] = static_cast<uint32_t>(key_hash(cache.key_at(idx[k]).t, n) >> 32);
        ntok[k] = p.size();
        total += static_cast<uint64_t>(p.sum());
    }
    std::vector<Entry> sorted;
    auto fill = [&](size_t k, uint8_t* rec, uint8_t* ent) {
        const Part& p = cache.part_at(idx[k]);
        write_key(rec, cache.key_at(idx[k]).t, n);
        write_best(rec, best_by_count(p), p.max_count(), static_cast<uint64_t>(p.sum()));
        if (p.size() < 2) return;
        sorted.assign(p.begin(), p.end());
        std::sort(sorted.begin(), sorted.end(), [](const Entry& x, const Entry& y) { return x.token < y.token; });
        for (size_t j = 0; j < sorted.size(); ++j) write_entry(ent, j, sorted[j].token, sorted[j].count);
    };
    return image_from_sorted_keys(n, src, std::move(hash_hi), ntok, total, fill);
}

// Imports a llama.cpp lookup.bin image exactly as NgramCache's loader reads it
// (duplicate keys and tokens keep the first; ties go as llama.cpp's loaded map has them).
// n = 0 infers the n-gram size, which must then be the same for every key.
inline Image image_from_lookup(const char* data, size_t size, const std::string& name, int n) {
    if (n != 0) check_ngram_size(n);  // before the parse, which may take long
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
    return image_from_cache(cache, n, Source::lookup);
}

}  // namespace ngst
}  // namespace ngramcache
