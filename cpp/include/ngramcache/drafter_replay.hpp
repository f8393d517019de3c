// The replay loop of llama-lookup-stats (replay.hpp) for any drafter of the sequence
// protocol, so that every drafter can be compared on the same text:
//
//   void   reset(const token_t* prompt, size_t n);     start a new sequence
//   void   accept(const token_t* tokens, size_t n);    verified tokens appended
//   size_t propose(size_t n_max, token_t* out);        up to n_max proposed tokens
//
// The text is cut into chunks of n_ctx tokens as replay.hpp cuts it (a chunk is replayed
// only when a token follows it). Each chunk is one request: the drafter is reset with the
// chunk's first token (its first ReplayOptions::n_prompt tokens); every step proposes up
// to n_draft tokens, accepts the longest prefix that matches the text, then the next text
// token (the one the model would have sampled),
// and hands the drafter those tokens in one accept call, as a speculative loop does. What a
// drafter keeps across reset (a shared table, a store of earlier requests) carries from one
// chunk to the next, as the dynamic cache does in llama-lookup-stats. t_draft_ns times the
// propose and accept calls only.
//
// With a gate (ReplayOptions::gate, gate.hpp) each proposal is cut to what the gate keeps,
// as a gated drafter does while decoding: the counts are then of the verified tokens, and
// the gate learns from every proposal scored against the text, the declined ones too. The
// gate reads the drafter's confidence() and source() where it has them (else the
// proposal's length and the gate's default source).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "gate.hpp"
#include "ngram.hpp"
#include "replay.hpp"

namespace ngramcache {

// replay_drafter()'s counts: a drafter of the sequence protocol has no sources or n-gram
// sizes to count by, so those of every loop.
struct DrafterReplayResult : ReplayCounts {};

namespace detail {

template <class D, class = void>
struct HasConfidence : std::false_type {};
template <class D>
struct HasConfidence<D, std::void_t<decltype(std::declval<const D&>().confidence())>> : std::true_type {};
template <class D, class = void>
struct HasSourceOf : std::false_type {};
template <class D>
struct HasSourceOf<D, std::void_t<decltype(std::declval<const D&>().source())>> : std::true_type {};

// How many of the n proposed tokens the gate lets through (all of them without a gate).
template <class Drafter>
size_t gated(const Drafter& d, GatedSteps* gate, const token_t* proposal, size_t n) {
    if (gate == nullptr) return n;
    int64_t confidence = static_cast<int64_t>(n);
    if constexpr (HasConfidence<Drafter>::value) confidence = static_cast<int64_t>(d.confidence());
    int source = -1;
    if constexpr (HasSourceOf<Drafter>::value) source = static_cast<int>(d.source());
    return gate->propose(proposal, n, confidence, source);
}

}  // namespace detail

template <class Drafter>
DrafterReplayResult replay_drafter(Drafter& d, const token_t* inp, size_t n_input, const ReplayOptions& opt,
                                   const ReplayProgress& progress = nullptr) {
    using clock = std::chrono::steady_clock;
    DrafterReplayResult r = detail::start_replay<DrafterReplayResult>(n_input, opt);
    const size_t n_ctx = opt.n_ctx, n_draft = opt.n_draft, n_prompt = opt.n_prompt;
    if (n_prompt < 1 || n_prompt >= n_ctx)
        throw InputError("n_prompt must be 1 to n_ctx - 1 = " + std::to_string(n_ctx - 1) + ", got " +
                         std::to_string(n_prompt));

    const size_t n_chunks = n_input > n_ctx ? (n_input - 1) / n_ctx : 0;
    const int64_t total = static_cast<int64_t>(n_chunks * n_ctx);
    std::vector<token_t> drafted(n_draft + 1);
    int64_t next_report = kProgressEvery;

    const auto t_loop = clock::now();
    for (size_t c = 0; c < n_chunks; ++c) {
        const token_t* slice = inp + c * n_ctx;
        const int64_t done_before = static_cast<int64_t>(c * n_ctx);
        auto t0 = clock::now();
        d.reset(slice, n_prompt);
        if (opt.gate) opt.gate->reset(n_prompt);
        r.t_draft_ns += detail::elapsed_ns(t0);
        size_t have = n_prompt;  // tokens of the chunk the drafter has seen
        while (have < n_ctx) {
            t0 = clock::now();
            // a drafter may return more than asked; only n_draft are verified
            const size_t nd =
                detail::gated(d, opt.gate, drafted.data(), std::min(d.propose(n_draft, drafted.data()), n_draft));
            r.t_draft_ns += detail::elapsed_ns(t0);
            ++r.n_steps;
            r.n_drafted += static_cast<int64_t>(nd);
            ++r.draft_length_hist[nd];
            size_t acc = 0;
            while (acc < nd && have + acc < n_ctx && slice[have + acc] == drafted[acc]) ++acc;
            for (size_t j = 0; j < nd; ++j) ++r.drafted_by_position[j];
            for (size_t j = 0; j < acc; ++j) ++r.accepted_by_position[j];
            r.n_accept += static_cast<int64_t>(acc);
            if (nd > 0) ++r.accept_length_hist[acc];
            const size_t n_new = std::min(acc + 1, n_ctx - have);
            t0 = clock::now();
            d.accept(slice + have, n_new);
            if (opt.gate) opt.gate->accept(slice, n_new);
            r.t_draft_ns += detail::elapsed_ns(t0);
            have += n_new;
            const int64_t done = done_before + static_cast<int64_t>(have);
            if (progress && done >= next_report) {
                progress(done, total);
                next_report = done + kProgressEvery;
            }
        }
        ++r.n_chunks;
    }
    r.t_replay_ns = detail::elapsed_ns(t_loop);
    if (progress) progress(total, total);
    return r;
}

}  // namespace ngramcache
