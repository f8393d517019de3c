// Mutable n-gram cache (llama.cpp's context and dynamic caches).
//
// A flat open-addressing table maps a key to a part index; parts live in fixed-size
// segments, so growing the cache never moves or copies a part and drafting can hold
// plain references to them. A part keeps its (token, count) entries in first-seen
// order (the order the tie rule needs) plus their running sum and maximum, which lets
// the threshold tests of drafting decide most steps before looking at a candidate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <utility>
#include <stdexcept>
#include <vector>

#include "libstdcxx_order.hpp"
#include "ngram.hpp"

namespace ngramcache {

struct Entry {
    token_t token;
    int32_t count;
};

class Part {
public:
    Part() = default;
    Part(const Part&) = delete;
    Part& operator=(const Part&) = delete;
    ~Part() { release(); }

    uint32_t size() const { return size_; }
    const Entry* begin() const { return data(); }
    const Entry* end() const { return data() + size_; }
    const Entry& operator[](uint32_t i) const { return data()[i]; }
    int64_t sum() const { return sum_; }
    int32_t max_count() const { return max_; }

    // Count of `tok` in this part, 0 if absent.
    int32_t count_of(token_t tok) const {
        int64_t i = find(tok);
        return i < 0 ? 0 : data()[i].count;
    }

    // Adds `count` observations of `tok`; a new token goes to the end (first-seen order).
    void add(token_t tok, int32_t count) {
        int64_t i = find(tok);
        if (i >= 0) {
            Entry& e = data()[i];
            if (e.count > std::numeric_limits<int32_t>::max() - count)
                throw std::overflow_error("n-gram count exceeds the int32 range of lookup.bin");
            e.count += count;
            if (e.count > max_) max_ = e.count;
        } else {
            push(Entry{tok, count});
        }
        sum_ += count;
    }

    // Appends `tok` without looking for it first (the caller knows it is new).
    void add_new(token_t tok, int32_t count) {
        push(Entry{tok, count});
        sum_ += count;
    }

    void clear() {
        release();
        size_ = 0;
        cap_ = 1;
        sum_ = 0;
        max_ = 0;
    }

    // Exchanges contents with `o` (eviction compacts the kept parts this way, no copies).
    void swap(Part& o) noexcept {
        static_assert(sizeof(Entry) == sizeof(Entry*), "the union is swapped as raw bytes");
        unsigned char tmp[sizeof(Entry)];  // the union's bytes, whichever member is live
        std::memcpy(tmp, &inline_, sizeof tmp);
        std::memcpy(&inline_, &o.inline_, sizeof tmp);
        std::memcpy(&o.inline_, tmp, sizeof tmp);
        std::swap(size_, o.size_);
        std::swap(cap_, o.cap_);
        std::swap(sum_, o.sum_);
        std::swap(index_, o.index_);
        std::swap(index_mask_, o.index_mask_);
        std::swap(max_, o.max_);
    }

    // An upper bound of the bytes this part has on the heap for `n` entries: entry
    // capacity at most twice the size, and a token index of at most 4 slots per entry.
    static constexpr size_t kHeapBytesPerEntry = 2 * sizeof(Entry) + 4 * sizeof(uint32_t);

private:
    // Large parts (a common 1-gram can have thousands of continuations) get a token
    // index so that update stays O(1); small parts are scanned, which is faster.
    static constexpr uint32_t kIndexFrom = 16;

    Entry* data() { return cap_ <= 1 ? &inline_ : heap_; }
    const Entry* data() const { return cap_ <= 1 ? &inline_ : heap_; }

    int64_t find(token_t tok) const {
        const Entry* d = data();
        if (index_ == nullptr) {
            for (uint32_t i = 0; i < size_; ++i)
                if (d[i].token == tok) return i;
            return -1;
        }
        for (uint32_t h = slot_of(tok);; h = (h + 1) & index_mask_) {
            uint32_t v = index_[h];
            if (v == 0) return -1;
            if (d[v - 1].token == tok) return v - 1;
        }
    }

