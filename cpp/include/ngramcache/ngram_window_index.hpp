// Building blocks of the llama.cpp-shaped drafters (ngram_simple.hpp, ngram_map.hpp,
// ngram_mod.hpp):
//
// TokenHistory  the drafter's own copy of the prompt. llama.cpp hands its drafters the
//               whole prompt at every call; keeping a copy lets a drafter index only what
//               was appended since the previous call and detect a rewritten prompt. It may
//               also hold the token after the prompt (llama.cpp's id_last), which the
//               drafter never reads, so that a SequenceAdapter (sequence_adapter.hpp) finds
//               the whole sequence in one buffer.
// WindowIndex   every window of n tokens of the history, grouped by content: per distinct
//               window its first and latest start, and per start the previous and next
//               start of an equal window. "The most recent earlier occurrence" of a window,
//               which llama.cpp finds by scanning the context backwards, is one lookup and
//               at most one step back along the chain; appending indexes only the new
//               windows, and a truncated history unindexes only the windows it lost.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ngram.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

// The longest history the drafters index (positions are stored in 32 bits).
inline constexpr size_t kMaxHistory = 0xFFFFFFF0u;

struct TokenHistory {
    TokenBuffer tok;        // the history, then the next token if has_next
    bool has_next = false;

    size_t size() const { return tok.size() - (has_next ? 1 : 0); }
    const token_t* data() const { return tok.data(); }

    // Makes the history equal to p[0..n), without a next token; returns how many leading
    // tokens of the history were kept. The comparison is one memcmp of the shorter length
    // (it only reads); a next token equal to p's token after the history is kept too.
    size_t sync(const token_t* p, size_t n) {
        check_length(n);
        const size_t old = size(), k = std::min(n, tok.size());
        size_t d = k;
        if (k && std::memcmp(tok.data(), p, k * sizeof(token_t)) != 0) {
            d = 0;
            while (d < k && tok[d] == p[d]) ++d;
        }
        tok.truncate(d);
        tok.append(p + d, n - d);
        has_next = false;
        return std::min(d, old);
    }

    void append(const token_t* p, size_t n) {
        take_next();
        check_length(tok.size() + n);
        tok.append(p, n);
    }

    // The token after the history (none held): it is kept, not indexed.
    void push_next(token_t t) {
        take_next();
        tok.push_back(t);
        has_next = true;
    }
    // The next token, if any, joins the history.
    void take_next() {
        if (has_next) check_length(tok.size());
        has_next = false;
    }

    static void check_length(size_t n) {
        if (n > kMaxHistory)
            throw InputError("a drafter's history is at most " + std::to_string(kMaxHistory) + " tokens, got " +
                             std::to_string(n));
    }
};

namespace detail {

// Polynomial hash of a window, Horner's rule mod 2^64: it rolls in O(1) per step.
inline constexpr uint64_t kWindowMul = 0x9E3779B97F4A7C15ull;

inline uint64_t window_hash(const token_t* t, size_t n) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; ++i) h = h * kWindowMul + static_cast<uint32_t>(t[i]);
    return h;
}

// The polynomial hash's low bits depend on the last tokens only; mix before masking.
inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline bool same_tokens(const token_t* a, const token_t* b, size_t n) {
    return std::memcmp(a, b, n * sizeof(token_t)) == 0;
}

// Doubles a linear-probing table whose slots sit at mix64(slot.h) and places every occupied
// slot again. A default-constructed Slot is an empty one. WindowIndex and NgramMap's
// record table (ngram_map.hpp) both grow this way.
template <class Slot, class Occupied>
void grow_table(std::vector<Slot>& slots, Occupied occupied) {
    std::vector<Slot> old(slots.size() * 2);
    old.swap(slots);
    const size_t mask = slots.size() - 1;
    for (const Slot& s : old) {
        if (!occupied(s)) continue;
        size_t i = mix64(s.h) & mask;
        while (occupied(slots[i])) i = (i + 1) & mask;
        slots[i] = s;
    }
}

}  // namespace detail

class WindowIndex {
public:
    static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

    struct Entry {
        uint64_t h = 0;
        uint32_t first = kNone;  // kNone: an empty slot
        uint32_t last = kNone;
    };

