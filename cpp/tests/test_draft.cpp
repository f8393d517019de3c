// draft() against llama.cpp's rules (docs/llama-lookup.md §3): hand-made cases for each
// threshold and rule, and a slow reference written from that section's pseudo-code, compared on random small-vocabulary
// streams (where ties and threshold edges are frequent).
#include <climits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;
using test::Key;
using test::RefCache;
using test::RefPart;
using test::Tokens;

struct Drafted {
    Tokens tokens;
    std::vector<int> sources;  // DraftSource as int
    std::vector<int> sizes;
    bool operator==(const Drafted& o) const {
        return tokens == o.tokens && sources == o.sources && sizes == o.sizes;
    }
};

static std::ostream& operator<<(std::ostream& os, const Drafted& d) {
    os << "tokens " << check::show(d.tokens) << " sources " << check::show(d.sources) << " sizes "
       << check::show(d.sizes);
    return os;
}

template <class Static>
static Drafted run(const Tokens& inp, size_t n_draft, int nmin, int nmax, const NgramCache& ctx,
                   const NgramCache* dyn, const Static& st) {
    std::vector<token_t> out(n_draft + 1, -7);
    std::vector<DraftStep> steps(n_draft + 1);
    const size_t n = draft(inp.data(), inp.size(), n_draft, nmin, nmax, ctx, dyn, st, out.data(), steps.data());
    CHECK(n <= n_draft);
    CHECK_EQ(out[n], -7);  // nothing written past the count returned
    Drafted d;
    for (size_t i = 0; i < n; ++i) {
        d.tokens.push_back(out[i]);
        d.sources.push_back(static_cast<int>(steps[i].source));
        d.sizes.push_back(steps[i].ngram_size);
    }
    return d;
}

static Drafted run_plain(const Tokens& inp, size_t n_draft, const NgramCache& ctx, const NgramCache* dyn = nullptr) {
    return run(inp, n_draft, 1, 4, ctx, dyn, NoStatic{});
}

// ---- the reference, from the documented pseudo-code -----------------------------------

// Parts are visited in a real unordered_map's order with a strict '>', as llama.cpp does.
static token_t ref_try_primary(const RefCache& cache, const Tokens& S, int nmin, int nmax, const RefPart* ps,
                               const int* min_sample, const int* min_percent, int& size) {
    for (int n = nmax; n >= nmin; --n) {
        if (size_t(n) > S.size()) continue;
        const RefPart* part = cache.find(Key(S.end() - n, S.end()));
        if (part == nullptr) continue;
        const int i = n - nmin;
        __extension__ typedef __int128 wide;  // exact products, whatever the counts
        int64_t best_tok = -1, best_cnt = 0, best_stat = 0, sum = 0;
        const RefPart visit = test::llama_visit(*part);
        for (auto it = visit.begin(); it != visit.end(); ++it) {
            int64_t stat = 1;
            if (ps != nullptr)
                for (const auto& e : *ps)
                    if (e.first == it->first) stat = 100 * e.second;
            if (wide(it->second) * stat > wide(best_cnt) * best_stat) {
                best_tok = it->first;
                best_cnt = it->second;
                best_stat = stat;
            }
            sum += it->second;
        }
        if (sum < min_sample[i]) continue;
        if (100 * best_cnt < min_percent[i] * sum) continue;
        size = n;
        return token_t(best_tok);
    }
    return -1;
}

static token_t ref_try_static(const RefPart* ps) {
    if (ps == nullptr) return -1;
    int64_t best_tok = -1, best = 0, sum = 0;
    const RefPart visit = test::llama_visit(*ps);
    for (auto it = visit.begin(); it != visit.end(); ++it) {
        if (it->second > best) {
            best_tok = it->first;
            best = it->second;
        }
        sum += it->second;
    }
    if (sum < 2) return -1;
    if (100 * best < 50 * sum) return -1;
    return token_t(best_tok);
}