    uint32_t slot_of(token_t tok) const {
        return static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(tok)) *
                                      0x9E3779B97F4A7C15ull) >> 32) & index_mask_;
    }

    void push(Entry e) {
        if (size_ == cap_) grow();
        data()[size_] = e;
        ++size_;
        if (e.count > max_) max_ = e.count;
        if (index_ != nullptr) {
            if (2 * size_ > index_mask_ + 1) rebuild_index(2 * (index_mask_ + 1));
            else index_insert(size_ - 1);
        } else if (size_ > kIndexFrom) {
            rebuild_index(4 * kIndexFrom);
        }
    }

    void grow() {
        uint32_t ncap = cap_ < 2 ? 2 : cap_ * 2;
        Entry* nd = static_cast<Entry*>(std::malloc(sizeof(Entry) * ncap));
        if (nd == nullptr) throw std::bad_alloc();
        const Entry* od = data();
        for (uint32_t i = 0; i < size_; ++i) nd[i] = od[i];
        if (cap_ > 1) std::free(heap_);
        heap_ = nd;
        cap_ = ncap;
    }

    void rebuild_index(uint32_t slots) {
        std::free(index_);
        index_ = static_cast<uint32_t*>(std::calloc(slots, sizeof(uint32_t)));
        if (index_ == nullptr) throw std::bad_alloc();
        index_mask_ = slots - 1;
        for (uint32_t i = 0; i < size_; ++i) index_insert(i);
    }

    void index_insert(uint32_t i) {
        uint32_t h = slot_of(data()[i].token);
        while (index_[h] != 0) h = (h + 1) & index_mask_;
        index_[h] = i + 1;
    }

    void release() {
        if (cap_ > 1) std::free(heap_);
        std::free(index_);
        index_ = nullptr;
        index_mask_ = 0;
    }

    union {
        Entry inline_;   // the usual single continuation lives here, no allocation
        Entry* heap_;
    };
    uint32_t size_ = 0;
    uint32_t cap_ = 1;
    int64_t sum_ = 0;
    uint32_t* index_ = nullptr;  // open addressing: entry index + 1, 0 = empty
    uint32_t index_mask_ = 0;
    int32_t max_ = 0;
};

class NgramCache {
public:
    NgramCache() { clear(); }
    NgramCache(const NgramCache&) = delete;
    NgramCache& operator=(const NgramCache&) = delete;

    size_t size() const { return keys_.size(); }
    const Ngram& key_at(size_t i) const { return keys_[i]; }
    const Part& part_at(size_t i) const { return part_ref(i); }

    const Part* find(const Ngram& k) const { return find(k, hash_ngram(k)); }

    // find() given h = hash_ngram(k): drafting hashes a key once for both caches it probes.
    const Part* find(const Ngram& k, uint64_t h) const {
        const uint32_t fp = static_cast<uint32_t>(h >> 32);
        for (size_t s = h & mask_;; s = (s + 1) & mask_) {
            const uint64_t v = slots_[s];
            if (v == 0) return nullptr;
            if (static_cast<uint32_t>(v >> 32) == fp) {
                const uint32_t idx = static_cast<uint32_t>(v) - 1;
                if (keys_[idx] == k) return &part_ref(idx);
            }
        }
    }

    // Starts loading the slot where a lookup of hash h begins (see prefetch_read).
    void prefetch(uint64_t h) const { prefetch_read(slots_.data() + (h & mask_)); }

    // The part for `k`, created empty if absent.
    // For building a cache (loaders): the caller may set any count through the part, so
    // the count bound becomes unknown until recount().
    Part& get_or_insert(const Ngram& k) {
        count_bound_ = kCountMax;
        return part_ref(index_of_or_insert(k));
    }

