// llama.cpp's ngram-mod drafter (PR #19164, common/ngram-mod.* and its impl in
// common/speculative.cpp; docs/speculative.md), with the same drafts.
//
// NgramModTable is common_ngram_mod: a fixed array of int32 slots (default 4,194,304 =
// 16 MiB), slot = polynomial hash of the n-gram mod size, holding the token that
// followed it last (last writer wins, no key stored, -1 = empty). One table is meant to
// be shared by many drafters (server slots, requests, threads).
//
// Thread safety: every slot is a std::atomic<int32_t> accessed with relaxed ordering, the
// fill counter and the reset counter are relaxed atomics too. So concurrent add, get and
// reset from any number of threads are free of data races (no undefined behaviour, no
// torn values: a get returns -1 or a token some add stored). Relaxed is enough because
// a slot publishes nothing but its own value; what a concurrent reader sees is some
// interleaving of the writes, as with llama-server's slots taking turns. A lock was not
// used: a draft reads up to n_max slots, and a lock (or a reader-writer lock) around
// each would cost more than the lookup and serialise the readers. Under concurrent
// resets `used` can drift from the true count by the adds that raced with the reset; it
// only decides when begin()'s 25 % rule clears the table.
//
// The drafter's hashing rolls: a window's hash is Horner's rule over its n tokens mod
// 2^64, so the next window's hash is one multiply-add from the previous one, and a step
// costs O(n_match + n_max) whatever the context.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ngram_simple.hpp"  // check_spec_size
#include "ngram_window_index.hpp"

namespace ngramcache {

class NgramModTable {
public:
    static constexpr size_t kDefaultSize = 4 * 1024 * 1024;
    static constexpr int32_t kEmpty = -1;
    static constexpr uint64_t kMul = 6364136223846793005ull;
    static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "a slot is 4 bytes");

    explicit NgramModTable(size_t size = kDefaultSize) : size_(size) {
        if (size < 1 || size > (size_t(1) << 32))
            throw InputError("an ngram-mod table has 1 to 2^32 entries, got " + std::to_string(size));
        entries_.reset(new std::atomic<int32_t>[size]);
        for (size_t i = 0; i < size_; ++i) entries_[i].store(kEmpty, std::memory_order_relaxed);
    }
    NgramModTable(const NgramModTable&) = delete;
    NgramModTable& operator=(const NgramModTable&) = delete;

    size_t size() const { return size_; }
    size_t nbytes() const { return size_ * sizeof(int32_t); }
    size_t used() const { return used_.load(std::memory_order_relaxed); }
    uint64_t resets() const { return resets_.load(std::memory_order_relaxed); }

    static uint64_t hash(const token_t* t, size_t n) {
        uint64_t r = 0;
        for (size_t i = 0; i < n; ++i) r = r * kMul + static_cast<uint64_t>(static_cast<int64_t>(t[i]));
        return r;
    }
    size_t slot_of(uint64_t h) const { return static_cast<size_t>(h % size_); }

    // t[0..n-1] -> t[n]
    void add(const token_t* t, size_t n) { add_hashed(hash(t, n), t[n]); }
    int32_t get(const token_t* t, size_t n) const { return get_hashed(hash(t, n)); }

    void add_hashed(uint64_t h, token_t next) {
        if (entries_[slot_of(h)].exchange(next, std::memory_order_relaxed) == kEmpty)
            used_.fetch_add(1, std::memory_order_relaxed);
    }
    int32_t get_hashed(uint64_t h) const { return entries_[slot_of(h)].load(std::memory_order_relaxed); }

    void reset() {
        for (size_t i = 0; i < size_; ++i) entries_[i].store(kEmpty, std::memory_order_relaxed);
        used_.store(0, std::memory_order_relaxed);
        resets_.fetch_add(1, std::memory_order_relaxed);
    }

    // Every slot, for saving (each read is atomic; a writer meanwhile may or may not be seen).
    void export_entries(int32_t* out) const {
        for (size_t i = 0; i < size_; ++i) out[i] = entries_[i].load(std::memory_order_relaxed);
    }
    // Every slot from a saved table of the same size; slots < -1 are not tokens.
    void import_entries(const int32_t* in) {
        size_t used = 0;
        for (size_t i = 0; i < size_; ++i)
            if (in[i] < kEmpty) throw InputError("slot " + std::to_string(i) + " holds " + std::to_string(in[i]));
        for (size_t i = 0; i < size_; ++i) {
            entries_[i].store(in[i], std::memory_order_relaxed);
            used += in[i] != kEmpty;
        }
        used_.store(used, std::memory_order_relaxed);
    }

private:
    size_t size_;
    std::unique_ptr<std::atomic<int32_t>[]> entries_;
    std::atomic<size_t> used_{0};
    std::atomic<uint64_t> resets_{0};
};