static Drafted ref_draft(const Tokens& inp, size_t n_draft, int nmin, int nmax, const RefCache& ctx,
                         const RefCache* dyn, const RefCache* st) {
    static const int sample_lax[4] = {2, 2, 1, 1}, percent_lax[4] = {66, 50, 50, 50};
    static const int sample_strict[4] = {4, 3, 2, 2}, percent_strict[4] = {75, 66, 66, 66};
    Drafted d;
    if (inp.size() < 2) return d;
    Tokens S = inp;
    while (d.tokens.size() < n_draft) {
        const RefPart* ps = st ? st->find(Key(S.end() - 2, S.end())) : nullptr;
        int size = 0, src = 0;
        token_t tok = ref_try_primary(ctx, S, nmin, nmax, ps, sample_lax, percent_lax, size);
        if (tok < 0 && dyn != nullptr) {
            src = 1;
            tok = ref_try_primary(*dyn, S, nmin, nmax, ps, sample_strict, percent_strict, size);
        }
        if (tok < 0) {
            src = 2;
            size = 2;
            tok = ref_try_static(ps);
        }
        if (tok < 0) break;
        d.tokens.push_back(tok);
        d.sources.push_back(src);
        d.sizes.push_back(size);
        S.push_back(tok);
    }
    return d;
}

// ---- hand-made cases -------------------------------------------------------------------

// inp ends with 10 11 12 13: the 1..4-gram keys are (13), (12 13), (11 12 13), (10 11 12 13).
static const Tokens kInp = {10, 11, 12, 13};
static Key suffix(int n) { return Key(kInp.end() - n, kInp.end()); }

static void put(NgramCache& c, const Key& k, std::vector<std::pair<token_t, int32_t>> entries) {
    Part& p = c.get_or_insert(test::key_of(k));
    for (auto& e : entries) p.add(e.first, e.second);
}

struct Case {
    int n;  // key size
    std::vector<std::pair<token_t, int32_t>> part;
    token_t expect;  // -1: nothing drafted
};

TEST(context_uses_lax_thresholds) {
    const Case cases[] = {
        {1, {{20, 2}, {21, 1}}, 20},   // 200 >= 66*3
        {1, {{20, 1}, {21, 1}}, -1},   // 100 < 66*2
        {1, {{20, 1}}, -1},            // sample 1 < 2
        {1, {{20, 2}}, 20},
        {1, {{20, 65}, {21, 35}}, -1}, // 6500 < 6600
        {1, {{20, 66}, {21, 34}}, 20}, // 6600 >= 6600
        {2, {{20, 1}, {21, 1}}, 21},   // 50 % passes; the tie goes to the later token
        {2, {{20, 1}}, -1},
        {2, {{20, 1}, {21, 1}, {22, 1}}, -1},
        {2, {{20, 49}, {21, 51}}, 21},
        {3, {{20, 1}}, 20},            // sample 1 suffices from size 3
        {3, {{20, 1}, {21, 1}, {22, 1}}, -1},
        {4, {{20, 1}}, 20},
        {4, {{20, 1}, {21, 2}, {22, 1}}, 21},
        {4, {{20, 1}, {21, 1}, {22, 1}}, -1},
    };
    for (const Case& c : cases) {
        check::note() = "key size " + std::to_string(c.n) + ", expect " + std::to_string(c.expect);
        NgramCache ctx;
        put(ctx, suffix(c.n), c.part);
        const Drafted d = run_plain(kInp, 1, ctx);
        if (c.expect < 0) {
            CHECK_EQ(d.tokens.size(), size_t(0));
        } else {
            CHECK_EQ(d.tokens, Tokens{c.expect});
            CHECK_EQ(d.sources, std::vector<int>{int(DraftSource::context)});
            CHECK_EQ(d.sizes, std::vector<int>{c.n});
        }
    }
}