    // The index of `k`'s part, created empty if absent.
    uint32_t index_of_or_insert(const Ngram& k) {
        const uint64_t h = hash_ngram(k);
        const uint32_t fp = static_cast<uint32_t>(h >> 32);
        size_t s = h & mask_;
        for (;; s = (s + 1) & mask_) {
            const uint64_t v = slots_[s];
            if (v == 0) break;
            if (static_cast<uint32_t>(v >> 32) == fp) {
                const uint32_t idx = static_cast<uint32_t>(v) - 1;
                if (keys_[idx] == k) return idx;
            }
        }
        if (keys_.size() >= std::numeric_limits<uint32_t>::max() - 1)
            throw std::length_error("n-gram cache holds too many keys");
        const uint32_t idx = static_cast<uint32_t>(keys_.size());
        if (idx % kSegment == 0) segments_.emplace_back(new Part[kSegment]);
        keys_.push_back(k);
        slots_[s] = (static_cast<uint64_t>(fp) << 32) | (idx + 1);
        if (4 * (keys_.size() + 1) > 3 * slots_.size()) rehash(2 * slots_.size());
        return idx;
    }

    // llama.cpp's common_ngram_cache_update: the observations ending in the last `nnew`
    // tokens, for every n-gram size in [ngram_min, ngram_max]. All or nothing: an update
    // that would take a count past int32 throws std::overflow_error before changing
    // anything.
    void update(const token_t* inp, size_t n_inp, int ngram_min, int ngram_max, size_t nnew) {
        check_sizes(ngram_min, ngram_max);
        if (nnew > n_inp) nnew = n_inp;
        // One update counts no (n-gram, token) pair more than nnew times.
        if (count_bound_ + static_cast<int64_t>(nnew) > kCountMax)
            check_update_fits(inp, n_inp, ngram_min, ngram_max, nnew);
        if (max_bytes_ != 0) {
            update_within_budget(inp, n_inp, ngram_min, ngram_max, nnew);
        } else {
            for (int n = ngram_min; n <= ngram_max; ++n) {
                size_t i_start = n_inp - nnew;
                if (i_start < static_cast<size_t>(n)) i_start = n;
                for (size_t i = i_start; i < n_inp; ++i)
                    part_ref(index_of_or_insert(Ngram(inp + i - n, n))).add(inp[i], 1);
            }
        }
        count_bound_ += static_cast<int64_t>(nnew);
    }

    // llama.cpp's common_ngram_cache_merge: counts are summed, walking `add` in the order
    // llama.cpp's outer map of it visits its keys (so keys new here are inserted as
    // llama.cpp inserts them). A key new here takes a copy of `add`'s part (first-seen
    // order and all, as llama.cpp copies the map); a key already here receives `add`'s
    // tokens in the order llama.cpp's map of that part visits them, which is the order new
    // tokens get appended in (and later ties read).
    // `llama_key_order` false walks `add` in its own order instead, which saves working out
    // llama.cpp's: every part ends up the same (drafts never depend on the order of keys),
    // only the order of the keys new here differs, which a later save or merge of this
    // cache would show. For a cache that is thrown away afterwards.
    // All or nothing: a merge that would take a count past int32 throws
    // std::overflow_error before changing anything.
    void merge(const NgramCache& add, bool llama_key_order = true) {
        if (count_bound_ + add.count_bound_ > kCountMax) check_merge_fits(add);
        const int64_t add_bound = add.count_bound_;  // read first: `add` may be this cache
        merge_unchecked(add, llama_key_order);
        count_bound_ += add_bound;
        ++clock_;
    }

    // The largest count held (0 for an empty cache). O(keys).
    int32_t max_count() const {
        int32_t m = 0;
        for (size_t i = 0; i < keys_.size(); ++i) m = std::max(m, part_ref(i).max_count());
        return m;
    }

    // For code that filled the cache through get_or_insert (a loader): makes the count
    // bound (which lets update and merge skip their overflow checks) and the entry count
    // exact again.
    void recount() {
        count_bound_ = max_count();
        n_entries_ = n_entries();
    }

