// llama.cpp's common_ngram_cache_draft (docs/llama-lookup.md §3), without its copies.
//
// Deliberate differences from llama.cpp (listed there too):
// - products in 128 bits, so huge counts times huge static counts cannot overflow;
// - an n-gram longer than the sequence is "not found" (the reference reads out of bounds;
//   replay can reproduce what it reads there, see replay.hpp).
// Ties go where llama.cpp's std::unordered_map iteration order sends them: the first of
// the tied tokens in libstdc++'s order for the part's insertion sequence
// (libstdcxx_order.hpp). Most steps have no tie; a tie is detected on the way and only
// then is the order worked out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache.hpp"
#include "libstdcxx_order.hpp"
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
//   void prefetch2(a, b) const            (a hint that find2(a, b) will follow)
struct NoStatic {
    using Ref = const void*;
    Ref find2(token_t, token_t) const { return nullptr; }
    void prefetch2(token_t, token_t) const {}
    int64_t count(Ref, token_t) const { return 0; }
    bool best(Ref, token_t&) const { return false; }
};

// Of the entries for which `is_candidate(entry)` holds, the one llama.cpp's map visits first.
template <class IsCandidate>
inline token_t first_in_llama_order(const Part& p, IsCandidate is_candidate) {
    const size_t i = libstdcxx::first_in_order(
        p.size(), [&](size_t j) { return p[uint32_t(j)].token; },
        [&](size_t j) { return is_candidate(p[uint32_t(j)]); });
    return i < p.size() ? p[uint32_t(i)].token : kTokenNull;
}

// The entry with the highest count, a tie decided by llama.cpp's iteration order. A tie
// needs at least two entries at the maximum, so none is possible when the maximum is more
// than half the sum, nor when it is exactly half and there are more than two entries (the
// others share the other half): then the only entry at the maximum is the answer. Every
// part that passes a percent threshold (50 % or more) is one of those or a two-way tie.
__attribute__((always_inline)) inline token_t best_by_count(const Part& p) {
    const int32_t mx = p.max_count();
    const int64_t twice_max = 2 * int64_t(mx);
    if (twice_max > p.sum() || (twice_max == p.sum() && p.size() > 2)) {
        for (uint32_t i = p.size(); i-- > 0;)
            if (p[i].count == mx) return p[i].token;
    }
    return first_in_llama_order(p, [mx](const Entry& e) { return e.count == mx; });
}

inline bool static_thresholds_pass(int64_t best, int64_t sum) {
    return sum >= kMinSampleLax[1] && 100 * best >= int64_t(kMinPercentLax[1]) * sum;
}

// An NgramCache used as the static cache (what llama.cpp does with a loaded lookup.bin).
struct CacheAsStatic {
    using Ref = const Part*;
    const NgramCache* cache;
    Ref find2(token_t a, token_t b) const { return cache->find(Ngram::of2(a, b)); }
    void prefetch2(token_t a, token_t b) const { cache->prefetch(hash_ngram(Ngram::of2(a, b))); }
    int64_t count(Ref r, token_t t) const { return r->count_of(t); }
    bool best(Ref r, token_t& tok) const {
        if (r == nullptr || !static_thresholds_pass(r->max_count(), r->sum())) return false;
        tok = best_by_count(*r);
        return true;
    }
};

namespace detail {

// The keys of one draft step, n = 1..4 tokens ending at the window's end, hashed once by the
// context cache's probes and used again by the dynamic cache's (which run only when the
// context cache drafted nothing, so after every key of the step was hashed).
struct StepKeys {
    Ngram key[kNgramMax];
    uint64_t hash[kNgramMax];
};

// The static part of the step's last 2-gram, looked up when first needed: by then the
// probes of the context cache have run while its bucket was on its way (prefetch2).
template <class Static>
class StaticPart {
public:
    using Ref = typename Static::Ref;
    StaticPart(const Static& st, token_t a, token_t b) : st_(st), a_(a), b_(b) { st.prefetch2(a, b); }
    Ref get() {
        if (!found_) {
            ref_ = st_.find2(a_, b_);
            found_ = true;
        }
        return ref_;
    }

private:
    const Static& st_;
    token_t a_, b_;
    bool found_ = false;
    Ref ref_{};
};

// try_draft of llama.cpp for one cache: longest n-gram first, first that passes wins.
// With `hash_keys` (the context cache's call) each key is hashed into `keys` as it is
// probed, and its slot in `next` (the dynamic cache, if any) starts loading, so that those
// misses overlap the probes here; without it (the dynamic cache's call) `keys` is read.
template <class Static>
inline bool try_primary(const NgramCache& cache, const token_t* window, int window_len,
                        int ngram_min, int ngram_max, const Static& st,
                        StaticPart<Static>& static_part, StepKeys& keys, bool hash_keys,
                        const NgramCache* next, const int* min_sample, const int* min_percent,
                        token_t& out, int& out_size) {
    for (int n = ngram_max; n >= ngram_min; --n) {
        if (n > window_len) continue;  // longer than the sequence: not found
        if (hash_keys) {
            keys.key[n - 1] = Ngram(window + window_len - n, n);
            keys.hash[n - 1] = hash_ngram(keys.key[n - 1]);
            if (next != nullptr) next->prefetch(keys.hash[n - 1]);
        }
        const Part* part = cache.find(keys.key[n - 1], keys.hash[n - 1]);
        if (part == nullptr) continue;
        const int i = n - ngram_min;
        const int64_t sum = part->sum();
        // Early exits: the sample size needs no candidate, and the percent test can only
        // fail harder with the best-scored token's count than with the maximum count.
        if (sum < min_sample[i]) continue;
        if (100 * int64_t(part->max_count()) < int64_t(min_percent[i]) * sum) continue;
        const typename Static::Ref part_static = static_part.get();
        if (part_static == nullptr) {
            // Without static weights the score is the count itself.
            out = best_by_count(*part);
            out_size = n;
            return true;
        }
        token_t best_tok = kTokenNull;
        // A count (< 2^31) times 100 times a static count (< 2^32) needs 71 bits.
        __extension__ typedef unsigned __int128 score_t;
        int64_t best_cnt = 0;
        score_t best_score = 0;
        auto score_of = [&](const Entry& e) {
            const int64_t sc = st.count(part_static, e.token);
            return score_t(uint64_t(e.count)) * uint64_t(sc > 0 ? 100 * sc : 1);
        };
        bool tie = false;
        for (uint32_t j = 0; j < part->size(); ++j) {
            const Entry& e = (*part)[j];
            const score_t score = score_of(e);
            if (score > best_score) {
                best_tok = e.token;
                best_cnt = e.count;
                best_score = score;
                tie = false;
            } else if (score == best_score) {
                tie = true;
            }
        }
        if (tie) {
            best_tok = first_in_llama_order(*part, [&](const Entry& e) { return score_of(e) == best_score; });
            best_cnt = part->count_of(best_tok);
        }
        if (100 * best_cnt < int64_t(min_percent[i]) * sum) continue;
        out = best_tok;
        out_size = n;
        return true;
    }
    return false;
}

}  // namespace detail