TEST(dynamic_uses_strict_thresholds) {
    const Case cases[] = {
        {1, {{20, 3}, {21, 1}}, 20},   // 300 >= 75*4
        {1, {{20, 2}, {21, 1}}, -1},   // sample 3 < 4
        {1, {{20, 5}, {21, 2}}, -1},   // 500 < 75*7
        {1, {{20, 75}, {21, 25}}, 20},
        {1, {{20, 74}, {21, 26}}, -1},
        {2, {{20, 2}, {21, 1}}, 20},   // 200 >= 66*3
        {2, {{20, 2}}, -1},            // sample 2 < 3
        {2, {{20, 3}}, 20},
        {2, {{20, 65}, {21, 35}}, -1},
        {2, {{20, 66}, {21, 34}}, 20},
        {3, {{20, 2}}, 20},
        {3, {{20, 1}}, -1},
        {3, {{20, 2}, {21, 1}}, 20},
        {3, {{20, 1}, {21, 1}}, -1},   // a tie fails 66 %
        {4, {{20, 2}}, 20},
        {4, {{20, 1}}, -1},
    };
    for (const Case& c : cases) {
        check::note() = "key size " + std::to_string(c.n) + ", expect " + std::to_string(c.expect);
        NgramCache ctx, dyn;
        put(dyn, suffix(c.n), c.part);
        const Drafted d = run_plain(kInp, 1, ctx, &dyn);
        if (c.expect < 0) {
            CHECK_EQ(d.tokens.size(), size_t(0));
        } else {
            CHECK_EQ(d.tokens, Tokens{c.expect});
            CHECK_EQ(d.sources, std::vector<int>{int(DraftSource::dynamic)});
            CHECK_EQ(d.sizes, std::vector<int>{c.n});
        }
        // The same part as context passes wherever the strict test passes.
        NgramCache as_ctx;
        put(as_ctx, suffix(c.n), c.part);
        if (c.expect >= 0) CHECK_EQ(run_plain(kInp, 1, as_ctx).tokens, Tokens{c.expect});
    }
}

TEST(static_thresholds_and_tie_rule) {
    const Case cases[] = {
        {2, {{20, 1}}, -1},                    // sample 1 < 2
        {2, {{20, 2}}, 20},
        {2, {{20, 1}, {21, 1}}, 21},           // tie: the later token
        {2, {{21, 1}, {20, 1}}, 20},
        {2, {{20, 1}, {21, 1}, {22, 1}}, -1},  // 100 < 50*3
        {2, {{20, 2}, {21, 1}, {22, 1}}, 20},  // 200 >= 50*4
        {2, {{20, 1}, {21, 2}, {22, 1}}, 21},
    };
    for (const Case& c : cases) {
        check::note() = "static part, expect " + std::to_string(c.expect);
        NgramCache ctx, st;
        put(st, suffix(2), c.part);
        const StaticTable table = StaticTable::from_cache(st, 2);
        const Drafted a = run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st});
        const Drafted b = run(kInp, 1, 1, 4, ctx, nullptr, table);
        CHECK_EQ(a, b);
        if (c.expect < 0) {
            CHECK_EQ(a.tokens.size(), size_t(0));
        } else {
            CHECK_EQ(a.tokens, Tokens{c.expect});
            CHECK_EQ(a.sources, std::vector<int>{int(DraftSource::statik)});
            CHECK_EQ(a.sizes, std::vector<int>{2});
        }
    }
}

TEST(longest_ngram_first_then_shorter_then_next_cache) {
    NgramCache ctx, dyn;
    put(ctx, suffix(1), {{30, 2}});
    put(ctx, suffix(2), {{31, 1}, {32, 1}, {33, 1}});  // fails
    put(ctx, suffix(3), {{34, 1}});
    Drafted d = run_plain(kInp, 1, ctx);
    CHECK_EQ(d.tokens, Tokens{34});
    CHECK_EQ(d.sizes, std::vector<int>{3});

    NgramCache ctx2;
    put(ctx2, suffix(1), {{30, 2}});
    put(ctx2, suffix(2), {{31, 1}, {32, 1}, {33, 1}});
    put(dyn, suffix(4), {{41, 9}});
    d = run_plain(kInp, 1, ctx2, &dyn);
    CHECK_EQ(d.tokens, Tokens{30});  // a passing context 1-gram beats a dynamic 4-gram
    CHECK_EQ(d.sources, std::vector<int>{int(DraftSource::context)});
    CHECK_EQ(d.sizes, std::vector<int>{1});

    NgramCache ctx3;
    put(ctx3, suffix(1), {{30, 1}, {35, 1}});  // fails: context falls through to dynamic
    d = run_plain(kInp, 1, ctx3, &dyn);
    CHECK_EQ(d.tokens, Tokens{41});
    CHECK_EQ(d.sources, std::vector<int>{int(DraftSource::dynamic)});
    CHECK_EQ(d.sizes, std::vector<int>{4});
}

