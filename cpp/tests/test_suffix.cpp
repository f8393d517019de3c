// SuffixDrafter and SuffixStore against a brute force that scans every earlier position
// for each proposal (the rule in suffix.hpp's header comment), and the store shared by
// drafters in several threads while another thread adds requests.
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "check.hpp"
#include "ngramcache/suffix.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

namespace {

struct Side {
    size_t m = 0;
    Tokens toks;
    double score = 0;
};

// One side of a proposal: `texts` in the order they were seen (the stamps of the tie
// rule follow it), the sequence `seq`, contexts of at most `dc` tokens.
Side brute_side(const std::vector<Tokens>& texts, const Tokens& seq, size_t dc, double alpha, double min_prob,
                size_t n_max) {
    auto follows = [&](const Tokens& x, std::map<token_t, std::pair<int64_t, int64_t>>& cnt) {
        int64_t base = 0;
        for (const Tokens& s : texts) {
            for (size_t e = x.size() - 1; e + 1 < s.size(); ++e) {
                if (e + 1 < x.size()) continue;
                if (!std::equal(x.begin(), x.end(), s.begin() + static_cast<std::ptrdiff_t>(e + 1 - x.size())))
                    continue;
                auto& c = cnt[s[e + 1]];
                c.first += 1;
                c.second = base + static_cast<int64_t>(e + 1);
            }
            base += static_cast<int64_t>(s.size());
        }
    };
    Side r;
    for (size_t len = std::min(dc, seq.size()); len >= 1; --len) {
        std::map<token_t, std::pair<int64_t, int64_t>> cnt;
        follows(Tokens(seq.end() - static_cast<std::ptrdiff_t>(len), seq.end()), cnt);
        if (!cnt.empty()) {
            r.m = len;
            break;
        }
    }
    if (r.m == 0) return r;
    Tokens x(seq.end() - static_cast<std::ptrdiff_t>(r.m), seq.end());
    const double cap = alpha * static_cast<double>(r.m);
    const size_t limit = cap >= static_cast<double>(n_max) ? n_max : static_cast<size_t>(cap);
    double p = 1.0;
    while (r.toks.size() < limit) {
        std::map<token_t, std::pair<int64_t, int64_t>> cnt;
        follows(x, cnt);
        if (cnt.empty()) break;
        int64_t total = 0;
        token_t best = 0;
        std::pair<int64_t, int64_t> bc{-1, -1};
        for (const auto& [t, c] : cnt) {
            total += c.first;
            if (c > bc) bc = c, best = t;
        }
        p *= static_cast<double>(bc.first) / static_cast<double>(total);
        if (p < min_prob) break;
        r.toks.push_back(best);
        r.score += p;
        x.push_back(best);
        if (x.size() > dc) x.erase(x.begin());
    }
    return r;
}

struct BruteStore {
    size_t max_tokens, depth;
    std::vector<Tokens> reqs;
    void add(const Tokens& t) {
        if (t.empty() || t.size() > max_tokens) return;
        size_t total = t.size();
        for (const auto& r : reqs) total += r.size();
        while (!reqs.empty() && total > max_tokens) {
            total -= reqs.front().size();
            reqs.erase(reqs.begin());
        }
        reqs.push_back(t);
    }
};

struct BruteDrafter {
    size_t depth;
    double alpha, min_prob;
    BruteStore* store;
    Tokens seq;
    void reset(const Tokens& p) {
        if (store && !seq.empty()) store->add(seq);
        seq = p;
    }
    std::pair<Tokens, int> propose(size_t n_max) {
        if (n_max == 0 || seq.empty()) return {{}, 0};
        Side a = brute_side({seq}, seq, depth, alpha, min_prob, n_max);
        if (!store) return {a.toks, a.toks.empty() ? 0 : static_cast<int>(a.m)};
        Side b = brute_side(store->reqs, seq, std::min(depth, store->depth), alpha, min_prob, n_max);
        if (!b.toks.empty() && (a.toks.empty() || b.m > a.m || (b.m == a.m && b.score > a.score)))
            return {b.toks, static_cast<int>(b.m)};
        return {a.toks, a.toks.empty() ? 0 : static_cast<int>(a.m)};
    }
};

Tokens propose(SuffixDrafter& d, size_t n) {
    Tokens out(n + 1);
    out.resize(d.propose(n, out.data()));
    return out;
}

// Replays `reqs` through both drafters, accepting the true text in random batches.
void compare(std::mt19937& rng, const std::vector<Tokens>& reqs, size_t depth, double alpha, double min_prob,
             size_t max_tokens, size_t store_depth, bool with_store) {
    std::shared_ptr<SuffixStore> store;
    BruteStore bstore{max_tokens, store_depth, {}};
    if (with_store) store = std::make_shared<SuffixStore>(max_tokens, store_depth);
    SuffixDrafter d(depth, alpha, min_prob, store);
    BruteDrafter b{depth, alpha, min_prob, with_store ? &bstore : nullptr, {}};
    std::uniform_int_distribution<size_t> batch(1, 4), nmax(0, 12);
    for (size_t r = 0; r < reqs.size(); ++r) {
        const Tokens& t = reqs[r];
        const size_t np = std::min<size_t>(t.size(), batch(rng));
        d.reset(t.data(), np);
        b.reset(Tokens(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(np)));
        if (store) CHECK_EQ(store->n_requests(), bstore.reqs.size());
        size_t have = np;
        while (true) {
            const size_t n = nmax(rng);
            check::note() = "request " + std::to_string(r) + " at " + std::to_string(have) + " n_max " +
                            std::to_string(n);
            const auto want = b.propose(n);
            CHECK_EQ(propose(d, n), want.first);
            CHECK_EQ(d.confidence(), want.second);
            if (have == t.size()) break;
            if (store) CHECK(store->consistent());
            CHECK(d.consistent());
            const size_t k = std::min(t.size() - have, batch(rng));
            d.accept(t.data() + have, k);
            b.seq.insert(b.seq.end(), t.begin() + static_cast<std::ptrdiff_t>(have),
                         t.begin() + static_cast<std::ptrdiff_t>(have + k));
            have += k;
        }
    }
    check::note().clear();
}

// A stream with repeats: random tokens and copies of earlier stretches.
Tokens repetitive(std::mt19937& rng, size_t n, token_t vocab) {
    Tokens t;
    std::uniform_int_distribution<token_t> tok(0, vocab - 1);
    std::uniform_int_distribution<int> coin(0, 3);
    while (t.size() < n) {
        if (t.size() > 8 && coin(rng) == 0) {
            std::uniform_int_distribution<size_t> at(0, t.size() - 4), len(2, 12);
            const size_t a = at(rng), l = std::min(len(rng), t.size() - a);
            for (size_t i = 0; i < l && t.size() < n; ++i) t.push_back(t[a + i]);
        } else {
            t.push_back(tok(rng));
        }
    }
    return t;
}

}  // namespace