// What llama.cpp reads before the start of a 2- or 3-token sequence, where its keys of 3
// and 4 tokens reach out of bounds (docs/parity.md §2): get_token() indexes its `draft`
// vector at -n_inp and -n_inp-1, inside glibc's malloc header of that 32-byte buffer
// (x86-64, arm64). The defaults are what that header usually holds: its size word 33 (32
// with the in-use bit of the chunk before it) right before a 2-token sequence, and 0 (the
// upper half of the prev_size word) before that and right before a 3-token sequence. What a
// given run reads depends on its heap (docs/parity.md): 32 when the chunk before is free,
// and the last bytes of that chunk's data in the prev_size word when it is in use.
struct LlamaOobReads {
    token_t before2[2] = {0, 33};  // S[-2], S[-1] before a 2-token sequence
    // S[-1] there once one token is drafted: the draft vector grew into a new buffer,
    // whose header is read instead
    token_t before2_grown = 33;
    token_t before3 = 0;           // S[-1] before a 3-token sequence
};

// One LlamaOobReads per row of `rows` (n_rows rows of 4 tokens: S[-2] and S[-1] before a
// 2-token sequence, S[-1] there once grown, S[-1] before a 3-token sequence), as a caller
// that measured or chose them per chunk passes them.
inline std::vector<LlamaOobReads> oob_reads_from_rows(const token_t* rows, size_t n_rows) {
    std::vector<LlamaOobReads> out(n_rows);
    for (LlamaOobReads& r : out) {
        r.before2[0] = rows[0];
        r.before2[1] = rows[1];
        r.before2_grown = rows[2];
        r.before3 = rows[3];
        rows += 4;
    }
    return out;
}

// Drafts up to n_draft tokens after inp[0..n_inp-1] (its last token is the newest one,
// llama.cpp's draft[0]). Writes them to `out` and returns how many; `steps`, if given,
// receives where each drafted token came from. `oob`: keys that reach before the start
// read those tokens, as llama.cpp's build does (nullptr: such keys are not found).
template <class Static>
inline size_t draft(const token_t* inp, size_t n_inp, size_t n_draft, int ngram_min, int ngram_max,
                    const NgramCache& context, const NgramCache* dynamic, const Static& st,
                    token_t* out, DraftStep* steps = nullptr, const LlamaOobReads* oob = nullptr) {
    NgramCache::check_sizes(ngram_min, ngram_max);
    if (n_inp < static_cast<size_t>(kNgramStatic)) return 0;
    // The last kNgramMax tokens of the virtual sequence inp ++ out.
    token_t window[kNgramMax];
    int window_len = n_inp < size_t(kNgramMax) ? int(n_inp) : kNgramMax;
    for (int i = 0; i < window_len; ++i) window[i] = inp[n_inp - window_len + i];
    const bool reads_before_2 = oob != nullptr && n_inp == 2;
    if (oob != nullptr && window_len < kNgramMax) {
        if (n_inp == 2) {
            window[2] = inp[0], window[3] = inp[1];
            window[0] = oob->before2[0], window[1] = oob->before2[1];
        } else {  // n_inp == 3
            window[1] = inp[0], window[2] = inp[1], window[3] = inp[2];
            window[0] = oob->before3;
        }
        window_len = kNgramMax;
    }

    size_t n = 0;
    detail::StepKeys keys;
    while (n < n_draft) {
        // The static bucket is requested now and read once the context cache's probes ran.
        detail::StaticPart<Static> static_part(st, window[window_len - 2], window[window_len - 1]);
        token_t tok = kTokenNull;
        int size = 0;
        DraftSource src = DraftSource::context;
        if (!detail::try_primary(context, window, window_len, ngram_min, ngram_max, st, static_part, keys,
                                 true, dynamic, kMinSampleLax, kMinPercentLax, tok, size)) {
            src = DraftSource::dynamic;
            if (dynamic == nullptr ||
                !detail::try_primary(*dynamic, window, window_len, ngram_min, ngram_max, st, static_part,
                                     keys, false, nullptr, kMinSampleStrict, kMinPercentStrict, tok, size)) {
                src = DraftSource::statik;
                size = kNgramStatic;
                if (!st.best(static_part.get(), tok)) break;
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
            if (reads_before_2 && n == 1) window[0] = oob->before2_grown;
        }
    }
    return n;
}

}  // namespace ngramcache