TEST(drafting_stops_at_the_first_failure) {
    NgramCache ctx;
    put(ctx, {13}, {{20, 2}});
    put(ctx, {20}, {{21, 2}});
    put(ctx, {21}, {{22, 1}});  // fails: 22 is never drafted, nor what would follow it
    put(ctx, {22}, {{23, 5}});
    const Drafted d = run_plain(kInp, 5, ctx);
    CHECK_EQ(d.tokens, (Tokens{20, 21}));
    CHECK_EQ(d.sizes, (std::vector<int>{1, 1}));
    CHECK_EQ(run_plain(kInp, 1, ctx).tokens, Tokens{20});  // n_draft bounds the count
}

TEST(drafted_tokens_extend_the_keys) {
    // After drafting 20 the keys are the suffixes of 10 11 12 13 20.
    NgramCache ctx;
    put(ctx, {13}, {{20, 2}});
    put(ctx, {11, 12, 13, 20}, {{50, 1}});
    put(ctx, {50}, {{51, 2}});
    put(ctx, {13, 20, 50}, {{52, 1}});
    const Drafted d = run_plain(kInp, 8, ctx);
    CHECK_EQ(d.tokens, (Tokens{20, 50, 52}));
    CHECK_EQ(d.sizes, (std::vector<int>{1, 4, 3}));
}

TEST(static_reranks_context_candidates) {
    // Without static weights the tie goes to 21 (seen later).
    NgramCache ctx, st;
    put(ctx, suffix(2), {{20, 1}, {21, 1}});
    CHECK_EQ(run_plain(kInp, 1, ctx).tokens, Tokens{21});
    // A static count makes 20 score 100 against 21's 1.
    put(st, suffix(2), {{20, 1}});
    Drafted d = run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st});
    CHECK_EQ(d.tokens, Tokens{20});
    CHECK_EQ(d.sources, std::vector<int>{int(DraftSource::context)});
    const StaticTable table = StaticTable::from_cache(st, 2);
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, table), d);
}

TEST(percent_test_uses_the_best_scored_tokens_count) {
    // 21 wins on score (1 * 100 > 3 * 1) but its count 1 fails 50 % of 4; the static part
    // alone (sample 1) fails too, so nothing is drafted. Without static, 20 passes.
    NgramCache ctx, st;
    put(ctx, suffix(2), {{20, 3}, {21, 1}});
    put(st, suffix(2), {{21, 1}});
    CHECK_EQ(run_plain(kInp, 1, ctx).tokens, Tokens{20});
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st}).tokens.size(), size_t(0));
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, StaticTable::from_cache(st, 2)).tokens.size(), size_t(0));
}

TEST(score_ties_go_to_the_token_first_seen_latest) {
    // 20 scores 100 * 1, 21 scores 1 * 100: the later-seen token wins, and the percent
    // test then decides with its count.
    NgramCache st;
    put(st, suffix(2), {{21, 1}});
    {
        NgramCache ctx;
        put(ctx, suffix(2), {{20, 100}, {21, 1}});  // 21 wins the tie, 1 of 101 fails
        CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st}).tokens.size(), size_t(0));
    }
    {
        NgramCache ctx;
        put(ctx, suffix(2), {{21, 1}, {20, 100}});  // 20 wins the tie and passes
        CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st}).tokens, Tokens{20});
    }
}

