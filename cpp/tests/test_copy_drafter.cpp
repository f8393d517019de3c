// CopyDrafter: the copy index and matching against a brute-force scan of the whole
// sequence, the lookup fallback against draft() on a cache rebuilt from scratch, and the
// argument checks. Accept batches of random sizes, as a speculative loop hands them over.
#include <map>
#include <random>
#include <vector>

#include "check.hpp"
#include "ngramcache/copy_drafter.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

namespace {

// What the copy drafter proposes, by scanning every earlier position.
struct Expected {
    Tokens tokens;
    int confidence = 0;
    int source = 0;
};

Expected brute_force(const Tokens& seq, size_t n_max, const CopyOptions& o, const NgramCache* dynamic,
                     const NgramCache* stat) {
    Expected e;
    if (n_max == 0 || seq.empty()) return e;
    const size_t m = o.min_match, last = seq.size() - 1;
    if (last + 1 >= m) {
        std::vector<size_t> hits;  // positions j < last ending an occurrence of the last m tokens
        for (size_t j = m - 1; j < last; ++j) {
            bool same = true;
            for (size_t i = 0; i < m && same; ++i) same = seq[j - i] == seq[last - i];
            if (same) hits.push_back(j);
        }
        size_t best_pos = 0, best_len = 0, seen = 0;
        for (auto it = hits.rbegin(); it != hits.rend() && seen < o.max_candidates; ++it, ++seen) {
            size_t len = 0;
            while (len < o.max_match && len <= *it && seq[*it - len] == seq[last - len]) ++len;
            if (len > best_len) {
                best_len = len;
                best_pos = *it;
            }
        }
        if (best_len > 0) {
            for (size_t i = best_pos + 1; i <= last && e.tokens.size() < n_max; ++i) e.tokens.push_back(seq[i]);
            e.confidence = static_cast<int>(best_len);
            e.source = 1;
            return e;
        }
    }
    NgramCache ctx;
    ctx.update(seq.data(), seq.size(), o.ngram_min, o.ngram_max, seq.size());
    e.tokens.resize(n_max);
    size_t n = 0;
    if (stat != nullptr)
        n = draft(seq.data(), seq.size(), n_max, o.ngram_min, o.ngram_max, ctx, dynamic, CacheAsStatic{stat},
                  e.tokens.data());
    else
        n = draft(seq.data(), seq.size(), n_max, o.ngram_min, o.ngram_max, ctx, dynamic, NoStatic{}, e.tokens.data());
    e.tokens.resize(n);
    e.confidence = static_cast<int>(n);
    return e;
}

void follow(std::mt19937& rng, const Tokens& text, const CopyOptions& o, const SharedCache* dynamic,
            const SharedCache* stat) {
    CopyDrafter d(o, dynamic, StaticSource{stat, nullptr});
    std::uniform_int_distribution<size_t> batch(0, 6), want(0, 12);
    size_t have = std::min<size_t>(text.size(), batch(rng));
    d.reset(text.data(), have);
    Tokens out(16);
    while (true) {
        const Tokens seq(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(have));
        const size_t n_max = want(rng);
        const Expected e = brute_force(seq, n_max, o, dynamic ? &dynamic->unlocked() : nullptr,
                                       stat ? &stat->unlocked() : nullptr);
        const size_t n = d.propose(n_max, out.data());
        check::note() = "at " + std::to_string(have) + " tokens, n_max " + std::to_string(n_max);
        CHECK_EQ(Tokens(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), e.tokens);
        CHECK_EQ(d.confidence(), e.confidence);
        CHECK_EQ(d.source(), e.source);
        if (have == text.size()) break;
        const size_t k = std::min(text.size() - have, batch(rng));
        d.accept(text.data() + have, k);
        have += k;
    }
    check::note().clear();
}

}  // namespace

TEST(copies_the_longest_earlier_match) {
    //             0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    const Tokens seq{1, 2, 3, 9, 9, 5, 2, 3, 7, 7, 8, 0, 5, 2, 3};
    CopyDrafter d;
    d.reset(seq.data(), seq.size());
    Tokens out(8);
    // "2 3" ends at 2 and at 7; "5 2 3" matches further back at 7
    CHECK_EQ(d.propose(3, out.data()), size_t(3));
    CHECK_EQ(Tokens(out.begin(), out.begin() + 3), (Tokens{7, 7, 8}));
    CHECK_EQ(d.confidence(), 3);
    CHECK_EQ(d.source(), 1);
    // a copy stops at the end of the sequence
    CHECK_EQ(d.propose(8, out.data()), size_t(7));
    // "4 2" never occurred: the lookup fallback (the context's 1-gram "2" -> 3, three times)
    const Tokens more{7, 7, 4, 2};
    d.accept(more.data(), more.size());
    CHECK_EQ(d.propose(1, out.data()), size_t(1));
    CHECK_EQ(out[0], 3);
    CHECK_EQ(d.source(), 0);
    CHECK_EQ(d.confidence(), 1);
    CHECK_EQ(d.propose(0, out.data()), size_t(0));
    CHECK_EQ(d.confidence(), 0);
}