    // ---- A memory budget, for caches that live as long as a server --------------------
    // 0 (the default) is llama.cpp's unbounded cache. Otherwise, whenever the cache's
    // estimated footprint (estimated_bytes(), an upper bound of what it allocates)
    // exceeds `bytes`, the n-grams least recently counted are forgotten until it is at
    // most 3/4 of `bytes`. Drafts then come from what is left; the parts kept keep
    // their counts and first-seen order, and the keys their insertion order.
    void set_max_bytes(size_t bytes) {
        if (bytes != 0 && bytes < kMinBudget)
            throw InputError("max_bytes must be 0 (no limit) or at least " + std::to_string(kMinBudget) +
                             ", got " + std::to_string(bytes));
        max_bytes_ = bytes;
        last_used_.clear();
        last_used_.shrink_to_fit();
        if (bytes == 0) return;
        n_entries_ = n_entries();
        // What the cache holds already counts as used in insertion order.
        last_used_.resize(keys_.size());
        for (size_t i = 0; i < keys_.size(); ++i) last_used_[i] = clock_ + i;
        clock_ += keys_.size();
        if (estimated_bytes() > max_bytes_) evict();
    }
    size_t max_bytes() const { return max_bytes_; }
    // How many n-grams the budget made the cache forget so far.
    uint64_t evicted() const { return evicted_; }

    // An upper bound of the bytes held under a budget (the table, keys, part segments,
    // use stamps and every part's heap, with malloc's overhead); without one,
    // memory_bytes().
    size_t estimated_bytes() const {
        if (max_bytes_ == 0) return memory_bytes();
        return slots_.capacity() * sizeof(uint64_t) + keys_.capacity() * sizeof(Ngram) +
               segments_.size() * (kSegment * sizeof(Part) + kMallocOverhead) +
               last_used_.capacity() * sizeof(uint64_t) + keys_.size() * (2 * kMallocOverhead + kTransientPerKey) +
               n_entries_ * Part::kHeapBytesPerEntry;
    }

    void merge_unchecked(const NgramCache& add, bool llama_key_order) {
        if (&add == this) {  // doubling: iterate over a snapshot of the sizes
            for (size_t i = 0; i < keys_.size(); ++i) {
                Part& p = part_ref(i);
                const uint32_t n = p.size();
                for (uint32_t j = 0; j < n; ++j) p.add(p[j].token, p[j].count);
            }
            return;
        }
        // Under a budget the table grows only as far as eviction lets it.
        if (max_bytes_ == 0) reserve(keys_.size() + add.size());
        auto merge_key = [&](uint32_t i) __attribute__((always_inline)) {
            const Part& src = add.part_at(i);
            const uint32_t idx = index_of_or_insert(add.key_at(i));
            Part& dst = part_ref(idx);
            const uint32_t before = dst.size();
            merge_part(dst, src);
            if (max_bytes_ != 0) {
                counted(idx, dst.size() - before, clock_);
                if (estimated_bytes() > max_bytes_) evict();
            }
        };
        if (llama_key_order) {
            for (uint32_t i : add.llama_key_order()) merge_key(i);
        } else {
            for (uint32_t i = 0; i < add.keys_.size(); ++i) merge_key(i);
        }
    }

    // dst += src, src's tokens new to dst appended in the order llama.cpp's map of src
    // visits them.
    __attribute__((always_inline)) static void merge_part(Part& dst, const Part& src) {
            if (dst.size() == 0 || src.size() < 2) {
                for (const Entry& e : src) dst.add(e.token, e.count);
            } else {
                libstdcxx::visit_in_order(src.size(), [&](size_t k) { return src[uint32_t(k)].token; },
                                          [&](size_t k) {
                                              dst.add(src[uint32_t(k)].token, src[uint32_t(k)].count);
                                              return false;
                                          });
            }
    }

    void reserve(size_t n_keys) {
        size_t want = slots_.size();
        while (4 * (n_keys + 1) > 3 * want) want *= 2;
        if (want != slots_.size()) rehash(want);
        // Geometric, never exact: repeated merges of small caches into a big one must not
        // reallocate the key array every time (that is quadratic).
        if (n_keys > keys_.capacity()) keys_.reserve(std::max(n_keys, 2 * keys_.capacity()));
    }

