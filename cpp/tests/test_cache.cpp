// NgramCache against the slow reference of support.hpp (llama.cpp's update and merge,
// docs/llama-lookup.md §2 and §4), plus its own guarantees: first-seen order, stable part addresses,
// overflow detection.
#include <climits>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"

using namespace ngramcache;
using test::RefCache;
using test::Tokens;

static void set_note(const std::string& s) { check::note() = s; }

TEST(update_whole_stream_matches_reference) {
    std::mt19937 rng(1);
    const token_t vocabs[] = {1, 2, 5, 40, 300};
    for (int round = 0; round < 20; ++round) {
        const token_t vocab = vocabs[round % 5];
        const Tokens inp = test::random_stream(rng, rng() % 300, vocab);
        for (int nmin = 1; nmin <= 4; ++nmin)
            for (int nmax = nmin; nmax <= 4; ++nmax) {
                set_note("round " + std::to_string(round) + " sizes " + std::to_string(nmin) + ".." +
                         std::to_string(nmax));
                NgramCache c;
                RefCache r;
                c.update(inp.data(), inp.size(), nmin, nmax, inp.size());
                r.update(inp, inp.size(), nmin, nmax, inp.size());
                test::check_same(c, r);
            }
    }
}

TEST(update_incremental_matches_reference_for_every_nnew) {
    std::mt19937 rng(2);
    for (int round = 0; round < 40; ++round) {
        const Tokens inp = test::random_stream(rng, 50 + rng() % 200, round % 2 ? 4 : 30);
        const int nmin = 1 + int(rng() % 4), nmax = nmin + int(rng() % (5 - nmin));
        set_note("round " + std::to_string(round));
        // One token at a time (how the context cache grows), then chunks of random
        // length, then nnew values that re-add or exceed what is new, as llama.cpp allows.
        for (int mode = 0; mode < 3; ++mode) {
            NgramCache c;
            RefCache r;
            size_t len = 0;
            while (len < inp.size()) {
                size_t step = mode == 0 ? 1 : 1 + rng() % 17;
                len = std::min(inp.size(), len + step);
                size_t nnew = mode == 2 ? rng() % (len + 5) : step;
                c.update(inp.data(), len, nmin, nmax, nnew);
                r.update(inp, len, nmin, nmax, nnew);
            }
            test::check_same(c, r);
        }
    }
}

TEST(update_with_nothing_new_adds_nothing) {
    const Tokens inp = {1, 2, 3, 4, 5};
    NgramCache c;
    c.update(inp.data(), inp.size(), 1, 4, 0);
    CHECK_EQ(c.size(), size_t(0));
    c.update(inp.data(), 0, 1, 4, 10);
    CHECK_EQ(c.size(), size_t(0));
    c.update(inp.data(), 1, 1, 4, 1);  // a single token has no predecessor
    CHECK_EQ(c.size(), size_t(0));
    c.update(inp.data(), 4, 4, 4, 4);  // a 4-gram needs a fifth token to predict
    CHECK_EQ(c.size(), size_t(0));
    c.update(inp.data(), 5, 4, 4, 1);
    CHECK_EQ(c.size(), size_t(1));
}

TEST(nnew_one_adds_one_observation_per_size) {
    const Tokens inp = {9, 8, 7, 6, 5};
    NgramCache c;
    c.update(inp.data(), inp.size(), 1, 4, 1);
    CHECK_EQ(c.size(), size_t(4));
    for (int n = 1; n <= 4; ++n) {
        const Part* p = c.find(Ngram(inp.data() + 4 - n, n));
        CHECK(p != nullptr);
        CHECK_EQ(p->size(), 1u);
        CHECK_EQ((*p)[0].token, 5);
        CHECK_EQ((*p)[0].count, 1);
    }
}

TEST(first_seen_order_of_keys_and_tokens) {
    const Tokens inp = {5, 7, 5, 9, 5, 7};
    NgramCache c;
    c.update(inp.data(), inp.size(), 1, 1, inp.size());
    CHECK_EQ(c.size(), size_t(3));
    const token_t k5[1] = {5}, k7[1] = {7}, k9[1] = {9};
    CHECK(c.key_at(0) == Ngram(k5, 1));
    CHECK(c.key_at(1) == Ngram(k7, 1));
    CHECK(c.key_at(2) == Ngram(k9, 1));
    const Part& p = c.part_at(0);
    CHECK_EQ(p.size(), 2u);
    CHECK_EQ(p[0].token, 7);
    CHECK_EQ(p[0].count, 2);
    CHECK_EQ(p[1].token, 9);
    CHECK_EQ(p[1].count, 1);
    CHECK_EQ(p.sum(), 3);
    CHECK_EQ(p.max_count(), 2);
    CHECK_EQ(p.count_of(7), 2);
    CHECK_EQ(p.count_of(5), 0);
}

