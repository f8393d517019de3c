// llama.cpp's lookup decoding as a drafter of the sequence protocol (drafter_replay.hpp):
// a proposal is draft()'s (draft.hpp) after the sequence so far, from the context cache,
// then an optional dynamic cache, then an optional static source.
//
// The context cache holds the n-grams of the sequence, kept current as tokens arrive: an
// accept adds only the n-grams that end in the new tokens, so a step costs what its new
// tokens and its proposal cost, never the length of the sequence. Each n-gram gains its
// successors in the order of their positions, as in a cache rebuilt from the whole
// sequence, so ties are decided alike (only the order of the keys differs, which drafting
// never reads).
//
// The context cache may be the caller's (a SharedCache the Python layer also reads, to
// save it as a dynamic cache); it is then locked for every update, and the dynamic and
// static caches for every draft, so other threads may read them meanwhile. The copy
// drafter (copy_drafter.hpp) drafts with one of these when it finds no copy.
#pragma once

#include <cstddef>
#include <vector>

#include "draft.hpp"
#include "ngram.hpp"
#include "shared_cache.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

class LookupDrafter {
public:
    // The options' defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr int ngram_min = 1;
        static constexpr int ngram_max = kNgramMax;
    };

    explicit LookupDrafter(int ngram_min = Defaults::ngram_min, int ngram_max = Defaults::ngram_max,
                           const SharedCache* dynamic = nullptr,
                           const StaticSource& st = {}, SharedCache* context = nullptr)
        : ngram_min_(ngram_min), ngram_max_(ngram_max), context_(context != nullptr ? context : &own_context_),
          dynamic_(dynamic), static_(st) {
        NgramCache::check_sizes(ngram_min, ngram_max);
    }
    LookupDrafter(const LookupDrafter&) = delete;
    LookupDrafter& operator=(const LookupDrafter&) = delete;

    void reset(const token_t* prompt, size_t n) {
        seq_.assign(prompt, n);
        confidence_ = 0;
        context_->write([&](NgramCache& c) {
            c.clear();
            if (n > 0) c.update(seq_.data(), n, ngram_min_, ngram_max_, n);
        });
    }

    void accept(const token_t* tokens, size_t n) {
        if (n == 0) return;
        seq_.append(tokens, n);
        context_->write([&](NgramCache& c) { c.update(seq_.data(), seq_.size(), ngram_min_, ngram_max_, n); });
    }

    size_t propose(size_t n_max, token_t* out) {
        confidence_ = 0;
        if (n_max == 0 || seq_.empty()) return 0;
        const size_t n =
            draft_shared(seq_.data(), seq_.size(), n_max, ngram_min_, ngram_max_, *context_, dynamic_, static_, out);
        confidence_ = static_cast<int>(n);
        return n;
    }

    // The last proposal's confidence for the gate: its length.
    int confidence() const { return confidence_; }

    void set_dynamic(const SharedCache* dynamic) { dynamic_ = dynamic; }
    const SharedCache& context() const { return *context_; }
    int ngram_min() const { return ngram_min_; }
    int ngram_max() const { return ngram_max_; }
    const TokenBuffer& tokens() const { return seq_; }

private:
    int ngram_min_, ngram_max_;
    SharedCache own_context_;
    SharedCache* context_;
    const SharedCache* dynamic_;
    StaticSource static_;
    TokenBuffer seq_;
    int confidence_ = 0;
};

}  // namespace ngramcache