TEST(hand_worked_example) {
    // 1 2 3 9 1 2 4 8 1 2 3 7 1 2: the longest earlier suffix is "1 2", followed by 3, 4,
    // 3 -> 3 (P = 2/3); "1 2 3" by 9 and 7, once each -> 7, the later (P = 1/3); "1 2 3 7"
    // once, by 1 (P stays 1/3).
    const Tokens t = {1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2};
    SuffixDrafter d(64, 10.0, 0.0);
    d.reset(t.data(), t.size());
    CHECK_EQ(propose(d, 3), (Tokens{3, 7, 1}));
    CHECK_EQ(d.confidence(), 2);
    // min_prob 0.5 stops before the second token
    SuffixDrafter e(64, 10.0, 0.5);
    e.reset(t.data(), t.size());
    CHECK_EQ(propose(e, 8), (Tokens{3}));
    // alpha caps the length: floor(0.5 * 2) = 1
    SuffixDrafter f(64, 0.5, 0.0);
    f.reset(t.data(), t.size());
    CHECK_EQ(propose(f, 8), (Tokens{3}));
    // min_prob 0.7 stops before the first token (2/3 < 0.7): nothing, confidence 0
    SuffixDrafter g(64, 10.0, 0.7);
    g.reset(t.data(), t.size());
    CHECK_EQ(propose(g, 8), Tokens{});
    CHECK_EQ(g.confidence(), 0);
}

TEST(equal_counts_take_the_latest_seen) {
    const Tokens t = {5, 7, 5, 8, 5};  // 7 and 8 once each after 5: 8 is the later
    SuffixDrafter d(64, 8.0, 0.0);
    d.reset(t.data(), t.size());
    CHECK_EQ(propose(d, 1), Tokens{8});
}

