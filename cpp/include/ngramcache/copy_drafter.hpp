// The copy drafter: when the newest tokens repeat an earlier stretch of the sequence, it
// proposes what followed that stretch; otherwise it drafts as llama.cpp's lookup does
// (lookup_drafter.hpp: context cache, then an optional dynamic cache, then an optional
// static source).
//
// The copy: of the earlier places where the last min_match tokens occurred (the newest
// max_candidates of them), the one whose match extends furthest back wins (up to
// max_match tokens; the newest wins ties), and the proposal is what followed it, up to
// the end of the sequence. llama.cpp's lookup picks each drafted token by n-gram counts,
// which in text being copied (code under edit, a quoted passage) often prefers a
// continuation seen more often elsewhere; a copy follows one place.
//
// Work: appending a token indexes one min_match-gram (O(min_match)) and updates the
// context cache; a proposal compares at most max_candidates * max_match tokens, or drafts
// from the caches, whatever the length of the sequence. The sequence and the caches are
// the lookup drafter's, locked as it locks them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "lookup_drafter.hpp"
#include "ngram.hpp"
#include "shared_cache.hpp"
#include "span_index.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

// The options and their defaults, which the binding's keywords take and _core.defaults()
// reports (the package declares the same for its users; the tests compare the two).
struct CopyOptions {
    int ngram_min = LookupDrafter::Defaults::ngram_min;  // the lookup's n-gram sizes
    int ngram_max = LookupDrafter::Defaults::ngram_max;
    size_t min_match = 2;        // a copy needs the last min_match tokens to have occurred before
    size_t max_match = 32;       // matches are compared this far back at most
    size_t max_candidates = 8;   // the newest this many earlier places are compared
};

class CopyDrafter {
public:
    enum Source { lookup = 0, copy = 1 };

    explicit CopyDrafter(const CopyOptions& opt = {}, const SharedCache* dynamic = nullptr,
                         const StaticSource& st = {}, SharedCache* context = nullptr)
        : opt_(opt), lookup_(opt.ngram_min, opt.ngram_max, dynamic, st, context), seq_(lookup_.tokens()) {
        if (opt.min_match < 1 || opt.max_match < opt.min_match)
            throw InputError("need 1 <= min_match <= max_match, got " + std::to_string(opt.min_match) + ", " +
                             std::to_string(opt.max_match));
        if (opt.max_candidates < 1)
            throw InputError("max_candidates must be >= 1, got " + std::to_string(opt.max_candidates));
    }
    CopyDrafter(const CopyDrafter&) = delete;
    CopyDrafter& operator=(const CopyDrafter&) = delete;

    void reset(const token_t* prompt, size_t n) {
        lookup_.reset(prompt, n);
        heads_.clear();
        prev_.clear();
        indexed_ = 0;
        confidence_ = 0;
        source_ = lookup;
        index_new();
    }

    void accept(const token_t* tokens, size_t n) {
        if (n == 0) return;
        lookup_.accept(tokens, n);
        index_new();
    }

    size_t propose(size_t n_max, token_t* out) {
        confidence_ = 0;
        source_ = lookup;
        if (n_max == 0 || seq_.empty()) return 0;
        size_t best_pos = 0, best_len = 0;
        if (find_copy(best_pos, best_len)) {
            const size_t last = seq_.size() - 1;
            const size_t n = std::min(n_max, last - best_pos);
            std::copy(seq_.begin() + static_cast<std::ptrdiff_t>(best_pos + 1),
                      seq_.begin() + static_cast<std::ptrdiff_t>(best_pos + 1 + n), out);
            confidence_ = static_cast<int>(best_len);
            source_ = copy;
            return n;
        }
        const size_t n = lookup_.propose(n_max, out);
        confidence_ = lookup_.confidence();
        return n;
    }

    // The last proposal's confidence for the gate: the copy's match length, or the
    // lookup proposal's length.
    int confidence() const { return confidence_; }
    // Where the last proposal came from (Source: lookup 0, copy 1).
    int source() const { return source_; }

    void set_dynamic(const SharedCache* dynamic) { lookup_.set_dynamic(dynamic); }
    const SharedCache& context() const { return lookup_.context(); }
    const CopyOptions& options() const { return opt_; }
    const TokenBuffer& tokens() const { return seq_; }

    // Every indexed min_match-gram with its positions (each the gram's last token), oldest
    // first; the grams in no particular order (for tests and inspection).
    struct IndexedGram {
        std::vector<token_t> gram;
        std::vector<size_t> positions;
    };
    std::vector<IndexedGram> indexed_grams() const {
        std::vector<IndexedGram> out;
        const size_t m = opt_.min_match;
        heads_.for_each([&](size_t head) {
            IndexedGram g;
            g.gram.assign(seq_.begin() + static_cast<std::ptrdiff_t>(head + 1 - m),
                          seq_.begin() + static_cast<std::ptrdiff_t>(head + 1));
            for (size_t p = head; p != SpanIndex::npos; p = prev_[p]) g.positions.push_back(p);
            std::reverse(g.positions.begin(), g.positions.end());
            out.push_back(std::move(g));
        });
        return out;
    }

private:
    bool same_run(size_t a, size_t b) const {
        for (size_t i = 0; i < opt_.min_match; ++i)
            if (seq_[a - i] != seq_[b - i]) return false;
        return true;
    }

    bool find_copy(size_t& best_pos, size_t& best_len) const {
        const size_t m = opt_.min_match, last = seq_.size() - 1;
        if (last + 1 < m) return false;
        size_t pos = heads_.find(hash_span_ending(seq_.data(), last, m), [&](size_t p) { return same_run(p, last); });
        best_len = 0;
        for (size_t k = 0; k < opt_.max_candidates && pos != SpanIndex::npos; ++k, pos = prev_[pos]) {
            const size_t limit = std::min(opt_.max_match, pos + 1);
            size_t length = m;
            while (length < limit && seq_[pos - length] == seq_[last - length]) ++length;
            if (length > best_len) {
                best_pos = pos;
                best_len = length;
            }
        }
        return best_len > 0;
    }

    // Indexes every position that has gained a successor and ends a min_match-gram.
    void index_new() {
        const size_t m = opt_.min_match, len = seq_.size();
        if (len == 0) return;
        prev_.resize(len - 1, SpanIndex::npos);
        for (size_t i = std::max(indexed_, m - 1); i + 1 < len; ++i) {
            bool inserted = false;
            size_t& head = heads_.find_or_insert(hash_span_ending(seq_.data(), i, m), i,
                                                 [&](size_t p) { return same_run(p, i); }, inserted);
            if (!inserted) {
                prev_[i] = head;
                head = i;
            }
        }
        if (len - 1 > indexed_) indexed_ = len - 1;
    }

    CopyOptions opt_;
    LookupDrafter lookup_;
    const TokenBuffer& seq_;  // the lookup drafter's sequence
    SpanIndex heads_;            // min_match-gram -> its newest indexed position (the gram's last token)
    std::vector<size_t> prev_;   // [pos]: the previous position of the same gram, npos if none
    size_t indexed_ = 0;         // positions before this one are indexed
    int confidence_ = 0;
    int source_ = lookup;
};

}  // namespace ngramcache