TEST(huge_counts_times_huge_static_counts_do_not_wrap) {
    // 21 scores (2^31 - 2) * 100 * (2^31 - 1), about 4.6e20: beyond 64 bits, where it would
    // wrap to a negative number and lose to 20's 1000. The static part alone fails (the
    // best of 2^32 - 1 is under 50 %), so only the exact product drafts 21.
    NgramCache ctx, st;
    put(ctx, suffix(2), {{20, 1000}, {21, INT32_MAX - 1}});
    put(st, suffix(2), {{21, INT32_MAX}, {22, 1 << 30}, {23, 1 << 30}});
    const Drafted want{{21}, {int(DraftSource::context)}, {2}};
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, CacheAsStatic{&st}), want);
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, StaticTable::from_cache(st, 2)), want);
    NgramCache no_ctx;
    CHECK_EQ(run(kInp, 1, 1, 4, no_ctx, nullptr, CacheAsStatic{&st}).tokens.size(), size_t(0));
}

TEST(tie_rule_is_llama_cpp_s_map_order) {
    // (1 5) is followed by 20, 21, 21, 20: counts tie; llama.cpp's map of the part visits
    // 21 first (inserted later), although 20 was seen last.
    const Tokens s = {1, 5, 20, 1, 5, 21, 1, 5, 21, 1, 5, 20};
    NgramCache ctx;
    ctx.update(s.data(), s.size(), 1, 4, s.size());
    const Drafted d = run(Tokens{1, 5}, 1, 1, 2, ctx, nullptr, NoStatic{});
    CHECK_EQ(d.tokens, Tokens{21});
    CHECK_EQ(d.sizes, std::vector<int>{2});
    // The static table built from the same stream is the lookup.bin llama-lookup-create
    // writes (21 then 20) as llama.cpp loads it: 20 first.
    const StaticTable t = StaticTable::build(s.data(), s.size(), 2);
    NgramCache empty;
    CHECK_EQ(run(Tokens{1, 5}, 1, 1, 4, empty, nullptr, t).tokens, Tokens{20});
}

TEST(thresholds_are_indexed_from_ngram_min) {
    NgramCache ctx;
    put(ctx, suffix(2), {{20, 1}, {21, 1}});
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, nullptr, NoStatic{}).tokens, Tokens{21});      // 50 % (index 1)
    CHECK_EQ(run(kInp, 1, 2, 4, ctx, nullptr, NoStatic{}).tokens.size(), size_t(0)); // 66 % (index 0)
    CHECK_EQ(run(kInp, 1, 1, 1, ctx, nullptr, NoStatic{}).tokens.size(), size_t(0)); // 2-grams not asked
}

TEST(ngram_longer_than_the_sequence_is_not_found) {
    NgramCache ctx;
    put(ctx, {12, 13}, {{20, 2}});
    put(ctx, {12, 13, 20}, {{25, 1}});
    put(ctx, {12, 13, 20, 25}, {{26, 1}});
    // Two tokens: the 3- and 4-gram keys do not exist yet; the 2-gram drafts 20, then the
    // 3-gram (12 13 20) fits, then the 4-gram.
    const Drafted d = run_plain({12, 13}, 3, ctx);
    CHECK_EQ(d.tokens, (Tokens{20, 25, 26}));
    CHECK_EQ(d.sizes, (std::vector<int>{2, 3, 4}));

    NgramCache fails;
    put(fails, {12, 13}, {{20, 1}, {21, 1}, {22, 1}});
    put(fails, {13}, {{20, 1}});
    CHECK_EQ(run_plain({12, 13}, 3, fails).tokens.size(), size_t(0));
    CHECK_EQ(run_plain({13}, 3, ctx).tokens.size(), size_t(0));
}