TEST(matches_brute_force_without_store) {
    std::mt19937 rng(11);
    for (int it = 0; it < 60; ++it) {
        const token_t vocab = 2 + static_cast<token_t>(it % 5);
        const size_t depth = 1 + static_cast<size_t>(it % 7);
        std::vector<Tokens> reqs = {repetitive(rng, 40 + it, vocab), test::random_stream(rng, 30, vocab)};
        compare(rng, reqs, depth, 0.5 + (it % 4), (it % 3) * 0.15, 1000, 64, false);
    }
}

TEST(matches_brute_force_with_store_and_eviction) {
    std::mt19937 rng(12);
    for (int it = 0; it < 40; ++it) {
        const token_t vocab = 2 + static_cast<token_t>(it % 4);
        std::vector<Tokens> reqs;
        for (int r = 0; r < 6; ++r) reqs.push_back(repetitive(rng, 5 + (rng() % 30), vocab));
        const size_t depth = 1 + static_cast<size_t>(it % 6), store_depth = 1 + static_cast<size_t>((it / 2) % 6);
        compare(rng, reqs, depth, 1.0 + (it % 3), (it % 2) * 0.2, 25 + (it % 4) * 15, store_depth, true);
    }
}

TEST(matches_brute_force_with_long_copies_between_requests) {
    // Requests that copy long stretches of earlier ones: matches run far below the
    // store's leaves, past max_depth, and across evictions.
    std::mt19937 rng(33);
    for (int it = 0; it < 6; ++it) {
        const token_t vocab = 3 + static_cast<token_t>(it * 3);
        std::vector<Tokens> reqs{repetitive(rng, 60, vocab)};
        for (int r = 1; r < 5; ++r) {
            Tokens t = repetitive(rng, 10, vocab);
            const Tokens& src = reqs[rng() % reqs.size()];
            const size_t a = rng() % (src.size() / 2);
            t.insert(t.end(), src.begin() + static_cast<std::ptrdiff_t>(a), src.end());
            const Tokens tail = repetitive(rng, 10, vocab);
            t.insert(t.end(), tail.begin(), tail.end());
            reqs.push_back(t);
        }
        const size_t depth = 8 + static_cast<size_t>(it % 3) * 4, store_depth = 6 + static_cast<size_t>(it % 2) * 6;
        compare(rng, reqs, depth, 2.0 + it % 3, (it % 2) * 0.1, 150, store_depth, true);
        compare(rng, reqs, depth, 2.0 + it % 3, (it % 2) * 0.1, 150, store_depth, false);
    }
}

TEST(store_forgets_evicted_requests_entirely) {
    // after evicting everything, the trie holds exactly what a fresh store would
    SuffixStore s(10, 4);
    std::mt19937 rng(3);
    for (int i = 0; i < 50; ++i) {
        Tokens t = test::random_stream(rng, 1 + rng() % 10, 3);
        s.add(t.data(), t.size());
        CHECK(s.n_tokens() <= 10);
    }
    const Tokens big(11, 1);
    const size_t before = s.n_requests();
    s.add(big.data(), big.size());  // longer than the bound: ignored
    CHECK_EQ(s.n_requests(), before);
    const Tokens last(10, 2);
    s.add(last.data(), last.size());
    CHECK_EQ(s.n_requests(), size_t(1));
    SuffixStore fresh(10, 4);
    fresh.add(last.data(), last.size());
    CHECK_EQ(s.n_nodes(), fresh.n_nodes());
}

TEST(stamps_moved_down_keep_every_proposal) {
    // A store whose 32-bit stamps are moved down every few requests proposes exactly what
    // one that never moves them does, ties (which read the stamps) included.
    std::mt19937 rng(21);
    for (int it = 0; it < 20; ++it) {
        auto plain = std::make_shared<SuffixStore>(60, 4);
        auto moved = std::make_shared<SuffixStore>(60, 4, 61 + static_cast<uint64_t>(it % 5) * 7);
        SuffixDrafter a(4, 2.0, 0.0, plain), b(4, 2.0, 0.0, moved);
        for (int r = 0; r < 30; ++r) {
            const Tokens t = repetitive(rng, 3 + rng() % 25, 2 + static_cast<token_t>(it % 3));
            a.reset(t.data(), 1);
            b.reset(t.data(), 1);
            for (size_t i = 1; i <= t.size(); ++i) {
                check::note() = "it " + std::to_string(it) + " request " + std::to_string(r) + " at " +
                                std::to_string(i);
                CHECK_EQ(propose(a, 8), propose(b, 8));
                CHECK_EQ(a.confidence(), b.confidence());
                if (i < t.size()) {
                    a.accept(&t[i], 1);
                    b.accept(&t[i], 1);
                }
            }
        }
        CHECK_EQ(plain->n_nodes(), moved->n_nodes());
    }
    check::note().clear();
    // a stamp range smaller than the store's bound cannot hold it
    SuffixStore tight(50, 4, 20);
    const Tokens t(15, 1);
    tight.add(t.data(), t.size());
    CHECK_THROWS_AS(tight.add(t.data(), t.size()), std::length_error, "too many tokens");
}

