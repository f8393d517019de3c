// llama.cpp's ngram-map-k and ngram-map-k4v drafters (common_ngram_map_begin/draft/accept,
// docs/speculative.md), with the same drafts.
//
// What is kept exactly as in llama.cpp, because the drafts depend on it: the 2^18-slot
// key_map (first writer wins, so colliding n-grams become unfindable once indexed), its
// two search ranges, the key records with their counters, the value slots of k4v and
// the n_accepted ratchet. The reference's searches already cover only the windows
// appended since the previous call. What grew with the context is replaced:
//  * the linear scan over all key records for the one whose n-gram equals the key is a
//    hash lookup (records' n-grams are distinct, so "the first equal record" is "the
//    equal record"); after the prompt is rewritten the lookup table is rebuilt in record
//    order from the records' current tokens, first record winning, as the scan would;
//  * k4v's scan of every position from stat_idx to the match for occurrences of the key
//    walks the key's occurrence chain in a WindowIndex instead (same positions, same
//    order).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ngram_simple.hpp"  // check_spec_size
#include "ngram_window_index.hpp"

namespace ngramcache {

class NgramMap {
public:
    static constexpr size_t kSlots = 262144;  // key_map: 2^18 uint32, 0 = empty
    static constexpr size_t kValues = 4;
    static constexpr uint32_t kCountCap = 16380;

    struct Value {
        uint32_t idx = 0;  // start of the value's m tokens; 0 = unused
        uint32_t num = 0;
        size_t n_accepted = 0;
    };
    struct Key {
        uint32_t key_idx = 0;   // start of one occurrence of the key
        uint32_t stat_idx = 0;  // occurrences from here on are counted at the next hit
        uint32_t key_num = 0;
        std::array<Value, kValues> values{};
    };

    // The options' (llama.cpp's) defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr size_t size_n = 12;
        static constexpr size_t size_m = 48;
        static constexpr size_t min_hits = 1;
        static constexpr bool k4v = false;
    };

    NgramMap(size_t size_n = Defaults::size_n, size_t size_m = Defaults::size_m, size_t min_hits = Defaults::min_hits,
             bool k4v = Defaults::k4v)
        : n_(check_spec_size("size_n", size_n)), m_(check_spec_size("size_m", size_m)),
          min_hits_(check_spec_size("min_hits", min_hits, 1, 65535)), key_only_(!k4v), key_map_(kSlots, 0),
          occ_(size_n) {}

    size_t size_n() const { return n_; }
    size_t size_m() const { return m_; }
    size_t min_hits() const { return min_hits_; }
    bool k4v() const { return !key_only_; }
    size_t key_size() const { return n_; }
    const TokenHistory& history() const { return hist_; }
    const std::vector<Key>& keys() const { return keys_; }

    void sync(const token_t* p, size_t n) {
        const size_t old = hist_.size();
        const size_t d = hist_.sync(p, n);
        if (d < old) {
            occ_.truncate(d);
            records_dirty_ = true;
        }
    }
    void append(const token_t* p, size_t n) { hist_.append(p, n); }
    // The token after the history, kept with it unread (TokenHistory::push_next).
    void push_next(token_t t) { hist_.push_next(t); }

    void begin(const token_t* p, size_t n) {
        sync(p, n);
        begin();
    }