    // Key indices in the iteration order of llama.cpp's outer map of this cache (keys
    // inserted in this cache's order, into a map that had `llama_buckets_` when it was
    // last cleared, as llama-lookup-stats' context cache is after every chunk).
    std::vector<uint32_t> llama_key_order() const {
        libstdcxx::NodeList list(llama_buckets_);
        list.reserve(keys_.size());
        for (const Ngram& k : keys_) list.insert(libstdcxx::llama_ngram_hash(k.t));
        return list.order();
    }

    void swap(NgramCache& o) noexcept {
        std::swap(count_bound_, o.count_bound_);
        std::swap(max_bytes_, o.max_bytes_);
        std::swap(n_entries_, o.n_entries_);
        last_used_.swap(o.last_used_);
        std::swap(clock_, o.clock_);
        std::swap(evicted_, o.evicted_);
        std::swap(llama_buckets_, o.llama_buckets_);
        slots_.swap(o.slots_);
        std::swap(mask_, o.mask_);
        keys_.swap(o.keys_);
        segments_.swap(o.segments_);
    }

    // Empties the cache. Like the unordered_map's clear(), the bucket count llama.cpp's map
    // reached stays, which decides the order of the keys inserted next.
    void clear() {
        llama_buckets_ = libstdcxx::buckets_after(llama_buckets_, keys_.size());
        keys_.clear();
        keys_.shrink_to_fit();
        segments_.clear();
        slots_.assign(kInitialSlots, 0);
        mask_ = kInitialSlots - 1;
        count_bound_ = 0;
        n_entries_ = 0;
        last_used_.clear();  // the budget itself stays
    }

    // Bytes held (approximate: table, keys, parts and their heap entries).
    size_t memory_bytes() const {
        size_t b = slots_.capacity() * sizeof(uint64_t) + keys_.capacity() * sizeof(Ngram) +
                   segments_.size() * kSegment * sizeof(Part);
        for (size_t i = 0; i < keys_.size(); ++i) {
            const Part& p = part_ref(i);
            if (p.size() > 1) b += sizeof(Entry) * p.size();
        }
        return b;
    }

    // (key, next token) pairs held.
    size_t n_entries() const {
        size_t m = 0;
        for (size_t i = 0; i < keys_.size(); ++i) m += part_ref(i).size();
        return m;
    }

    // Every record in insertion order, continuations in first-seen order, into arrays the
    // caller sized from size() and n_entries(): keys N x 4, offsets N + 1, tokens, counts.
    void export_arrays(int32_t* keys, int64_t* offsets, int32_t* toks, int32_t* cnts) const {
        size_t j = 0;
        offsets[0] = 0;
        for (size_t i = 0; i < keys_.size(); ++i) {
            std::memcpy(keys + 4 * i, keys_[i].t, sizeof keys_[i].t);
            for (const Entry& e : part_ref(i)) {
                toks[j] = e.token;
                cnts[j] = e.count;
                ++j;
            }
            offsets[i + 1] = static_cast<int64_t>(j);
        }
    }

    // Checked on every draft and update: the test stays inline, the message out of line.
    static void check_sizes(int ngram_min, int ngram_max) {
        if (ngram_min < 1 || ngram_max > kNgramMax || ngram_min > ngram_max) bad_sizes(ngram_min, ngram_max);
    }
    [[noreturn]] __attribute__((noinline, cold)) static void bad_sizes(int ngram_min, int ngram_max) {
        throw InputError("need 1 <= ngram_min <= ngram_max <= 4, got ngram_min=" + std::to_string(ngram_min) +
                         ", ngram_max=" + std::to_string(ngram_max));
    }

private:
    static constexpr size_t kSegment = 4096;
    static constexpr size_t kInitialSlots = 64;
    static constexpr int64_t kCountMax = std::numeric_limits<int32_t>::max();
    static constexpr size_t kMallocOverhead = 16;  // glibc: a header and alignment per block
    static constexpr size_t kMinBudget = size_t(1) << 20;
    // Per key, room for what growing and evicting allocate for a moment beside what the
    // cache holds: a doubled slot table or key array, or eviction's sorted indices (each
    // at most this much), so that the budget bounds the peak, not just the steady state.
    static constexpr size_t kTransientPerKey = 48;

