// Plain prompt lookup decoding, as Hugging Face's PromptLookupCandidateGenerator,
// llama-cpp-python's LlamaPromptLookupDecoding and vLLM's n-gram proposer do it: for an
// n-gram size from max_ngram down to min_ngram, find an earlier occurrence of the last
// `size` tokens and propose the (up to n_max) tokens that followed it.
//
// The peers' edge cases, kept exactly:
// - an occurrence is any place other than the suffix itself, so it may overlap the suffix
//   (in "a a a" the 2-gram "a a" occurs at 0, overlapping the suffix at 1);
// - the continuation stops at the end of the sequence (it may be shorter than n_max,
//   and may run into the suffix);
// - the longest size with an occurrence wins; among its occurrences Match::first takes
//   the earliest (the peers' choice), Match::recent the newest.
//
// The peers rescan the whole sequence for every proposal. Here an index per n-gram size
// holds, for every n-gram that has a successor, its earliest (or newest) end: appending a
// token costs O(max_ngram) hashing plus the key comparisons, a proposal O(max_ngram^2 + k)
// whatever the length of the sequence.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "ngram.hpp"
#include "span_index.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

class PromptLookupDrafter {
public:
    enum class Match { first, recent };
    static constexpr int kMaxNgram = 64;

    // The options' defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr int max_ngram = 3;
        static constexpr int min_ngram = 1;
        static constexpr bool recent = false;  // Match::first
    };

    explicit PromptLookupDrafter(int max_ngram = Defaults::max_ngram, int min_ngram = Defaults::min_ngram,
                                 Match match = Defaults::recent ? Match::recent : Match::first)
        : max_ngram_(max_ngram), min_ngram_(min_ngram), match_(match) {
        if (min_ngram < 1 || max_ngram < min_ngram || max_ngram > kMaxNgram)
            throw InputError("need 1 <= min_ngram <= max_ngram <= " + std::to_string(kMaxNgram) + ", got " +
                             std::to_string(min_ngram) + ", " + std::to_string(max_ngram));
        tables_.resize(static_cast<size_t>(max_ngram - min_ngram + 1));
    }

    void reset(const token_t* prompt, size_t n) {
        seq_.assign(prompt, n);
        for (SpanIndex& t : tables_) t.clear();
        indexed_ = 0;
        confidence_ = 0;
        index_new();
    }

    void accept(const token_t* tokens, size_t n) {
        seq_.append(tokens, n);
        index_new();
    }

    size_t propose(size_t n_max, token_t* out) {
        confidence_ = 0;
        const size_t len = seq_.size();
        if (n_max == 0 || len < 2) return 0;
        const size_t last = len - 1;
        const size_t top = std::min(static_cast<size_t>(max_ngram_), last);  // an n-gram needs a place before
        if (top < static_cast<size_t>(min_ngram_)) return 0;
        uint64_t hashes[kMaxNgram + 1];
        SpanHash h;
        for (size_t s = 1; s <= top; ++s) {
            h.push_front(seq_[last + 1 - s]);
            hashes[s] = h.value();
        }
        for (size_t s = top; s >= static_cast<size_t>(min_ngram_); --s) {
            const size_t end = table(s).find(hashes[s], [&](size_t e) { return same_run(e, last, s); });
            if (end == SpanIndex::npos) continue;
            const size_t n = std::min(n_max, last - end);
            std::copy(seq_.begin() + static_cast<std::ptrdiff_t>(end + 1),
                      seq_.begin() + static_cast<std::ptrdiff_t>(end + 1 + n), out);
            confidence_ = static_cast<int>(s);
            return n;
        }
        return 0;
    }

    // The size of the n-gram the last proposal matched (0: none).
    int confidence() const { return confidence_; }

    size_t size() const { return seq_.size(); }
    const TokenBuffer& tokens() const { return seq_; }
    int max_ngram() const { return max_ngram_; }
    int min_ngram() const { return min_ngram_; }
    Match match() const { return match_; }

private:
    SpanIndex& table(size_t s) { return tables_[s - static_cast<size_t>(min_ngram_)]; }

    bool same_run(size_t a, size_t b, size_t n) const {
        for (size_t i = 0; i < n; ++i)
            if (seq_[a - i] != seq_[b - i]) return false;
        return true;
    }

    // Indexes the n-grams ending at every position that has gained a successor.
    void index_new() {
        const size_t len = seq_.size();
        for (size_t end = indexed_; end + 1 < len; ++end) {
            const size_t top = std::min(static_cast<size_t>(max_ngram_), end + 1);
            SpanHash h;
            for (size_t s = 1; s <= top; ++s) {
                h.push_front(seq_[end + 1 - s]);
                if (s < static_cast<size_t>(min_ngram_)) continue;
                bool inserted = false;
                size_t& at = table(s).find_or_insert(h.value(), end, [&](size_t e) { return same_run(e, end, s); },
                                                     inserted);
                if (!inserted && match_ == Match::recent) at = end;
            }
        }
        if (len > 0 && len - 1 > indexed_) indexed_ = len - 1;
    }

    int max_ngram_, min_ngram_;
    Match match_;
    TokenBuffer seq_;
    std::vector<SpanIndex> tables_;  // [size - min_ngram]: n-gram -> the position of its last token
    size_t indexed_ = 0;             // n-grams ending before this position are indexed
    int confidence_ = 0;
};

}  // namespace ngramcache