// llama.cpp's keys that reach before a 2- or 3-token sequence read its heap (draft.hpp):
// given those reads, the keys are found; the slot read once the draft vector has grown is
// a read of its own.
TEST(keys_before_the_start_read_what_llama_cpp_reads) {
    NgramCache ctx;
    put(ctx, {7, 8, 12, 13}, {{20, 1}});
    put(ctx, {9, 12, 13, 20}, {{21, 1}});
    put(ctx, {6, 12, 13, 14}, {{22, 1}});
    std::vector<token_t> out(4);
    LlamaOobReads reads;
    reads.before2[0] = 7, reads.before2[1] = 8, reads.before2_grown = 9, reads.before3 = 6;
    const token_t two[2] = {12, 13}, three[3] = {12, 13, 14};
    CHECK_EQ(draft(two, 2, 3, 1, 4, ctx, nullptr, NoStatic{}, out.data(), nullptr, &reads), size_t(2));
    CHECK_EQ(out[0], 20);
    CHECK_EQ(out[1], 21);
    CHECK_EQ(draft(three, 3, 3, 1, 4, ctx, nullptr, NoStatic{}, out.data(), nullptr, &reads), size_t(1));
    CHECK_EQ(out[0], 22);
    // the grown buffer's slot read as the first one: (8 12 13 20) is not a key
    reads.before2_grown = 8;
    CHECK_EQ(draft(two, 2, 3, 1, 4, ctx, nullptr, NoStatic{}, out.data(), nullptr, &reads), size_t(1));
    // the usual reads (33, 0) find none of these keys, and without reads nothing is found
    const LlamaOobReads usual;
    CHECK_EQ(draft(two, 2, 3, 1, 4, ctx, nullptr, NoStatic{}, out.data(), nullptr, &usual), size_t(0));
    CHECK_EQ(draft(two, 2, 3, 1, 4, ctx, nullptr, NoStatic{}, out.data()), size_t(0));
}

TEST(oob_reads_come_from_rows_in_their_documented_order) {
    // rows: S[-2] and S[-1] before 2 tokens, S[-1] there once grown, S[-1] before 3 tokens
    const token_t rows[8] = {7, 8, 9, 6, 1, 2, 3, 4};
    const std::vector<LlamaOobReads> r = oob_reads_from_rows(rows, 2);
    CHECK_EQ(r.size(), size_t(2));
    CHECK_EQ(r[0].before2[0], 7);
    CHECK_EQ(r[0].before2[1], 8);
    CHECK_EQ(r[0].before2_grown, 9);
    CHECK_EQ(r[0].before3, 6);
    CHECK_EQ(r[1].before2[0], 1);
    CHECK_EQ(r[1].before2[1], 2);
    CHECK_EQ(r[1].before2_grown, 3);
    CHECK_EQ(r[1].before3, 4);
    CHECK(oob_reads_from_rows(rows, 0).empty());
}

TEST(fewer_than_two_tokens_or_zero_n_draft_draft_nothing) {
    NgramCache ctx, dyn, st;
    put(ctx, {13}, {{20, 9}});
    put(dyn, {13}, {{20, 9}});
    put(st, {12, 13}, {{20, 9}});
    CHECK_EQ(run({13}, 4, 1, 4, ctx, &dyn, CacheAsStatic{&st}).tokens.size(), size_t(0));
    CHECK_EQ(run({}, 4, 1, 4, ctx, &dyn, CacheAsStatic{&st}).tokens.size(), size_t(0));
    CHECK_EQ(run(kInp, 0, 1, 4, ctx, &dyn, CacheAsStatic{&st}).tokens.size(), size_t(0));
    CHECK_EQ(run(kInp, 1, 1, 4, ctx, &dyn, CacheAsStatic{&st}).tokens, Tokens{20});
    token_t out[2] = {-7, -7};
    CHECK_EQ(draft(kInp.data(), kInp.size(), 0, 1, 4, ctx, &dyn, NoStatic{}, out), size_t(0));
    CHECK_EQ(out[0], -7);
    CHECK_EQ(draft(kInp.data(), kInp.size(), 1, 1, 4, ctx, &dyn, NoStatic{}, out), size_t(1));  // steps optional
    CHECK_EQ(out[0], 20);
}

