// llama.cpp's common_ngram_cache_draft (spec §1.3), without its copies.
//
// Deliberate differences from the reference (design.md §3):
// - products in 128 bits, so huge counts times huge static counts cannot overflow;
// - an n-gram longer than the sequence is "not found" (the reference reads out of bounds);
// - ties go to the candidate first seen latest. Parts are scanned newest-first with a
//   strict '>', which is what libstdc++'s iteration order gives llama.cpp for the usual
//   two-candidate tie (and for every tie in the public vectors).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cache.hpp"
#include "ngram.hpp"

namespace ngramcache {

// Threshold tables, indexed by ngram_size - ngram_min (as in llama.cpp).
constexpr int kMinSampleLax[kNgramMax] = {2, 2, 1, 1};
constexpr int kMinPercentLax[kNgramMax] = {66, 50, 50, 50};
constexpr int kMinSampleStrict[kNgramMax] = {4, 3, 2, 2};
constexpr int kMinPercentStrict[kNgramMax] = {75, 66, 66, 66};

// Where a drafted token came from (replay statistics break acceptance down by it).
enum class DraftSource : uint8_t { context = 0, dynamic = 1, statik = 2 };

struct DraftStep {
    DraftSource source;
    uint8_t ngram_size;
};

// A static source seen through what drafting needs from it. `Ref` is a cheap handle to
// the part of one 2-gram key (null when the key is absent).
//   Ref find2(a, b) const
//   int64_t count(Ref, token) const       (0 if the token never followed the key)
//   bool best(Ref, token_t& tok) const    (llama.cpp's try_static: thresholds + tie rule)
struct NoStatic {
    using Ref = const void*;
    Ref find2(token_t, token_t) const { return nullptr; }
    int64_t count(Ref, token_t) const { return 0; }
    bool best(Ref, token_t&) const { return false; }
};

// The newest entry with the highest count: the tie rule applied to a plain count ranking.
inline token_t newest_with_max(const Part& p) {
    for (uint32_t i = p.size(); i-- > 0;)
        if (p[i].count == p.max_count()) return p[i].token;
    return kTokenNull;
}

inline bool static_thresholds_pass(int64_t best, int64_t sum) {
    return sum >= kMinSampleLax[1] && 100 * best >= int64_t(kMinPercentLax[1]) * sum;
}

// An NgramCache used as the static cache (what llama.cpp does with a loaded lookup.bin).
struct CacheAsStatic {
    using Ref = const Part*;
    const NgramCache* cache;
    Ref find2(token_t a, token_t b) const { return cache->find(Ngram::of2(a, b)); }
    int64_t count(Ref r, token_t t) const { return r->count_of(t); }
    bool best(Ref r, token_t& tok) const {
        if (r == nullptr || !static_thresholds_pass(r->max_count(), r->sum())) return false;
        tok = newest_with_max(*r);
        return true;
    }
};

namespace detail {

// try_draft of llama.cpp for one cache: longest n-gram first, first that passes wins.
template <class Static>
inline bool try_primary(const NgramCache& cache, const token_t* window, int window_len,
                        int ngram_min, int ngram_max, const Static& st,
                        typename Static::Ref part_static, const int* min_sample,
                        const int* min_percent, token_t& out, int& out_size) {
    for (int n = ngram_max; n >= ngram_min; --n) {
        if (n > window_len) continue;  // longer than the sequence: not found
        const Part* part = cache.find(Ngram(window + window_len - n, n));
        if (part == nullptr) continue;
        const int i = n - ngram_min;
        const int64_t sum = part->sum();
        // Early exits: the sample size needs no candidate, and the percent test can only
        // fail harder with the best-scored token's count than with the maximum count.
        if (sum < min_sample[i]) continue;
        if (100 * int64_t(part->max_count()) < int64_t(min_percent[i]) * sum) continue;
        if (part_static == nullptr) {
            // Without static weights the score is the count itself.
            out = newest_with_max(*part);
            out_size = n;
            return true;
        }
        token_t best_tok = kTokenNull;
        // A count (< 2^31) times 100 times a static count (< 2^32) needs 71 bits.
        __extension__ typedef unsigned __int128 score_t;
        int64_t best_cnt = 0;
        score_t best_score = 0;
        for (uint32_t j = part->size(); j-- > 0;) {
            const Entry& e = (*part)[j];
            const int64_t sc = st.count(part_static, e.token);
            const score_t score = score_t(uint64_t(e.count)) * uint64_t(sc > 0 ? 100 * sc : 1);
            if (score > best_score) {
                best_tok = e.token;
                best_cnt = e.count;
                best_score = score;
            }
        }
        if (100 * best_cnt < int64_t(min_percent[i]) * sum) continue;
        out = best_tok;
        out_size = n;
        return true;
    }
    return false;
}

}  // namespace detail

// Drafts up to n_draft tokens after inp[0..n_inp-1] (its last token is the newest one,
// llama.cpp's draft[0]). Writes them to `out` and returns how many; `steps`, if given,
// receives where each drafted token came from.
template <class Static>
inline size_t draft(const token_t* inp, size_t n_inp, size_t n_draft, int ngram_min, int ngram_max,
                    const NgramCache& context, const NgramCache* dynamic, const Static& st,
                    token_t* out, DraftStep* steps = nullptr) {
    NgramCache::check_sizes(ngram_min, ngram_max);
    if (n_inp < static_cast<size_t>(kNgramStatic)) return 0;
    // The last kNgramMax tokens of the virtual sequence inp ++ out.
    token_t window[kNgramMax];
    int window_len = n_inp < size_t(kNgramMax) ? int(n_inp) : kNgramMax;
    for (int i = 0; i < window_len; ++i) window[i] = inp[n_inp - window_len + i];

    size_t n = 0;
    while (n < n_draft) {
        const auto part_static = st.find2(window[window_len - 2], window[window_len - 1]);
        token_t tok = kTokenNull;
        int size = 0;
        DraftSource src = DraftSource::context;
        if (!detail::try_primary(context, window, window_len, ngram_min, ngram_max, st, part_static,
                                 kMinSampleLax, kMinPercentLax, tok, size)) {
            src = DraftSource::dynamic;
            if (dynamic == nullptr ||
                !detail::try_primary(*dynamic, window, window_len, ngram_min, ngram_max, st,
                                     part_static, kMinSampleStrict, kMinPercentStrict, tok, size)) {
                src = DraftSource::statik;
                size = kNgramStatic;
                if (!st.best(part_static, tok)) break;
            }
        }
        out[n] = tok;
        if (steps != nullptr) steps[n] = DraftStep{src, static_cast<uint8_t>(size)};
        ++n;
        if (window_len < kNgramMax) {
            window[window_len++] = tok;
        } else {
            for (int i = 0; i + 1 < kNgramMax; ++i) window[i] = window[i + 1];
            window[kNgramMax - 1] = tok;
        }
    }
    return n;
}

}  // namespace ngramcache