    // common_ngram_map_begin with the history as the prompt.
    void begin() {
        const size_t size = hist_.size();
        size_t cleanup = size_last_begin_;
        if (cleanup > size) cleanup = size > n_ + m_ ? size - n_ - m_ : 0;  // the prompt shrank
        if (size < idx_last_check_) {  // the history was rewritten: forget what lies beyond
            for (uint32_t& s : key_map_)
                if (s != 0 && s >= cleanup) s = 0;
            key_map_last_idx_ = cleanup > 0 ? cleanup - 1 : 0;
            for (size_t i = keys_.size(); i-- > 0;) {
                Key& k = keys_[i];
                if (k.key_idx >= cleanup) {
                    keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(i));
                    continue;
                }
                if (key_only_) continue;
                for (size_t v = 0; v < kValues;) {
                    if (k.values[v].idx != 0 && k.values[v].idx >= cleanup) {
                        for (size_t w = v; w + 1 < kValues; ++w) k.values[w] = k.values[w + 1];
                        k.values[kValues - 1].idx = 0;
                        k.values[kValues - 1].num = 0;
                    } else {
                        ++v;
                    }
                }
                if (k.values[0].idx == 0) keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(i));
            }
            records_dirty_ = true;
        }
        idx_last_check_ = size;
        size_last_begin_ = size;
    }

    void draft(const token_t* prompt, size_t n, token_t id_last, std::vector<token_t>& out) {
        sync(prompt, n);
        draft(id_last, out);
    }

    // common_ngram_map_draft with the history as the prompt.
    void draft(token_t id_last, std::vector<token_t>& out) {
        out.clear();
        last_draft_created_ = false;
        const size_t cur = hist_.size();
        const size_t n = n_, m = m_;
        if (cur < 2 * n + m) return;
        idx_last_check_ = cur;
        const token_t* inp = hist_.data();
        key_.assign(inp + cur - n + 1, inp + cur);
        key_.push_back(id_last);
        const token_t* key = key_.data();

        size_t match = 0;
        const uint32_t s = key_map_[map_slot(key)];
        if (s != 0 && s < cur - n - m - 1 && detail::same_tokens(inp + s, key, n)) match = s;
        // Range A: the begin prompt's windows not indexed yet; range B: the newest ones.
        const size_t slb = size_last_begin_, kmli = key_map_last_idx_;
        const bool has_a = slb > n + m + 1;
        const size_t a_hi = has_a ? slb - n - m - 1 : 0;
        const size_t b_hi = cur - n - m - 1, b_lo = std::max(slb, kmli);
        if (match == 0 && has_a)
            for (size_t j = a_hi; j > kmli; --j)
                if (detail::same_tokens(inp + j, key, n)) {
                    match = j;
                    break;
                }
        if (match == 0)
            for (size_t j = b_hi; j > b_lo; --j)
                if (detail::same_tokens(inp + j, key, n)) {
                    match = j;
                    break;
                }
        if (has_a)
            for (size_t j = a_hi; j > kmli; --j) index_window(inp, j);
        for (size_t j = b_hi; j > b_lo; --j) index_window(inp, j);
        key_map_last_idx_ = std::max(b_hi, kmli);
        if (match == 0) return;

        const size_t ki = record_of(inp, cur, key, match);
        Key& rec = keys_[ki];
        rec.key_num = std::min(rec.key_num + 1, kCountCap);
        if (key_only_) {  // min_hits is not checked by ngram-map-k
            const size_t k = std::min(m, rec.values[0].n_accepted);
            out.assign(inp + match + n, inp + match + n + k);
            remember(ki, 0);
            return;
        }
        if (rec.key_num < min_hits_) return;
        count_values(inp, cur, rec, match);
        rec.stat_idx = static_cast<uint32_t>(match);  // the match is counted again next time
        size_t best = 0;
        for (size_t v = 1; v < kValues; ++v)
            if (rec.values[v].num > rec.values[best].num) best = v;
        uint64_t others = 0;
        for (size_t v = 0; v < kValues; ++v)
            if (v != best) others += rec.values[v].num;
        if (others > 0 && rec.values[best].num < 2 * others) return;  // not dominant enough
        const size_t k = std::min(m, rec.values[best].n_accepted);
        // The tokens after the most recent match, not after values[best] (as llama.cpp).
        out.assign(inp + match + n, inp + match + n + k);
        remember(ki, best);
    }

    void accept(size_t n_accepted) {
        if (last_draft_created_) keys_[last_key_].values[last_value_].n_accepted = n_accepted;
    }