TEST(large_parts_keep_order_and_counts) {
    // Key 0 followed by 3000 distinct tokens, some of them twice: past the size where a
    // part gets its token index, and through several index rebuilds.
    Tokens inp;
    for (token_t t = 1; t <= 3000; ++t) inp.insert(inp.end(), {0, t});
    for (token_t t = 3000; t >= 1; t -= 7) inp.insert(inp.end(), {0, t});
    NgramCache c;
    RefCache r;
    c.update(inp.data(), inp.size(), 1, 2, inp.size());
    r.update(inp, inp.size(), 1, 2, inp.size());
    test::check_same(c, r);
    const token_t k0[1] = {0};
    const Part* p = c.find(Ngram(k0, 1));
    CHECK(p != nullptr);
    CHECK_EQ(p->size(), 3000u);
    CHECK_EQ(p->count_of(3000), 2);
    CHECK_EQ(p->count_of(2999), 1);
    CHECK_EQ(p->count_of(3001), 0);
    CHECK_EQ(p->max_count(), 2);
}

TEST(growth_never_moves_a_part) {
    NgramCache c;
    std::vector<const Part*> first;
    std::vector<Ngram> keys;
    // Several segments of parts and many table rehashes.
    for (token_t i = 0; i < 20000; ++i) {
        const token_t k[2] = {i, i % 13};
        keys.emplace_back(k, 2);
        Part& p = c.get_or_insert(keys.back());
        p.add(i, 1 + i % 5);
        if (i < 500) first.push_back(&p);
    }
    CHECK_EQ(c.size(), size_t(20000));
    for (size_t i = 0; i < first.size(); ++i) {
        CHECK(c.find(keys[i]) == first[i]);
        CHECK(&c.part_at(i) == first[i]);
        CHECK_EQ(first[i]->count_of(token_t(i)), int32_t(1 + i % 5));
    }
    for (size_t i = 0; i < keys.size(); ++i) CHECK(c.key_at(i) == keys[i]);
    c.reserve(100000);
    CHECK(c.find(keys[0]) == first[0]);
    CHECK(&c.get_or_insert(keys[3]) == first[3]);
    CHECK_EQ(c.size(), size_t(20000));
}

TEST(absent_keys_are_not_found) {
    std::mt19937 rng(3);
    const Tokens inp = test::random_stream(rng, 2000, 20);
    NgramCache c;
    RefCache r;
    c.update(inp.data(), inp.size(), 1, 4, inp.size());
    r.update(inp, inp.size(), 1, 4, inp.size());
    int absent = 0;
    for (int i = 0; i < 5000; ++i) {
        test::Key k(1 + rng() % 4);
        for (auto& t : k) t = token_t(rng() % 25);
        const bool in_ref = r.find(k) != nullptr;
        CHECK_EQ(c.find(test::key_of(k)) != nullptr, in_ref);
        absent += !in_ref;
    }
    CHECK(absent > 1000);
    CHECK(c.find(Ngram()) == nullptr);
}

TEST(merge_sums_and_appends_in_the_added_caches_order) {
    NgramCache target, add;
    const token_t k1[1] = {1}, k3[1] = {3};
    target.get_or_insert(Ngram(k1, 1)).add(2, 1);
    add.get_or_insert(Ngram(k3, 1)).add(4, 1);
    Part& a1 = add.get_or_insert(Ngram(k1, 1));
    a1.add(5, 2);
    a1.add(2, 3);
    target.merge(add);
    CHECK_EQ(target.size(), size_t(2));
    CHECK(target.key_at(0) == Ngram(k1, 1));
    CHECK(target.key_at(1) == Ngram(k3, 1));
    const Part& p = target.part_at(0);
    CHECK_EQ(p.size(), 2u);
    CHECK_EQ(p[0].token, 2);
    CHECK_EQ(p[0].count, 4);
    CHECK_EQ(p[1].token, 5);
    CHECK_EQ(p[1].count, 2);
    CHECK_EQ(p.sum(), 6);
    CHECK_EQ(p.max_count(), 4);
    // `add` is unchanged.
    CHECK_EQ(add.size(), size_t(2));
    CHECK_EQ(add.part_at(1).count_of(2), 3);
}

TEST(merge_matches_reference_on_random_caches) {
    std::mt19937 rng(4);
    for (int round = 0; round < 15; ++round) {
        set_note("round " + std::to_string(round));
        const token_t vocab = round % 3 == 0 ? 3 : 25;
        const Tokens a = test::random_stream(rng, rng() % 400, vocab);
        const Tokens b = test::random_stream(rng, rng() % 400, vocab);
        NgramCache ca, cb;
        RefCache ra, rb;
        ca.update(a.data(), a.size(), 1, 4, a.size());
        ra.update(a, a.size(), 1, 4, a.size());
        cb.update(b.data(), b.size(), 1, 4, b.size());
        rb.update(b, b.size(), 1, 4, b.size());
        ca.merge(cb);
        ra.merge(rb);
        test::check_same(ca, ra);
        test::check_same(cb, rb);
        NgramCache empty;  // merging into an empty cache copies `add`'s parts, keys in its map's order
        empty.merge(cb);
        RefCache rempty;
        rempty.merge(rb);
        test::check_same(empty, rempty);
    }
}

