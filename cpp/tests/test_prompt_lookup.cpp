// PromptLookupDrafter: the incremental index against the peers' rescan of the whole
// sequence (Hugging Face's and llama-cpp-python's loop, written out), both match rules,
// accept batches of random sizes, and the argument checks.
#include <random>
#include <vector>

#include "check.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/prompt_lookup.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;
using Match = PromptLookupDrafter::Match;

namespace {

// For size from min(max_ngram, len - 1) down to min_ngram: the windows equal to the
// suffix, in order; the first (or, for recent, the last) whose continuation is not empty.
Tokens rescan(const Tokens& seq, size_t n_max, int max_ngram, int min_ngram, Match match, int& size) {
    size = 0;
    const size_t len = seq.size();
    if (len < 2) return {};
    for (size_t s = std::min<size_t>(max_ngram, len - 1); s >= size_t(min_ngram); --s) {
        std::vector<size_t> starts;
        for (size_t i = 0; i + s <= len; ++i)
            if (std::equal(seq.begin() + i, seq.begin() + i + s, seq.end() - s)) starts.push_back(i);
        if (match == Match::recent) std::reverse(starts.begin(), starts.end());
        for (size_t i : starts) {
            const size_t a = i + s, b = std::min(a + n_max, len);
            if (a < b) {
                size = static_cast<int>(s);
                return Tokens(seq.begin() + a, seq.begin() + b);
            }
        }
    }
    return {};
}

}  // namespace

TEST(worked_examples) {
    Tokens out(10);
    PromptLookupDrafter d(3, 1);
    // vLLM's docstring example: [1 2 3 4 2 3], the last "2 3" matched at 1, three tokens follow
    const Tokens a{1, 2, 3, 4, 2, 3};
    d.reset(a.data(), a.size());
    CHECK_EQ(d.propose(4, out.data()), size_t(3));
    CHECK_EQ(Tokens(out.begin(), out.begin() + 3), (Tokens{4, 2, 3}));
    CHECK_EQ(d.confidence(), 2);
    // a run: "a a" first occurs at 0, overlapping the suffix; what follows runs to the end
    const Tokens run{5, 5, 5, 5};
    d.reset(run.data(), run.size());
    CHECK_EQ(d.propose(10, out.data()), size_t(1));
    CHECK_EQ(d.confidence(), 3);
    // first vs recent: "7" is followed by 1 first, by 2 later
    const Tokens b{7, 1, 7, 2, 7};
    d.reset(b.data(), b.size());
    d.propose(1, out.data());
    CHECK_EQ(out[0], 1);
    PromptLookupDrafter r(3, 1, Match::recent);
    r.reset(b.data(), b.size());
    r.propose(1, out.data());
    CHECK_EQ(out[0], 2);
    // nothing to find
    const Tokens c{1, 2, 3};
    d.reset(c.data(), c.size());
    CHECK_EQ(d.propose(5, out.data()), size_t(0));
    CHECK_EQ(d.confidence(), 0);
    d.reset(c.data(), 1);
    CHECK_EQ(d.propose(5, out.data()), size_t(0));
    d.reset(c.data(), 0);
    CHECK_EQ(d.propose(5, out.data()), size_t(0));
    // min_ngram: a 1-gram match is not enough
    PromptLookupDrafter two(3, 2);
    two.reset(b.data(), b.size());
    CHECK_EQ(two.propose(5, out.data()), size_t(0));
}

TEST(equals_the_rescan) {
    std::mt19937 rng(17);
    Tokens out(16);
    for (int round = 0; round < 80; ++round) {
        const int min_ngram = 1 + static_cast<int>(rng() % 3);
        const int max_ngram = min_ngram + static_cast<int>(rng() % 4);
        const Match match = rng() % 2 ? Match::recent : Match::first;
        const Tokens text = test::random_stream(rng, 30 + rng() % 250, 2 + static_cast<token_t>(rng() % 6));
        PromptLookupDrafter d(max_ngram, min_ngram, match);
        std::uniform_int_distribution<size_t> batch(0, 6), want(0, 12);
        size_t have = std::min(text.size(), batch(rng));
        d.reset(text.data(), have);
        while (true) {
            const Tokens seq(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(have));
            const size_t n_max = want(rng);
            int size = 0;
            const Tokens want_tokens = rescan(seq, n_max, max_ngram, min_ngram, match, size);
            const size_t n = d.propose(n_max, out.data());
            check::note() = "round " + std::to_string(round) + " at " + std::to_string(have);
            CHECK_EQ(Tokens(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), want_tokens);
            CHECK_EQ(d.confidence(), want_tokens.empty() ? 0 : size);
            if (have == text.size()) break;
            const size_t k = std::min(text.size() - have, batch(rng));
            d.accept(text.data() + have, k);
            have += k;
        }
    }
}

TEST(replays_in_the_core) {
    std::mt19937 rng(2);
    Tokens text;
    const Tokens phrase = test::random_stream(rng, 30, 100);
    for (int i = 0; i < 40; ++i) {
        text.insert(text.end(), phrase.begin(), phrase.end());
        text.push_back(static_cast<token_t>(100 + i));
    }
    PromptLookupDrafter d(3, 1);
    const ReplayOptions opt = test::replay_options(600, 10);
    const auto r = replay_drafter(d, text.data(), text.size(), opt);
    CHECK_EQ(r.n_chunks, 2);
    CHECK(r.n_accept > 2 * r.n_steps);
}

TEST(bad_sizes) {
    CHECK_THROWS_AS(PromptLookupDrafter(3, 0), InputError, "min_ngram");
    CHECK_THROWS_AS(PromptLookupDrafter(1, 2), InputError, "min_ngram <= max_ngram");
    CHECK_THROWS_AS(PromptLookupDrafter(65, 1), InputError, "64");
}

CHECK_MAIN()