private:
    static size_t map_slot(const token_t* t, size_t n) {
        uint32_t h = 0;
        for (size_t i = 0; i < n; ++i) h = h * 2654435761u + static_cast<uint32_t>(t[i]);
        return h % kSlots;
    }
    size_t map_slot(const token_t* t) const { return map_slot(t, n_); }

    void index_window(const token_t* inp, size_t j) {
        uint32_t& s = key_map_[map_slot(inp + j)];
        if (s == 0) s = static_cast<uint32_t>(j);
    }

    void remember(size_t key, size_t value) {
        last_draft_created_ = true;
        last_key_ = key;
        last_value_ = value;
    }

    // --- key records by their n-gram ------------------------------------------------

    // The record whose n-gram (read at its key_idx) equals key, appended when there is none.
    size_t record_of(const token_t* inp, size_t cur, const token_t* key, size_t match) {
        if (records_dirty_) rebuild_records(inp, cur);
        const uint64_t h = detail::window_hash(key, n_);
        const size_t mask = rec_slots_.size() - 1;
        size_t i = detail::mix64(h) & mask;
        for (;; i = (i + 1) & mask) {
            const RecSlot& r = rec_slots_[i];
            if (r.rec == kNoRecord) break;
            if (r.h == h && detail::same_tokens(inp + keys_[r.rec].key_idx, key, n_)) return r.rec;
        }
        Key k;
        k.key_idx = static_cast<uint32_t>(match);
        for (Value& v : k.values) v.n_accepted = m_;
        keys_.push_back(k);
        const auto id = static_cast<uint32_t>(keys_.size() - 1);
        if (records_dirty_) return id;  // the next draft rebuilds the table anyway
        rec_slots_[i] = RecSlot{h, id};
        if (++rec_count_ * 2 > rec_slots_.size()) grow_records();
        return id;
    }

    // In record order, first record winning, as llama.cpp's linear scan; a record whose
    // n-gram is not inside the history (only after a rewritten prompt) cannot match now
    // and is looked at again by the next rebuild.
    void rebuild_records(const token_t* inp, size_t cur) {
        rec_slots_.assign(std::max<size_t>(16, 2 * next_pow2(keys_.size() + 1)), RecSlot{});
        rec_count_ = 0;
        bool beyond = false;
        const size_t mask = rec_slots_.size() - 1;
        for (size_t r = 0; r < keys_.size(); ++r) {
            const size_t at = keys_[r].key_idx;
            if (at + n_ > cur) {
                beyond = true;
                continue;
            }
            const uint64_t h = detail::window_hash(inp + at, n_);
            size_t i = detail::mix64(h) & mask;
            bool dup = false;
            for (; rec_slots_[i].rec != kNoRecord; i = (i + 1) & mask) {
                const RecSlot& s = rec_slots_[i];
                if (s.h == h && detail::same_tokens(inp + keys_[s.rec].key_idx, inp + at, n_)) {
                    dup = true;
                    break;
                }
            }
            if (dup) continue;
            rec_slots_[i] = RecSlot{h, static_cast<uint32_t>(r)};
            ++rec_count_;
        }
        records_dirty_ = beyond;
    }

    void grow_records() {
        detail::grow_table(rec_slots_, [](const RecSlot& s) { return s.rec != kNoRecord; });
    }

    static size_t next_pow2(size_t x) {
        size_t p = 1;
        while (p < x) p <<= 1;
        return p;
    }

    // --- k4v: the values seen after the key's occurrences from stat_idx to match --------

    void count_values(const token_t* inp, size_t cur, Key& rec, size_t match) {
        occ_.extend(inp, cur);
        const WindowIndex::Entry* e = occ_.find(inp, inp + match);
        // stat_idx is the previous match, so usually an occurrence itself
        uint32_t i = rec.stat_idx;
        if (i > match) return;
        if (!detail::same_tokens(inp + i, inp + match, n_)) {
            i = e->first;
            while (i != WindowIndex::kNone && i < rec.stat_idx) i = occ_.next(i);
        }
        for (; i != WindowIndex::kNone && i <= match; i = occ_.next(i)) {
            for (size_t v = 0; v < kValues; ++v) {
                Value& val = rec.values[v];
                if (val.idx == 0) {
                    val.idx = static_cast<uint32_t>(i + n_);
                    val.num = 0;
                    val.n_accepted = m_;
                } else if (!detail::same_tokens(inp + val.idx, inp + i + n_, m_)) {
                    continue;
                }
                val.num = std::min(val.num + 1, kCountCap);
                break;
            }
        }
    }

    static constexpr uint32_t kNoRecord = 0xFFFFFFFFu;
    struct RecSlot {
        uint64_t h = 0;
        uint32_t rec = kNoRecord;
    };

    size_t n_, m_, min_hits_;
    bool key_only_;
    TokenHistory hist_;
    std::vector<Key> keys_;
    std::vector<uint32_t> key_map_;
    size_t key_map_last_idx_ = 0;
    size_t size_last_begin_ = 0;
    size_t idx_last_check_ = 0;
    bool last_draft_created_ = false;
    size_t last_key_ = 0, last_value_ = 0;
    std::vector<token_t> key_;
    std::vector<RecSlot> rec_slots_ = std::vector<RecSlot>(16);
    size_t rec_count_ = 0;
    bool records_dirty_ = false;
    WindowIndex occ_;  // k4v only
};

}  // namespace ngramcache