// Without llama.cpp's key order (a private copy's merges): the same keys, and every part
// the same tokens in the same order with the same counts; only the order of new keys differs.
TEST(merge_in_own_key_order_gives_the_same_parts) {
    std::mt19937 rng(6);
    for (int round = 0; round < 10; ++round) {
        set_note("round " + std::to_string(round));
        const token_t vocab = round % 2 == 0 ? 4 : 40;
        NgramCache llama_order, own_order;
        for (int chunk = 0; chunk < 4; ++chunk) {  // a dynamic cache absorbing chunks, as in replay
            const Tokens t = test::random_stream(rng, 50 + rng() % 300, vocab);
            NgramCache context;
            context.update(t.data(), t.size(), 1, 4, t.size());
            llama_order.merge(context);
            own_order.merge(context, false);
        }
        CHECK_EQ(own_order.size(), llama_order.size());
        for (size_t i = 0; i < own_order.size(); ++i) {
            const Part* other = llama_order.find(own_order.key_at(i));
            CHECK(other != nullptr);
            const Part& p = own_order.part_at(i);
            CHECK_EQ(p.size(), other->size());
            for (uint32_t j = 0; j < p.size(); ++j) {
                CHECK_EQ(p[j].token, (*other)[j].token);
                CHECK_EQ(p[j].count, (*other)[j].count);
            }
        }
    }
}

TEST(merge_with_itself_doubles) {
    std::mt19937 rng(5);
    const Tokens a = test::random_stream(rng, 3000, 30);
    NgramCache c;
    RefCache r;
    c.update(a.data(), a.size(), 1, 4, a.size());
    r.update(a, a.size(), 1, 4, a.size());
    c.merge(c);
    for (auto& part : r.parts)
        for (auto& e : part) e.second *= 2;
    test::check_same(c, r);
}

TEST(count_overflow_throws) {
    NgramCache c;
    const token_t k[2] = {1, 2};
    Part& p = c.get_or_insert(Ngram(k, 2));
    p.add(7, INT32_MAX - 1);
    p.add(7, 1);
    CHECK_EQ(p.count_of(7), INT32_MAX);
    CHECK_THROWS_AS(p.add(7, 1), std::overflow_error, "int32");
    CHECK_EQ(p.count_of(7), INT32_MAX);  // unchanged by the failed add
    CHECK_EQ(p.sum(), int64_t(INT32_MAX));

    NgramCache big, one;
    big.get_or_insert(Ngram(k, 2)).add(3, INT32_MAX - 1);
    one.get_or_insert(Ngram(k, 2)).add(3, 2);
    CHECK_THROWS_AS(big.merge(one), std::overflow_error, "int32");

    NgramCache half;
    half.get_or_insert(Ngram(k, 2)).add(3, 1 << 30);
    CHECK_THROWS_AS(half.merge(half), std::overflow_error, "int32");
}

TEST(an_overflowing_change_changes_nothing) {
    const token_t one[1] = {1}, three[1] = {3};
    auto near_overflow = [&](NgramCache& c) {
        c.get_or_insert(Ngram(one, 1)).add(2, 1);
        c.get_or_insert(Ngram(three, 1)).add(4, INT32_MAX);
    };
    auto same = [](const NgramCache& a, const NgramCache& b) {
        CHECK_EQ(a.size(), b.size());
        test::check_same_parts(a, b);
    };
    NgramCache c, before, other;
    near_overflow(c);
    near_overflow(before);
    near_overflow(other);
    CHECK_THROWS_AS(c.merge(c), std::overflow_error, "int32");
    same(c, before);
    CHECK_THROWS_AS(c.merge(other), std::overflow_error, "int32");
    same(c, before);
    const Tokens inp = {1, 2, 3, 4};
    CHECK_THROWS_AS(c.update(inp.data(), inp.size(), 1, 4, inp.size()), std::overflow_error, "int32");
    same(c, before);
    c.update(inp.data(), 2, 1, 4, 2);  // away from the limit, counting goes on
    CHECK_EQ(c.find(Ngram(one, 1))->count_of(2), 2);
}

