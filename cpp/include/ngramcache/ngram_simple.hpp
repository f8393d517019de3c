// llama.cpp's ngram-simple drafter (common_ngram_simple_draft; docs/speculative.md),
// with the same drafts and a step cost that does not grow with the context.
//
// The reference scans the context backwards for the most recent earlier occurrence of
// the last size_n tokens (starts cur-size_n-1 down to 1) at every call. Here a
// WindowIndex of the history's size_n-windows answers the same question: its latest
// start for the pattern's content is the newest occurrence of all; the only start the
// scan does not consider at the top is cur-size_n (the window just before the pattern),
// so the answer is that latest start or, when it is cur-size_n, the one before it on the
// chain; a start of 0 is never a match, and it can only be the oldest, so then there is
// none. A call indexes only the windows appended since the previous one: O(size_n +
// size_m) per step.
//
// Calling shape as in llama.cpp: begin(prompt), draft(prompt, id_last), accept(n_accepted),
// where prompt excludes id_last. The drafter keeps a copy of the prompt (TokenHistory):
// draft(prompt, ...) compares it with the copy in one memcmp and indexes what is new;
// sync()/append() and the prompt-less draft(id_last, out) let a caller that knows what
// changed skip even that comparison.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ngram_window_index.hpp"

namespace ngramcache {

// llama.cpp's option ranges (--spec-ngram-*-size-n / -size-m, --spec-ngram-mod-*).
inline constexpr size_t kSpecSizeMax = 1024;

inline size_t check_spec_size(const char* name, size_t v, size_t lo = 1, size_t hi = kSpecSizeMax) {
    if (v < lo || v > hi)
        throw InputError(std::string(name) + " must be " + std::to_string(lo) + " to " + std::to_string(hi) +
                         ", got " + std::to_string(v));
    return v;
}

class NgramSimple {
public:
    // The options' (llama.cpp's) defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr size_t size_n = 12;
        static constexpr size_t size_m = 48;
    };

    explicit NgramSimple(size_t size_n = Defaults::size_n, size_t size_m = Defaults::size_m)
        : n_(check_spec_size("size_n", size_n)), m_(check_spec_size("size_m", size_m)), index_(size_n) {}

    size_t size_n() const { return n_; }
    size_t size_m() const { return m_; }
    size_t key_size() const { return n_; }
    const TokenHistory& history() const { return hist_; }

    // The history becomes p[0..n) / grows by p[0..n).
    void sync(const token_t* p, size_t n) { index_.truncate(hist_.sync(p, n)); }
    void append(const token_t* p, size_t n) { hist_.append(p, n); }
    // The token after the history, kept with it unread (TokenHistory::push_next).
    void push_next(token_t t) { hist_.push_next(t); }

    // ngram-simple keeps no per-request state: begin and accept do nothing.
    void begin() {}
    void begin(const token_t* p, size_t n) { sync(p, n); }
    void accept(size_t /*n_accepted*/) {}

    void draft(const token_t* prompt, size_t n, token_t id_last, std::vector<token_t>& out) {
        sync(prompt, n);
        draft(id_last, out);
    }

    // Drafts for the history as the prompt.
    void draft(token_t id_last, std::vector<token_t>& out) {
        out.clear();
        const size_t cur = hist_.size();
        if (cur <= n_ + m_ + 1) return;
        const token_t* seq = hist_.data();
        index_.extend(seq, cur);
        key_.assign(seq + cur - n_ + 1, seq + cur);
        key_.push_back(id_last);
        const WindowIndex::Entry* e = index_.find(seq, key_.data());
        if (e == nullptr) return;
        uint32_t j = e->last;
        if (j > cur - n_ - 1) j = index_.prev(j);  // cur-n_ is the only start above the scan
        if (j == WindowIndex::kNone || j == 0) return;
        const size_t copy = std::min(m_, cur - (j + n_));
        if (copy < n_) return;  // llama.cpp compares with the key size here
        out.assign(seq + j + n_, seq + j + n_ + copy);
    }

private:
    size_t n_, m_;
    TokenHistory hist_;
    WindowIndex index_;
    std::vector<token_t> key_;
};

}  // namespace ngramcache
