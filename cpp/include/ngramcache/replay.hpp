// llama-lookup-stats' replay loop (docs/llama-lookup.md §5.1), plus the figures users asked for beyond it.
//
// The text is cut into chunks of n_ctx tokens; the final chunk is skipped when it does not
// leave a token over (strict '<', as llama.cpp, so an exactly-fitting last chunk is skipped
// too). Each chunk starts from its first token with an empty context cache; every step
// drafts up to n_draft tokens, accepts the drafted tokens that match the text, then
// appends the next text token (the "sampled" one). Accepted and sampled tokens update the
// context cache one at a time; after the chunk the context cache is merged into the
// dynamic cache and cleared. t_draft times exactly what llama.cpp times: each draft call
// and each context update, nothing else.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache.hpp"
#include "draft.hpp"
#include "ngram.hpp"

namespace ngramcache {

constexpr int kNumSources = 3;                // DraftSource: context, dynamic, static
constexpr size_t kMaxReplayDraft = 1 << 16;   // bounds the per-position arrays
constexpr int64_t kProgressEvery = 100000;    // tokens between progress callbacks

class GatedSteps;

struct ReplayOptions {
    size_t n_ctx = 4096;
    size_t n_draft = 3;
    // Keys reaching before a chunk's start read what llama.cpp reads there (draft.hpp):
    // oob_reads[c] before chunk c, the defaults of LlamaOobReads past its end.
    bool llama_oob = false;
    std::vector<LlamaOobReads> oob_reads;
    // Whether the dynamic cache's keys must end in llama.cpp's order (it is given back to
    // the caller); false for a private copy, whose order no draft depends on.
    bool dynamic_key_order = true;
    // replay_drafter() only: a gate that decides how many of each proposal are verified
    // (gate.hpp); null: all of it.
    GatedSteps* gate = nullptr;
    // replay_drafter() only: the tokens each chunk starts from (its prompt: the drafter is
    // reset with them, and the steps replay the rest), 1 to n_ctx - 1.
    size_t n_prompt = 1;
};

// What every replay loop counts: replay() here and replay_drafter() in drafter_replay.hpp.
struct ReplayCounts {
    int64_t n_input = 0;
    int64_t n_ctx = 0;
    int64_t n_draft = 0;
    int64_t n_chunks = 0;       // chunks replayed
    int64_t n_steps = 0;        // draft (propose) calls
    int64_t n_drafted = 0;
    int64_t n_accept = 0;
    int64_t t_draft_ns = 0;     // draft calls + context updates (propose + accept), as llama.cpp times them
    int64_t t_replay_ns = 0;    // the whole loop, merges included (overlap pass excluded)
    std::vector<int64_t> draft_length_hist;    // [k]: draft calls that drafted k tokens
    std::vector<int64_t> accept_length_hist;   // [k]: non-empty drafts with k tokens accepted
    std::vector<int64_t> drafted_by_position;  // [i]: drafts that reached position i
    std::vector<int64_t> accepted_by_position; // [i]: drafts whose token i was accepted
};

// replay()'s counts: those of every loop, by source and n-gram size, and the overlap.
struct ReplayResult : ReplayCounts {
    int64_t drafted_by_source[kNumSources] = {0, 0, 0};
    int64_t accepted_by_source[kNumSources] = {0, 0, 0};
    int64_t drafted_by_ngram[kNgramMax] = {0, 0, 0, 0};   // index = n-gram size - 1
    int64_t accepted_by_ngram[kNgramMax] = {0, 0, 0, 0};
    // Overlap (docs/cli.md): predicted positions p of the replayed text (every token but
    // the first two) and how many had their preceding 2-gram t[p-2] t[p-1] already seen.
    int64_t overlap_positions = 0;
    int64_t overlap_text = 0;     // the 2-gram occurred earlier in the replayed text
    int64_t overlap_static = 0;   // it is a key of the static cache
    int64_t overlap_dynamic = 0;  // it is a key of the dynamic cache as given
    int64_t overlap_any = 0;      // any of the three
};

// Called with (tokens replayed so far, tokens that will be replayed). May throw to stop.
using ReplayProgress = std::function<void(int64_t, int64_t)>;

namespace detail {

// A set of 2-grams, flat open addressing; the overlap pass inserts every position once.
class PairSet {
public:
    explicit PairSet(size_t expected) {
        size_t n = 64;
        while (n < 2 * expected) n *= 2;
        slots_.assign(n, kEmpty);
        mask_ = n - 1;
    }
    // Inserts (a, b); returns true if it was already present.
    bool insert(token_t a, token_t b) {
        const uint64_t k = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
        uint64_t h = k * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        for (size_t s = h & mask_;; s = (s + 1) & mask_) {
            if (slots_[s] == k) return true;
            if (slots_[s] == kEmpty) {
                slots_[s] = k;
                return false;
            }
        }
    }

private:
    // Token ids are >= 0, so a pair never has the top bit set.
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    std::vector<uint64_t> slots_;
    size_t mask_ = 0;
};

template <class Static>
void count_overlap(const token_t* inp, size_t n, const NgramCache& dynamic, const Static& st,
                   ReplayResult& r) {
    if (n < 3) return;
    PairSet seen(n);
    for (size_t p = 2; p < n; ++p) {
        const token_t a = inp[p - 2], b = inp[p - 1];
        const bool in_text = seen.insert(a, b);
        const bool in_static = st.find2(a, b) != nullptr;
        const bool in_dynamic = dynamic.find(Ngram::of2(a, b)) != nullptr;
        ++r.overlap_positions;
        r.overlap_text += in_text;
        r.overlap_static += in_static;
        r.overlap_dynamic += in_dynamic;
        r.overlap_any += (in_text || in_static || in_dynamic);
    }
}

inline int64_t elapsed_ns(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
        .count();
}

// What every replay loop (replay() here, replay_drafter() in drafter_replay.hpp) checks
// before it starts, and the counters it starts from: the sizes the options give, the
// per-length and per-position arrays at zero. Result derives from ReplayCounts.
template <class Result>
Result start_replay(size_t n_input, const ReplayOptions& opt) {
    if (opt.n_ctx < 2) throw InputError("n_ctx must be >= 2, got " + std::to_string(opt.n_ctx));
    if (opt.n_draft > kMaxReplayDraft)
        throw InputError("n_draft must be <= " + std::to_string(kMaxReplayDraft) + ", got " +
                         std::to_string(opt.n_draft));
    Result r;
    r.n_input = static_cast<int64_t>(n_input);
    r.n_ctx = static_cast<int64_t>(opt.n_ctx);
    r.n_draft = static_cast<int64_t>(opt.n_draft);
    r.draft_length_hist.assign(opt.n_draft + 1, 0);
    r.accept_length_hist.assign(opt.n_draft + 1, 0);
    r.drafted_by_position.assign(opt.n_draft, 0);
    r.accepted_by_position.assign(opt.n_draft, 0);
    return r;
}

}  // namespace detail

// Replays inp[0..n_input-1]. `dynamic` is the cache the chunks are merged into: the caller
// passes a copy when the original must stay as it was. `dynamic` as given (before the first
// merge) is what the overlap figures compare against.
template <class Static>
ReplayResult replay(const token_t* inp, size_t n_input, const ReplayOptions& opt, NgramCache& dynamic,
                    const Static& st, const ReplayProgress& progress = nullptr) {
    using clock = std::chrono::steady_clock;
    ReplayResult r = detail::start_replay<ReplayResult>(n_input, opt);
    const size_t n_ctx = opt.n_ctx, n_draft = opt.n_draft;

    const size_t n_chunks = n_input > n_ctx ? (n_input - 1) / n_ctx : 0;  // i_start + n_ctx < n_input
    const int64_t total = static_cast<int64_t>(n_chunks * n_ctx);
    detail::count_overlap(inp, n_chunks * n_ctx, dynamic, st, r);

    NgramCache context;
    // Capped, so that a huge n_ctx does not zero a table far larger than the text needs.
    const size_t context_keys = kNgramMax * std::min<size_t>(n_ctx, size_t(1) << 16);
    if (n_chunks > 0) context.reserve(context_keys);
    std::vector<token_t> out;
    out.reserve(n_ctx);
    std::vector<token_t> drafted(n_draft + 1);
    std::vector<DraftStep> steps(n_draft + 1);
    int64_t next_report = kProgressEvery;

    const LlamaOobReads default_oob;
    const auto t_loop = clock::now();
    for (size_t c = 0; c < n_chunks; ++c) {
        const token_t* slice = inp + c * n_ctx;
        const int64_t done_before = static_cast<int64_t>(c * n_ctx);
        const LlamaOobReads* oob =
            !opt.llama_oob ? nullptr : c < opt.oob_reads.size() ? &opt.oob_reads[c] : &default_oob;
        out.clear();
        out.push_back(slice[0]);
        while (out.size() < n_ctx) {
            auto t0 = clock::now();
            const size_t nd = draft(out.data(), out.size(), n_draft, 1, kNgramMax, context, &dynamic,
                                    st, drafted.data(), steps.data(), oob);
            r.t_draft_ns += detail::elapsed_ns(t0);
            ++r.n_steps;
            r.n_drafted += static_cast<int64_t>(nd);
            ++r.draft_length_hist[nd];
            for (size_t j = 0; j < nd; ++j) {
                ++r.drafted_by_position[j];
                ++r.drafted_by_source[static_cast<int>(steps[j].source)];
                ++r.drafted_by_ngram[steps[j].ngram_size - 1];
            }
            size_t acc = 0;
            for (size_t j = 0; j < nd && out.size() < n_ctx; ++j) {
                if (slice[out.size()] != drafted[j]) break;
                ++acc;
                out.push_back(slice[out.size()]);
                t0 = clock::now();
                context.update(out.data(), out.size(), 1, kNgramMax, 1);
                r.t_draft_ns += detail::elapsed_ns(t0);
                ++r.accepted_by_position[j];
                ++r.accepted_by_source[static_cast<int>(steps[j].source)];
                ++r.accepted_by_ngram[steps[j].ngram_size - 1];
            }
            r.n_accept += static_cast<int64_t>(acc);
            if (nd > 0) ++r.accept_length_hist[acc];
            if (out.size() < n_ctx) {
                out.push_back(slice[out.size()]);
                t0 = clock::now();
                context.update(out.data(), out.size(), 1, kNgramMax, 1);
                r.t_draft_ns += detail::elapsed_ns(t0);
            }
            const int64_t done = done_before + static_cast<int64_t>(out.size());
            if (progress && done >= next_report) {
                progress(done, total);
                next_report = done + kProgressEvery;
            }
        }
        dynamic.merge(context, opt.dynamic_key_order);
        context.clear();
        // A chunk adds at most 4 keys per token. Sizing the table once per chunk (llama.cpp's
        // unordered_map keeps its buckets across clear() too) spares the timed updates a
        // dozen rehashes; it changes no result, only where keys sit in the table.
        context.reserve(context_keys);
        ++r.n_chunks;
    }
    r.t_replay_ns = detail::elapsed_ns(t_loop);
    if (progress) progress(total, total);
    return r;
}

}  // namespace ngramcache