class NgramMod {
public:
    // table: shared with other drafters; nullptr: a private table of the default size.
    // The options' (llama.cpp's) defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr size_t n_match = 24;
        static constexpr size_t n_min = 48;
        static constexpr size_t n_max = 64;
    };

    explicit NgramMod(std::shared_ptr<NgramModTable> table = nullptr, size_t n_match = Defaults::n_match,
                      size_t n_min = Defaults::n_min, size_t n_max = Defaults::n_max)
        : n_(check_spec_size("n_match", n_match)), n_min_(check_spec_size("n_min", n_min, 0)),
          n_max_(check_spec_size("n_max", n_max, 0)),
          table_(table ? std::move(table) : std::make_shared<NgramModTable>()) {
        pow_ = 1;
        for (size_t i = 1; i < n_; ++i) pow_ *= NgramModTable::kMul;
    }

    size_t n_match() const { return n_; }
    size_t n_min() const { return n_min_; }
    size_t n_max() const { return n_max_; }
    size_t key_size() const { return n_; }
    const std::shared_ptr<NgramModTable>& table() const { return table_; }
    const TokenHistory& history() const { return hist_; }
    size_t i_last() const { return i_last_; }
    size_t n_low() const { return n_low_; }

    void sync(const token_t* p, size_t n) { hist_.sync(p, n); }
    void append(const token_t* p, size_t n) { hist_.append(p, n); }
    // The token after the history, kept with it unread (TokenHistory::push_next).
    void push_next(token_t t) { hist_.push_next(t); }

    void begin(const token_t* p, size_t n) {
        sync(p, n);
        begin();
    }

    // With the history as the prompt. n_low is not reset here (as llama.cpp).
    void begin() {
        i_last_ = 0;
        n_draft_last_ = 0;
        const size_t len = hist_.size();
        if (len < n_) return;
        index(0, len - n_);
        i_last_ = len - n_;
        if (static_cast<double>(table_->used()) / static_cast<double>(table_->size()) > 0.25) table_->reset();
    }

    void draft(const token_t* prompt, size_t n, token_t id_last, std::vector<token_t>& out) {
        sync(prompt, n);
        draft(id_last, out);
    }

    void draft(token_t id_last, std::vector<token_t>& out) {
        out.clear();
        n_draft_last_ = 0;
        const size_t cur = hist_.size();
        if (cur < n_) return;
        if (i_last_ + 32 < cur) {  // new context is indexed in batches
            index(i_last_, cur - n_);
            i_last_ = cur - n_;
        }
        const token_t* seq = hist_.data();
        win_.assign(seq + cur - n_ + 1, seq + cur);
        win_.push_back(id_last);
        uint64_t h = NgramModTable::hash(win_.data(), n_);
        for (size_t i = 0; i < n_max_; ++i) {
            const int32_t tok = table_->get_hashed(h);
            if (tok == NgramModTable::kEmpty) {
                if (i < n_min_) {
                    out.clear();
                    return;
                }
                break;
            }
            out.push_back(tok);
            win_.push_back(tok);
            h = roll(h, win_[i], tok);
        }
        n_draft_last_ = out.size();
    }

    void accept(size_t n_accepted) {
        if (n_draft_last_ == 0) return;
        if (4 * static_cast<uint64_t>(n_accepted) < n_draft_last_) {  // n_accepted / n_draft < 0.25, exactly
            if (++n_low_ >= 5) {
                table_->reset();
                n_low_ = 0;
                i_last_ = 0;
            }
        } else {
            n_low_ = 0;
        }
    }

private:
    uint64_t roll(uint64_t h, token_t out, token_t in) const {
        return (h - pow_ * static_cast<uint64_t>(static_cast<int64_t>(out))) * NgramModTable::kMul +
               static_cast<uint64_t>(static_cast<int64_t>(in));
    }

    // add(seq[i .. i+n]) for i in [from, to)
    void index(size_t from, size_t to) {
        if (from >= to) return;
        const token_t* seq = hist_.data();
        uint64_t h = NgramModTable::hash(seq + from, n_);
        for (size_t i = from;; ++i) {
            table_->add_hashed(h, seq[i + n_]);
            if (i + 1 == to) break;
            h = roll(h, seq[i], seq[i + n_]);
        }
    }

    size_t n_, n_min_, n_max_;
    std::shared_ptr<NgramModTable> table_;
    uint64_t pow_;
    TokenHistory hist_;
    size_t i_last_ = 0;
    size_t n_draft_last_ = 0;
    size_t n_low_ = 0;
    std::vector<token_t> win_;
};

}  // namespace ngramcache