TEST(bad_ngram_sizes_throw) {
    NgramCache ctx;
    token_t out[4];
    CHECK_THROWS_AS(draft(kInp.data(), kInp.size(), 3, 0, 4, ctx, nullptr, NoStatic{}, out), InputError,
                    "ngram_min=0");
    CHECK_THROWS_AS(draft(kInp.data(), kInp.size(), 3, 1, 5, ctx, nullptr, NoStatic{}, out), InputError,
                    "ngram_max=5");
    CHECK_THROWS_AS(draft(kInp.data(), kInp.size(), 3, 3, 2, ctx, nullptr, NoStatic{}, out), InputError,
                    "ngram_min=3");
}

// ---- random comparison with the reference ----------------------------------------------

TEST(matches_reference_on_random_streams) {
    std::mt19937 rng(20);
    int64_t by_source[3] = {0, 0, 0}, reranked = 0, calls = 0;
    for (int round = 0; round < 36; ++round) {
        const token_t vocab = token_t(2 + round % 5);
        const Tokens text = test::random_stream(rng, 40 + rng() % 160, vocab);
        const Tokens other = test::random_stream(rng, rng() % 300, vocab);
        const Tokens corpus = test::random_stream(rng, rng() % 400, vocab);
        NgramCache dyn, st;
        RefCache rdyn, rst;
        dyn.update(other.data(), other.size(), 1, 4, other.size());
        rdyn.update(other, other.size(), 1, 4, other.size());
        st.update(corpus.data(), corpus.size(), 2, 2, corpus.size());
        rst.update(corpus, corpus.size(), 2, 2, corpus.size());
        const StaticTable built = StaticTable::build(corpus.data(), corpus.size(), 2);
        const RefCache rst_loaded = rst.as_loaded();
        const int nmin = round % 4 == 3 ? 2 : 1, nmax = round % 3 == 2 ? 3 : 4;
        // The context cache grows one token at a time, as in generation.
        NgramCache ctx;
        RefCache rctx;
        Tokens inp;
        for (size_t pos = 0; pos < text.size(); ++pos) {
            inp.push_back(text[pos]);
            ctx.update(inp.data(), inp.size(), 1, 4, 1);
            rctx.update(inp, inp.size(), 1, 4, 1);
            const size_t n_draft = rng() % 9;
            check::note() = "round " + std::to_string(round) + " pos " + std::to_string(pos) + " n_draft " +
                            std::to_string(n_draft);
            ++calls;
            const Drafted want_plain = ref_draft(inp, n_draft, nmin, nmax, rctx, nullptr, nullptr);
            CHECK_EQ(run(inp, n_draft, nmin, nmax, ctx, nullptr, NoStatic{}), want_plain);
            const Drafted want = ref_draft(inp, n_draft, nmin, nmax, rctx, &rdyn, &rst);
            CHECK_EQ(run(inp, n_draft, nmin, nmax, ctx, &dyn, CacheAsStatic{&st}), want);
            // A built table decides ties as llama.cpp with the lookup.bin of the corpus.
            CHECK_EQ(run(inp, n_draft, nmin, nmax, ctx, &dyn, built),
                     ref_draft(inp, n_draft, nmin, nmax, rctx, &rdyn, &rst_loaded));
            for (int s : want.sources) ++by_source[s];
            const Drafted ctx_only = ref_draft(inp, n_draft, nmin, nmax, rctx, nullptr, &rst);
            reranked += !want_plain.tokens.empty() && !ctx_only.tokens.empty() && ctx_only.sources[0] == 0 &&
                        want_plain.tokens[0] != ctx_only.tokens[0];
        }
    }
    // The comparison covered every source and static re-ranking.
    CHECK(calls > 3000);
    CHECK(by_source[0] > 1000);
    CHECK(by_source[1] > 100);
    CHECK(by_source[2] > 100);
    CHECK(reranked > 20);
}

CHECK_MAIN()