TEST(memory_is_counted) {
    SuffixStore s(1000, 8);
    const size_t empty = s.memory_bytes();
    std::mt19937 rng(4);
    const Tokens t = test::random_stream(rng, 500, 50);
    s.add(t.data(), t.size());
    CHECK(s.memory_bytes() >= empty + s.n_nodes() * 40 + t.size() * sizeof(token_t));
    SuffixDrafter d(8);
    const size_t d0 = d.memory_bytes();
    d.reset(t.data(), t.size());
    CHECK(d.memory_bytes() >= d0 + d.n_nodes() * 40 + t.size() * sizeof(token_t));
    // text that does not repeat: a few nodes a token, not max_depth + 1
    CHECK(d.n_nodes() < 3 * t.size());
    CHECK(s.n_nodes() < 3 * t.size());
}

TEST(bad_arguments) {
    CHECK_THROWS_AS(SuffixDrafter(0), InputError, "max_depth");
    CHECK_THROWS_AS(SuffixDrafter(64, 0.0), InputError, "alpha");
    CHECK_THROWS_AS(SuffixDrafter(64, 1.0, 1.5), InputError, "min_prob");
    CHECK_THROWS_AS(SuffixStore(0), InputError, "max_tokens");
    CHECK_THROWS_AS(SuffixStore(10, kSuffixMaxDepth + 1), InputError, "max_depth");
}

TEST(store_shared_by_threads) {
    // Readers propose from one store while a writer adds requests; then, with the store
    // still, every reader proposes what a single thread does.
    std::mt19937 rng(5);
    auto store = std::make_shared<SuffixStore>(3000, 16);
    std::vector<Tokens> reqs;
    for (int i = 0; i < 12; ++i) reqs.push_back(repetitive(rng, 400, 6));
    for (int i = 0; i < 4; ++i) store->add(reqs[i].data(), reqs[i].size());
    const int n_readers = 4;
    std::atomic<bool> stop{false};
    std::vector<std::vector<Tokens>> seen(n_readers);
    auto reader = [&](int id) {
        SuffixDrafter d(16, 4.0, 0.05, store);
        const Tokens& t = reqs[(id + 5) % reqs.size()];
        d.reset(t.data(), 1);
        for (size_t i = 1; i < t.size(); ++i) {
            Tokens out(17);
            out.resize(d.propose(16, out.data()));
            seen[id].push_back(out);
            d.accept(&t[i], 1);
        }
    };
    std::thread writer([&] {
        for (int i = 4; i < 12 && !stop; ++i) store->add(reqs[i].data(), reqs[i].size());
    });
    std::vector<std::thread> ts;
    for (int i = 0; i < n_readers; ++i) ts.emplace_back(reader, i);
    for (auto& t : ts) t.join();
    stop = true;
    writer.join();
    CHECK(store->n_tokens() <= 3000);
    // the store is still now: concurrent proposals equal sequential ones
    std::vector<std::vector<Tokens>> seq_seen(n_readers);
    seen.swap(seq_seen);
    for (int i = 0; i < n_readers; ++i) reader(i);
    std::vector<std::vector<Tokens>> sequential = seen;
    for (auto& s : seen) s.clear();
    ts.clear();
    for (int i = 0; i < n_readers; ++i) ts.emplace_back(reader, i);
    for (auto& t : ts) t.join();
    CHECK_EQ(seen.size(), sequential.size());
    for (int i = 0; i < n_readers; ++i) CHECK(seen[i] == sequential[i]);
}

CHECK_MAIN()
