// LookupDrafter: every proposal against draft() on a context cache rebuilt from the whole
// sequence so far, with and without dynamic and static sources (a cache and a table), the
// sequence arriving in accept batches of random sizes as a speculative loop hands it over.
#include <random>
#include <vector>

#include "check.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/lookup_drafter.hpp"
#include "ngramcache/static_table.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

namespace {

// What draft() proposes after `seq` with a freshly built context cache.
template <class Static>
Tokens drafted_from_scratch(const Tokens& seq, size_t n_max, int nmin, int nmax, const NgramCache* dynamic,
                            const Static& st) {
    NgramCache ctx;
    ctx.update(seq.data(), seq.size(), nmin, nmax, seq.size());
    Tokens out(n_max);
    out.resize(draft(seq.data(), seq.size(), n_max, nmin, nmax, ctx, dynamic, st, out.data()));
    return out;
}

// Follows `text` through one drafter; returns how many tokens it drafted in all.
size_t follow(std::mt19937& rng, const Tokens& text, int nmin, int nmax, const SharedCache* dynamic,
              const StaticSource& st) {
    SharedCache context;  // the caller's, so that it can be compared too
    LookupDrafter d(nmin, nmax, dynamic, st, &context);
    std::uniform_int_distribution<size_t> batch(0, 6), want(0, 12);
    size_t have = std::min<size_t>(text.size(), batch(rng)), total = 0;
    d.reset(text.data(), have);
    Tokens out(16, -7);
    const NgramCache* dyn = dynamic != nullptr ? &dynamic->unlocked() : nullptr;
    while (true) {
        const Tokens seq(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(have));
        const size_t n_max = want(rng);
        Tokens expected;
        if (st.table != nullptr) expected = drafted_from_scratch(seq, n_max, nmin, nmax, dyn, *st.table);
        else if (st.cache != nullptr)
            expected = drafted_from_scratch(seq, n_max, nmin, nmax, dyn, CacheAsStatic{&st.cache->unlocked()});
        else expected = drafted_from_scratch(seq, n_max, nmin, nmax, dyn, NoStatic{});
        std::fill(out.begin(), out.end(), -7);
        const size_t n = d.propose(n_max, out.data());
        check::note() = "at " + std::to_string(have) + " tokens, n_max " + std::to_string(n_max);
        CHECK_EQ(Tokens(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), expected);
        CHECK_EQ(out[n], -7);  // nothing written past the count returned
        CHECK_EQ(d.confidence(), static_cast<int>(n));
        CHECK_EQ(d.tokens().to_vector(), seq);
        total += n;
        if (have == text.size()) break;
        const size_t k = std::min(text.size() - have, batch(rng));
        d.accept(text.data() + have, k);
        have += k;
    }
    // The caller's context cache holds what one built from the whole text holds, part by part.
    NgramCache whole;
    whole.update(text.data(), text.size(), nmin, nmax, text.size());
    test::check_same_parts(context.unlocked(), whole);
    check::note().clear();
    return total;
}

}  // namespace

TEST(drafts_as_draft_on_the_context_alone) {
    std::mt19937 rng(17);
    size_t drafted = 0;
    for (int round = 0; round < 60; ++round) {
        const int nmin = 1 + static_cast<int>(rng() % 2);
        const int nmax = nmin + static_cast<int>(rng() % (5 - nmin));
        const token_t vocab = 2 + static_cast<token_t>(rng() % 6);
        const Tokens text = test::random_stream(rng, 20 + rng() % 300, vocab);
        check::note() = "round " + std::to_string(round);
        drafted += follow(rng, text, nmin, nmax, nullptr, StaticSource{});
    }
    CHECK(drafted > 1000);  // the comparison saw real proposals, not only empty ones
}

TEST(drafts_as_draft_with_dynamic_and_static_sources) {
    std::mt19937 rng(23);
    SharedCache dynamic, stat;
    const Tokens corpus = test::random_stream(rng, 4000, 5);
    dynamic.unlocked().update(corpus.data(), 2000, 1, 4, 2000);
    stat.unlocked().update(corpus.data() + 2000, 2000, 2, 2, 2000);
    const StaticTable table = StaticTable::build(corpus.data() + 2000, 2000, 2);
    size_t drafted = 0;
    for (int round = 0; round < 30; ++round) {
        const Tokens text = test::random_stream(rng, 150, 5 + round % 3);
        StaticSource st;
        if (round % 3 == 1) st.cache = &stat;
        if (round % 3 == 2) st.table = &table;
        drafted += follow(rng, text, 1, 4, round % 2 ? &dynamic : nullptr, st);
    }
    CHECK(drafted > 1000);
}

TEST(set_dynamic_takes_effect_at_the_next_proposal) {
    SharedCache dynamic;
    const Tokens corpus{5, 6, 5, 6, 5, 6, 5, 6};
    dynamic.unlocked().update(corpus.data(), corpus.size(), 1, 4, corpus.size());
    const Tokens prompt{1, 2, 5};  // 5 never followed by anything in the prompt itself
    LookupDrafter d;
    d.reset(prompt.data(), prompt.size());
    Tokens out(4);
    CHECK_EQ(d.propose(1, out.data()), size_t(0));
    CHECK_EQ(d.confidence(), 0);
    d.set_dynamic(&dynamic);
    CHECK_EQ(d.propose(1, out.data()), size_t(1));
    CHECK_EQ(out[0], 6);
    CHECK_EQ(d.confidence(), 1);
    d.set_dynamic(nullptr);
    CHECK_EQ(d.propose(1, out.data()), size_t(0));
}

TEST(reset_starts_over) {
    const Tokens a{1, 2, 3, 1, 2, 3, 1, 2}, b{7, 8, 7};
    LookupDrafter d;
    d.reset(a.data(), a.size());
    Tokens out(4);
    CHECK(d.propose(2, out.data()) > 0);
    d.reset(b.data(), b.size());
    CHECK_EQ(d.tokens().to_vector(), b);
    CHECK_EQ(d.context().unlocked().size(), size_t(3));  // the keys of b alone: (7), (8), (7 8)
    CHECK(d.context().unlocked().find(Ngram::of2(1, 2)) == nullptr);
    d.reset(nullptr, 0);
    CHECK_EQ(d.propose(4, out.data()), size_t(0));
    CHECK_EQ(d.context().unlocked().size(), size_t(0));
}

TEST(replays_in_the_core) {
    std::mt19937 rng(5);
    const Tokens text = test::repeated_phrase(rng, 40, 30, 10, 50);
    LookupDrafter d;
    const ReplayOptions opt = test::replay_options(512, 8);
    const auto r = replay_drafter(d, text.data(), text.size(), opt);
    CHECK_EQ(r.n_chunks, 2);
    CHECK(r.n_accept > r.n_steps);  // the repeated phrase is drafted from the context cache
}

TEST(bad_ngram_sizes) {
    CHECK_THROWS_AS(LookupDrafter(0, 4), InputError, "ngram");
    CHECK_THROWS_AS(LookupDrafter(1, 5), InputError, "ngram");
    CHECK_THROWS_AS(LookupDrafter(3, 2), InputError, "ngram");
}

CHECK_MAIN()