TEST(the_newest_wins_ties_and_only_max_candidates_count) {
    // "4 1 2" occurs at 2, 7 and 12, each followed by another token; the suffix "1 2" matches
    // all three equally (the token before each is 4, before the suffix 4)
    const Tokens seq{4, 1, 2, 5, 0, 4, 1, 2, 6, 0, 4, 1, 2, 7, 0, 4, 1, 2};
    CopyOptions o;
    o.max_match = 3;
    CopyDrafter d(o);
    d.reset(seq.data(), seq.size());
    Tokens out(4);
    CHECK_EQ(d.propose(1, out.data()), size_t(1));
    CHECK_EQ(out[0], 7);
    CHECK_EQ(d.confidence(), 3);
    // a longer match further back is not looked at beyond max_candidates
    const Tokens seq2{9, 8, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2, 7, 9, 8, 1, 2};
    o = CopyOptions{};
    o.max_candidates = 2;
    CopyDrafter d2(o);
    d2.reset(seq2.data(), seq2.size());
    d2.propose(1, out.data());
    CHECK_EQ(out[0], 7);
    CHECK_EQ(d2.confidence(), 2);
    o.max_candidates = 3;
    CopyDrafter d3(o);
    d3.reset(seq2.data(), seq2.size());
    d3.propose(1, out.data());
    CHECK_EQ(out[0], 5);
    CHECK_EQ(d3.confidence(), 4);
}

TEST(equals_a_scan_of_the_whole_sequence) {
    std::mt19937 rng(7);
    for (int round = 0; round < 60; ++round) {
        CopyOptions o;
        o.min_match = 1 + rng() % 4;
        o.max_match = o.min_match + rng() % 6;
        o.max_candidates = 1 + rng() % 5;
        o.ngram_min = 1 + static_cast<int>(rng() % 2);
        o.ngram_max = o.ngram_min + static_cast<int>(rng() % (5 - o.ngram_min));
        const token_t vocab = 2 + static_cast<token_t>(rng() % 6);
        const Tokens text = test::random_stream(rng, 50 + rng() % 300, vocab);
        check::note() = "round " + std::to_string(round);
        follow(rng, text, o, nullptr, nullptr);
    }
}

TEST(with_dynamic_and_static_caches) {
    std::mt19937 rng(11);
    SharedCache dynamic, stat;
    const Tokens corpus = test::random_stream(rng, 4000, 5);
    dynamic.unlocked().update(corpus.data(), 2000, 1, 4, 2000);
    stat.unlocked().update(corpus.data() + 2000, 2000, 2, 2, 2000);
    for (int round = 0; round < 30; ++round) {
        CopyOptions o;
        o.min_match = 2 + rng() % 4;  // rarer copies: the fallback gets its turn
        o.max_match = o.min_match + rng() % 8;
        const Tokens text = test::random_stream(rng, 200, 5);
        follow(rng, text, o, round % 2 ? &dynamic : nullptr, round % 3 ? &stat : nullptr);
    }
}

TEST(the_context_cache_can_be_the_callers) {
    SharedCache mine;
    const Tokens seq{1, 2, 3, 1, 2};
    CopyDrafter d(CopyOptions{}, nullptr, StaticSource{}, &mine);
    d.reset(seq.data(), seq.size());
    CHECK_EQ(&d.context(), &mine);
    NgramCache want;
    want.update(seq.data(), seq.size(), 1, 4, seq.size());
    CHECK_EQ(mine.unlocked().size(), want.size());
    const Tokens more{3};
    d.accept(more.data(), 1);
    want.update((Tokens{1, 2, 3, 1, 2, 3}).data(), 6, 1, 4, 1);
    CHECK_EQ(mine.unlocked().size(), want.size());
}

TEST(the_index_lists_every_position_once) {
    std::mt19937 rng(3);
    const Tokens text = test::random_stream(rng, 500, 4);
    CopyOptions o;
    o.min_match = 3;
    CopyDrafter d(o);
    d.reset(text.data(), 100);
    for (size_t have = 100; have < text.size(); have += 7)
        d.accept(text.data() + have, std::min<size_t>(7, text.size() - have));
    std::vector<int> seen(text.size(), 0);
    std::map<Tokens, int> grams;  // each gram listed once
    for (const CopyDrafter::IndexedGram& g : d.indexed_grams()) {
        CHECK_EQ(++grams[g.gram], 1);
        for (size_t i = 0; i < g.positions.size(); ++i) {
            const size_t p = g.positions[i];
            ++seen[p];
            if (i > 0) CHECK(g.positions[i - 1] < p);  // oldest first
            const Tokens gram(text.begin() + static_cast<std::ptrdiff_t>(p) - 2,
                              text.begin() + static_cast<std::ptrdiff_t>(p) + 1);
            CHECK_EQ(gram, g.gram);
        }
    }
    for (size_t p = 0; p < text.size(); ++p) CHECK_EQ(seen[p], (p >= 2 && p + 1 < text.size()) ? 1 : 0);
}

TEST(replays_in_the_core) {
    std::mt19937 rng(5);
    const Tokens text = test::repeated_phrase(rng, 40, 30, 10, 50);
    CopyDrafter d;
    const ReplayOptions opt = test::replay_options(512, 8);
    const auto r = replay_drafter(d, text.data(), text.size(), opt);
    CHECK_EQ(r.n_chunks, 2);
    CHECK(r.n_accept > r.n_steps);  // the repeated phrase is copied
}

TEST(bad_options) {
    CopyOptions o;
    o.min_match = 0;
    CHECK_THROWS_AS(CopyDrafter{o}, InputError, "min_match");
    o.min_match = 5;
    o.max_match = 4;
    CHECK_THROWS_AS(CopyDrafter{o}, InputError, "min_match <= max_match");
    o = CopyOptions{};
    o.max_candidates = 0;
    CHECK_THROWS_AS(CopyDrafter{o}, InputError, "max_candidates");
    o = CopyOptions{};
    o.ngram_max = 5;
    CHECK_THROWS_AS(CopyDrafter{o}, InputError, "ngram");
}

CHECK_MAIN()