    // Slow path of update's overflow check, for a cache whose counts may be near the
    // int32 limit: tallies this update's pairs exactly and throws if one would overflow.
    __attribute__((noinline, cold)) void check_update_fits(const token_t* inp, size_t n_inp, int ngram_min, int ngram_max, size_t nnew) {
        count_bound_ = max_count();
        if (count_bound_ + static_cast<int64_t>(nnew) <= kCountMax) return;
        std::vector<std::pair<Ngram, token_t>> pairs;  // sorted, so equal pairs are adjacent
        for (int n = ngram_min; n <= ngram_max; ++n) {
            size_t i_start = n_inp - nnew;
            if (i_start < static_cast<size_t>(n)) i_start = n;
            for (size_t i = i_start; i < n_inp; ++i) pairs.emplace_back(Ngram(inp + i - n, n), inp[i]);
        }
        std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
            return std::memcmp(&a, &b, sizeof a) < 0;
        });
        for (size_t a = 0; a < pairs.size();) {
            size_t b = a + 1;
            while (b < pairs.size() && std::memcmp(&pairs[a], &pairs[b], sizeof pairs[a]) == 0) ++b;
            const Part* p = find(pairs[a].first);
            const int64_t now = p == nullptr ? 0 : p->count_of(pairs[a].second);
            if (now + static_cast<int64_t>(b - a) > kCountMax) count_overflow();
            a = b;
        }
    }

    // merge's overflow check, when the bounds of the two caches allow an overflow: exact.
    __attribute__((noinline, cold)) void check_merge_fits(const NgramCache& add) {
        count_bound_ = max_count();
        if (&add == this) {
            if (2 * count_bound_ > kCountMax) count_overflow();
            return;
        }
        const int64_t add_max = add.max_count();
        if (count_bound_ + add_max <= kCountMax) return;
        for (size_t i = 0; i < add.size(); ++i) {
            const Part* p = find(add.key_at(i));
            if (p == nullptr) continue;
            for (const Entry& e : add.part_at(i))
                if (static_cast<int64_t>(p->count_of(e.token)) + e.count > kCountMax) count_overflow();
        }
    }

    [[noreturn]] __attribute__((noinline, cold)) static void count_overflow() {
        throw std::overflow_error("n-gram count exceeds the int32 range of lookup.bin");
    }

    // update() under a budget, in update()'s order: counts entries and use stamps (the
    // position counted), and evicts as it goes, so even one long update stays within it.
    __attribute__((noinline)) void update_within_budget(const token_t* inp, size_t n_inp, int ngram_min, int ngram_max, size_t nnew) {
        const uint64_t base = clock_ - (n_inp - nnew);  // the stamp of position i is base + i
        for (int n = ngram_min; n <= ngram_max; ++n) {
            size_t i_start = n_inp - nnew;
            if (i_start < static_cast<size_t>(n)) i_start = n;
            for (size_t i = i_start; i < n_inp; ++i) {
                const uint32_t idx = index_of_or_insert(Ngram(inp + i - n, n));
                Part& p = part_ref(idx);
                const uint32_t before = p.size();
                const bool new_key = idx == last_used_.size();
                p.add(inp[i], 1);
                counted(idx, p.size() - before, base + i);
                // Only a new key or entry can take the footprint past the budget.
                if ((new_key || p.size() != before) && estimated_bytes() > max_bytes_) evict();
            }
        }
        clock_ += nnew;
    }

    // Book-keeping of a budgeted cache after key `idx` was counted.
    void counted(uint32_t idx, uint32_t new_entries, uint64_t stamp) {
        n_entries_ += new_entries;
        if (idx == last_used_.size()) last_used_.push_back(stamp);
        else last_used_[idx] = std::max(last_used_[idx], stamp);
    }

    // The bytes a key costs under a budget (see estimated_bytes), with its share of a
    // slot table of up to 8/3 slots per key.
    size_t key_cost(size_t i) const {
        return sizeof(Ngram) + sizeof(Part) + sizeof(uint64_t) + 2 * kMallocOverhead + kTransientPerKey +
               3 * sizeof(uint64_t) + part_ref(i).size() * Part::kHeapBytesPerEntry;
    }

    // Forgets the least recently counted keys until the estimate is at most 3/4 of the
    // budget; the keys kept stay in insertion order.
    __attribute__((noinline)) void evict() {
        const size_t target = max_bytes_ / 4 * 3;
        std::vector<uint32_t> by_use(keys_.size());
        for (uint32_t i = 0; i < by_use.size(); ++i) by_use[i] = i;
        std::sort(by_use.begin(), by_use.end(), [&](uint32_t a, uint32_t b) {
            return last_used_[a] != last_used_[b] ? last_used_[a] > last_used_[b] : a > b;
        });
        size_t fixed = kInitialSlots * sizeof(uint64_t) + kSegment * sizeof(Part) + kMallocOverhead;
        size_t kept_bytes = fixed;
        size_t n_keep = 0;
        while (n_keep < by_use.size()) {
            // A segment per kSegment keys kept.
            const size_t extra = key_cost(by_use[n_keep]) +
                                 ((n_keep + 1) % kSegment == 0 ? kSegment * sizeof(Part) + kMallocOverhead : 0);
            if (kept_bytes + extra > target) break;
            kept_bytes += extra;
            ++n_keep;
        }
        std::vector<uint32_t> keep(by_use.begin(), by_use.begin() + n_keep);
        by_use.clear();
        by_use.shrink_to_fit();
        std::sort(keep.begin(), keep.end());
        evicted_ += keys_.size() - n_keep;
        // Compacted in place (keep[j] >= j): eviction must not need a second copy of what
        // it keeps, or the cache would peak far above its budget while evicting.
        size_t entries = 0;
        for (size_t j = 0; j < keep.size(); ++j) {
            if (keep[j] != j) {
                part_ref(j).swap(part_ref(keep[j]));
                keys_[j] = keys_[keep[j]];
                last_used_[j] = last_used_[keep[j]];
            }
            entries += part_ref(j).size();
        }
        for (size_t i = n_keep; i < keys_.size(); ++i) part_ref(i).clear();
        keys_.resize(n_keep);
        keys_.shrink_to_fit();
        last_used_.resize(n_keep);
        last_used_.shrink_to_fit();
        segments_.resize((n_keep + kSegment - 1) / kSegment);
        n_entries_ = entries;
        keep.clear();
        keep.shrink_to_fit();
        size_t nslots = kInitialSlots;
        while (4 * (keys_.size() + 1) > 3 * nslots) nslots *= 2;
        rehash(nslots);
    }

    Part& part_ref(size_t i) { return segments_[i / kSegment][i % kSegment]; }
    const Part& part_ref(size_t i) const { return segments_[i / kSegment][i % kSegment]; }

    void rehash(size_t nslots) {
        std::vector<uint64_t> ns(nslots, 0);
        const size_t nmask = nslots - 1;
        for (size_t i = 0; i < keys_.size(); ++i) {
            const uint64_t h = hash_ngram(keys_[i]);
            size_t s = h & nmask;
            while (ns[s] != 0) s = (s + 1) & nmask;
            ns[s] = ((h >> 32) << 32) | (i + 1);
        }
        slots_.swap(ns);
        mask_ = nmask;
    }

    int64_t count_bound_ = 0;                      // no count held exceeds it
    size_t max_bytes_ = 0;                         // the budget; 0: unbounded
    size_t n_entries_ = 0;                         // (key, token) pairs, kept under a budget
    std::vector<uint64_t> last_used_;              // per key, under a budget: clock_ when last counted
    uint64_t clock_ = 0;                           // tokens counted under a budget
    uint64_t evicted_ = 0;
    uint64_t llama_buckets_ = 0;                   // llama.cpp's outer map at the last clear()
    std::vector<uint64_t> slots_;                  // (fingerprint << 32) | (part index + 1)
    size_t mask_ = 0;
    std::vector<Ngram> keys_;                      // insertion order
    std::vector<std::unique_ptr<Part[]>> segments_;
};

}  // namespace ngramcache