    explicit WindowIndex(size_t n) : n_(n) {
        if (n == 0) throw InputError("a window is at least 1 token");
        pow_ = 1;
        for (size_t i = 1; i < n; ++i) pow_ *= detail::kWindowMul;
        slots_.assign(16, Entry{});
    }

    size_t window() const { return n_; }
    size_t size() const { return hash_.size(); }  // windows indexed: starts 0 .. size()-1

    void clear() {
        hash_.clear();
        prev_.clear();
        next_.clear();
        slots_.assign(16, Entry{});
        count_ = 0;
    }

    // Indexes every window of seq[0..len) not indexed yet (seq extends what was indexed).
    void extend(const token_t* seq, size_t len) {
        if (len < n_) return;
        const size_t end = len - n_ + 1;
        for (size_t j = size(); j < end; ++j) {
            const uint64_t h = j == 0 ? detail::window_hash(seq, n_)
                                      : (hash_[j - 1] - pow_ * static_cast<uint32_t>(seq[j - 1])) *
                                                detail::kWindowMul +
                                            static_cast<uint32_t>(seq[j + n_ - 1]);
            insert(seq, static_cast<uint32_t>(j), h);
        }
    }

    // Forgets the windows that do not fit in the first len tokens, newest first, which
    // restores exactly the index those tokens alone would have built.
    void truncate(size_t len) {
        const size_t keep = len >= n_ ? len - n_ + 1 : 0;
        while (size() > keep) {
            const uint32_t j = static_cast<uint32_t>(size() - 1);
            const size_t i = find_slot_of_last(j);
            Entry& e = slots_[i];
            const uint32_t p = prev_[j];
            if (p == kNone) {
                erase_at(i);
                --count_;
            } else {
                e.last = p;
                next_[p] = kNone;
            }
            hash_.pop_back();
            prev_.pop_back();
            next_.pop_back();
        }
    }

    // The entry of the windows equal to key[0..n) (seq: the indexed tokens), or nullptr.
    const Entry* find(const token_t* seq, const token_t* key) const {
        const uint64_t h = detail::window_hash(key, n_);
        const size_t mask = slots_.size() - 1;
        for (size_t i = detail::mix64(h) & mask;; i = (i + 1) & mask) {
            const Entry& e = slots_[i];
            if (e.first == kNone) return nullptr;
            if (e.h == h && detail::same_tokens(seq + e.first, key, n_)) return &e;
        }
    }

    uint32_t prev(uint32_t j) const { return prev_[j]; }
    uint32_t next(uint32_t j) const { return next_[j]; }

private:
    size_t home(uint64_t h) const { return detail::mix64(h) & (slots_.size() - 1); }

    void insert(const token_t* seq, uint32_t j, uint64_t h) {
        if ((count_ + 1) * 2 > slots_.size()) grow();
        hash_.push_back(h);
        prev_.push_back(kNone);
        next_.push_back(kNone);
        const size_t mask = slots_.size() - 1;
        for (size_t i = home(h);; i = (i + 1) & mask) {
            Entry& e = slots_[i];
            if (e.first == kNone) {
                e = Entry{h, j, j};
                ++count_;
                return;
            }
            if (e.h == h && detail::same_tokens(seq + e.first, seq + j, n_)) {
                prev_[j] = e.last;
                next_[e.last] = j;
                e.last = j;
                return;
            }
        }
    }

    size_t find_slot_of_last(uint32_t j) const {
        const size_t mask = slots_.size() - 1;
        for (size_t i = home(hash_[j]);; i = (i + 1) & mask)
            if (slots_[i].last == j) return i;
    }

    // Linear probing's backward-shift deletion: no tombstones, so lookups stay short.
    void erase_at(size_t i) {
        const size_t mask = slots_.size() - 1;
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (slots_[j].first == kNone) break;
            const size_t k = home(slots_[j].h);
            const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (stays) continue;
            slots_[i] = slots_[j];
            i = j;
        }
        slots_[i] = Entry{};
    }

    void grow() {
        detail::grow_table(slots_, [](const Entry& e) { return e.first != kNone; });
    }

    size_t n_;
    uint64_t pow_;  // kWindowMul^(n-1): the weight of the token rolled out
    std::vector<uint64_t> hash_;
    std::vector<uint32_t> prev_, next_;
    std::vector<Entry> slots_;
    size_t count_ = 0;
};

}  // namespace ngramcache