TEST(a_budget_never_reached_changes_nothing) {
    std::mt19937 rng(7);
    for (int round = 0; round < 20; ++round) {
        const Tokens inp = test::random_stream(rng, 50 + rng() % 400, 1 + rng() % 60);
        NgramCache capped, free;
        capped.set_max_bytes(4u << 20);
        for (size_t a = 0; a < inp.size(); a += 7) {
            const size_t b = std::min(inp.size(), a + 7);
            capped.update(inp.data(), b, 1, 4, b - a);
            free.update(inp.data(), b, 1, 4, b - a);
        }
        CHECK_EQ(capped.evicted(), 0u);
        CHECK_EQ(capped.size(), free.size());
        test::check_same_parts(capped, free);
        for (size_t i = 0; i < free.size(); ++i) CHECK(capped.key_at(i) == free.key_at(i));
    }
}

TEST(a_budget_bounds_the_estimate_and_keeps_what_was_counted_last) {
    std::mt19937 rng(8);
    const Tokens inp = test::random_stream(rng, 300000, 5000);
    NgramCache c;
    c.set_max_bytes(1u << 20);
    for (size_t a = 0; a < inp.size(); a += 1000) {
        c.update(inp.data(), a + 1000, 1, 4, 1000);
        CHECK(c.estimated_bytes() <= c.max_bytes());
    }
    CHECK(c.evicted() > 0);
    CHECK(c.size() > 1000);
    // The last 4-gram was counted last: kept, with its next token.
    const Ngram last(inp.data() + inp.size() - 5, 4);
    const Part* p = c.find(last);
    CHECK(p != nullptr);
    CHECK(p->count_of(inp.back()) >= 1);
    // Whatever is kept has counts equal to or below the unbounded cache's.
    NgramCache free;
    free.update(inp.data(), inp.size(), 1, 4, inp.size());
    for (size_t i = 0; i < c.size(); ++i) {
        const Part* f = free.find(c.key_at(i));
        CHECK(f != nullptr);
        for (const Entry& e : c.part_at(i)) CHECK(e.count <= f->count_of(e.token));
    }
    CHECK_THROWS_AS(c.set_max_bytes(1000), InputError, "max_bytes");
}

TEST(check_sizes_rejects_bad_ranges) {
    for (int lo = -1; lo <= 5; ++lo)
        for (int hi = -1; hi <= 5; ++hi) {
            const bool ok = lo >= 1 && hi <= 4 && lo <= hi;
            set_note("ngram_min " + std::to_string(lo) + ", ngram_max " + std::to_string(hi));
            if (ok) {
                NgramCache::check_sizes(lo, hi);
            } else {
                const std::string msg = "ngram_min=" + std::to_string(lo) + ", ngram_max=" + std::to_string(hi);
                CHECK_THROWS_AS(NgramCache::check_sizes(lo, hi), InputError, msg);
                NgramCache c;
                const Tokens inp = {1, 2, 3, 4, 5, 6};
                CHECK_THROWS_AS(c.update(inp.data(), inp.size(), lo, hi, inp.size()), InputError,
                                "need 1 <= ngram_min <= ngram_max <= 4");
                CHECK_EQ(c.size(), size_t(0));
            }
        }
}

TEST(clear_and_swap) {
    const Tokens a = {1, 2, 3, 1, 2, 3}, b = {7, 8};
    NgramCache x, y;
    x.update(a.data(), a.size(), 1, 2, a.size());
    y.update(b.data(), b.size(), 1, 2, b.size());
    const size_t nx = x.size();
    x.swap(y);
    CHECK_EQ(x.size(), size_t(1));
    CHECK_EQ(y.size(), nx);
    const token_t k7[1] = {7};
    CHECK(x.find(Ngram(k7, 1)) != nullptr);
    CHECK(y.find(Ngram(k7, 1)) == nullptr);
    y.clear();
    CHECK_EQ(y.size(), size_t(0));
    const token_t k1[1] = {1};
    CHECK(y.find(Ngram(k1, 1)) == nullptr);
    y.update(a.data(), a.size(), 1, 1, a.size());  // usable after clear
    CHECK_EQ(y.find(Ngram(k1, 1))->count_of(2), 2);
}

TEST(part_clear_resets_it) {
    NgramCache c;
    const token_t k[1] = {4};
    Part& p = c.get_or_insert(Ngram(k, 1));
    for (token_t t = 0; t < 40; ++t) p.add(t, t + 1);
    CHECK_EQ(p.size(), 40u);
    p.clear();
    CHECK_EQ(p.size(), 0u);
    CHECK_EQ(p.sum(), 0);
    CHECK_EQ(p.max_count(), 0);
    CHECK_EQ(p.count_of(3), 0);
    p.add(3, 5);
    p.add_new(9, 2);
    CHECK_EQ(p.size(), 2u);
    CHECK_EQ(p.count_of(3), 5);
    CHECK_EQ(p.count_of(9), 2);
    CHECK_EQ(p.sum(), 7);
    CHECK_EQ(p.max_count(), 5);
}

CHECK_MAIN()
