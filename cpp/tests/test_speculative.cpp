// llama.cpp's ngram-simple, ngram-map-k/k4v and ngram-mod drafters (ngram_simple.hpp,
// ngram_map.hpp, ngram_mod.hpp), their sequence-protocol adapter and the shared ngram-mod
// table under 8 threads. The Python tests replay llama.cpp's own drafts; here the
// indexed searches are held against the scans they replace.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/ngram_map.hpp"
#include "ngramcache/ngram_mod.hpp"
#include "ngramcache/ngram_simple.hpp"
#include "ngramcache/sequence_adapter.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

// common_ngram_simple_draft as written in llama.cpp: a backward scan.
static Tokens simple_scan(const Tokens& tokens, token_t sampled, size_t n, size_t m) {
    const size_t cur = tokens.size();
    if (cur <= n + m + 1) return {};
    Tokens pattern(tokens.begin() + static_cast<long>(cur - n + 1), tokens.end());
    pattern.push_back(sampled);
    size_t match = 0;
    for (size_t j = cur - n - 1; j >= 1; --j)
        if (std::equal(pattern.begin(), pattern.end(), tokens.begin() + static_cast<long>(j))) {
            match = j;
            break;
        }
    if (match == 0) return {};
    const size_t copy = std::min(m, cur - (match + n));
    if (copy < n) return {};
    return Tokens(tokens.begin() + static_cast<long>(match + n), tokens.begin() + static_cast<long>(match + n + copy));
}

// ngram-mod's draft loop with every hash computed from scratch (no rolling).
static Tokens mod_naive(const NgramModTable& t, const Tokens& prompt, token_t id_last, size_t n, size_t n_min,
                        size_t n_max) {
    if (prompt.size() < n) return {};
    Tokens w(prompt.end() - static_cast<long>(n - 1), prompt.end());
    w.push_back(id_last);
    Tokens out;
    for (size_t i = 0; i < n_max; ++i) {
        const int32_t tok = t.get(w.data() + w.size() - n, n);
        if (tok == -1) {
            if (i < n_min) return {};
            break;
        }
        out.push_back(tok);
        w.push_back(tok);
    }
    return out;
}

// A stream with repeats: random tokens from a small vocabulary, with copied stretches.
static Tokens repetitive(std::mt19937& rng, size_t len, token_t vocab) {
    Tokens t = test::random_stream(rng, len, vocab);
    std::uniform_int_distribution<size_t> pos(0, len - 1), span(1, 40);
    for (int k = 0; k < 20; ++k) {
        const size_t a = pos(rng), b = pos(rng), l = std::min({span(rng), len - a, len - b});
        std::copy(t.begin() + static_cast<long>(a), t.begin() + static_cast<long>(a + l), t.begin() + static_cast<long>(b));
    }
    return t;
}

TEST(simple_equals_the_scan_at_every_position) {
    std::mt19937 rng(1);
    const size_t sizes[][2] = {{1, 1}, {1, 4}, {2, 3}, {3, 8}, {4, 2}, {2, 1}, {12, 48}, {3, 3}};
    for (const auto& nm : sizes)
        for (token_t vocab : {2, 3, 5}) {
            const Tokens s = repetitive(rng, 600, vocab);
            NgramSimple d(nm[0], nm[1]);
            std::vector<token_t> out;
            for (size_t pos = 1; pos <= s.size(); ++pos) {
                check::note() = "n=" + std::to_string(nm[0]) + " m=" + std::to_string(nm[1]) + " vocab=" +
                                std::to_string(vocab) + " pos=" + std::to_string(pos);
                d.draft(s.data(), pos - 1, s[pos - 1], out);
                const Tokens want = simple_scan(Tokens(s.begin(), s.begin() + static_cast<long>(pos - 1)), s[pos - 1],
                                                nm[0], nm[1]);
                CHECK_EQ(out, want);
            }
        }
}

TEST(simple_follows_a_rewritten_prompt) {
    // prompts that shrink, change in the middle and grow again: the index follows
    std::mt19937 rng(2);
    for (size_t n : {1, 2, 3}) {
        const Tokens base = repetitive(rng, 400, 3);
        NgramSimple d(n, 5);
        Tokens prompt;
        std::uniform_int_distribution<size_t> cut(0, 399);
        std::vector<token_t> out;
        for (int step = 0; step < 300; ++step) {
            if (step % 7 == 0) {
                prompt.resize(std::min(prompt.size(), cut(rng)));
                if (!prompt.empty() && step % 2 == 0) prompt[prompt.size() / 2] ^= 1;
            }
            prompt.push_back(base[(prompt.size() * 7 + static_cast<size_t>(step)) % base.size()]);
            const token_t id = base[static_cast<size_t>(step) % base.size()];
            d.draft(prompt.data(), prompt.size(), id, out);
            check::note() = "n=" + std::to_string(n) + " step=" + std::to_string(step);
            CHECK_EQ(out, simple_scan(prompt, id, n, 5));
        }
    }
}

TEST(window_index_truncate_restores_the_index_of_the_prefix) {
    std::mt19937 rng(3);
    const Tokens s = test::random_stream(rng, 300, 3);
    for (size_t n : {1, 2, 4}) {
        WindowIndex a(n), b(n);
        a.extend(s.data(), 300);
        a.truncate(137);
        b.extend(s.data(), 137);
        CHECK_EQ(a.size(), b.size());
        for (size_t j = 0; j + n <= 137; ++j) {
            const auto* ea = a.find(s.data(), s.data() + j);
            const auto* eb = b.find(s.data(), s.data() + j);
            CHECK(ea != nullptr && eb != nullptr);
            CHECK_EQ(ea->first, eb->first);
            CHECK_EQ(ea->last, eb->last);
            CHECK_EQ(a.prev(static_cast<uint32_t>(j)), b.prev(static_cast<uint32_t>(j)));
            CHECK_EQ(a.next(static_cast<uint32_t>(j)), b.next(static_cast<uint32_t>(j)));
        }
        const Tokens absent(n, 7);
        CHECK(a.find(s.data(), absent.data()) == nullptr);
    }
}

TEST(map_k_drafts_the_continuation_and_ratchets) {
    // n=2, m=3: a key repeated far enough back is found and copied; a draft accepted for
    // 1 token caps the next draft from that key at 1 token.
    Tokens s;
    for (int r = 0; r < 4; ++r)
        for (token_t t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) s.push_back(t + 10 * r);
    Tokens prompt(s.begin(), s.begin() + 20);
    prompt.insert(prompt.end(), {1, 2, 3, 4, 5, 6, 7, 8});
    NgramMap d(2, 3, 1, false);
    std::vector<token_t> out;
    d.draft(prompt.data(), prompt.size(), 9, out);  // key 8 9 occurred at 7
    CHECK_EQ(out, (Tokens{10, 11, 12}));
    d.accept(1);
    prompt.push_back(9);
    d.draft(prompt.data(), prompt.size(), 33, out);  // key 9 33: never seen
    CHECK(out.empty());
    prompt.resize(28);
    d.draft(prompt.data(), prompt.size(), 9, out);  // the same key again
    CHECK_EQ(out, (Tokens{10}));
    CHECK_EQ(d.keys().size(), size_t(1));
    CHECK_EQ(d.keys()[0].key_num, 2u);
}

TEST(map_k_stays_short_of_the_newest_windows) {
    // the match must start before cur-n-m-1: an occurrence inside the last n+m+1 windows
    // is not used
    std::vector<token_t> out;
    const Tokens p = {9, 9, 9, 5, 7};
    NgramMap(1, 1, 1, false).draft(p.data(), p.size(), 5, out);  // 5 at 3 = cur-2: too recent
    CHECK(out.empty());
    const Tokens q = {9, 5, 8, 9, 9};
    NgramMap(1, 1, 1, false).draft(q.data(), q.size(), 5, out);  // 5 at 1 < cur-3
    CHECK_EQ(out, (Tokens{8}));
    // a drafter that has searched up to start 2 does not search there again, even
    // when the prompt was rewritten (without begin)
    NgramMap d(1, 1, 1, false);
    d.draft(p.data(), p.size(), 5, out);
    d.draft(q.data(), q.size(), 5, out);
    CHECK(out.empty());
}

TEST(mod_rolling_hash_equals_the_direct_one) {
    std::mt19937 rng(4);
    for (size_t n : {1, 2, 5, 24}) {
        const Tokens s = repetitive(rng, 3000, 4);
        auto table = std::make_shared<NgramModTable>(1 << 16);
        NgramMod d(table, n, 1, 16);
        NgramModTable naive_table(1 << 16);
        std::vector<token_t> out;
        size_t i_last = 0;
        for (size_t pos = 1; pos <= s.size(); ++pos) {
            const Tokens prompt(s.begin(), s.begin() + static_cast<long>(pos - 1));
            d.draft(prompt.data(), prompt.size(), s[pos - 1], out);
            const size_t cur = prompt.size();
            if (cur >= n && i_last + 32 < cur) {
                for (size_t i = i_last; i < cur - n; ++i) naive_table.add(prompt.data() + i, n);
                i_last = cur - n;
            }
            check::note() = "n=" + std::to_string(n) + " pos=" + std::to_string(pos);
            CHECK_EQ(out, mod_naive(naive_table, prompt, s[pos - 1], n, 1, 16));
            d.accept(out.size());  // all accepted: never a low-acceptance reset
        }
        CHECK_EQ(table->used(), naive_table.used());
        CHECK_EQ(table->resets(), uint64_t(0));
    }
}

TEST(mod_resets_after_five_low_rounds) {
    auto table = std::make_shared<NgramModTable>(1024);
    NgramMod d(table, 2, 1, 4);
    const Tokens p = {1, 2, 3, 1, 2, 3, 1, 2};
    d.begin(p.data(), p.size());
    CHECK(table->used() > 0);
    std::vector<token_t> out;
    for (int r = 0; r < 4; ++r) {
        d.draft(p.data(), p.size(), 3, out);
        CHECK_EQ(out.size(), size_t(4));
        d.accept(0);  // 0/4 < 0.25
    }
    CHECK_EQ(table->resets(), uint64_t(0));
    d.draft(p.data(), p.size(), 3, out);
    d.accept(1);  // 1/4 is not low: the streak restarts
    for (int r = 0; r < 5; ++r) {
        d.draft(p.data(), p.size(), 3, out);
        d.accept(0);
    }
    CHECK_EQ(table->resets(), uint64_t(1));
    CHECK_EQ(table->used(), size_t(0));
    CHECK_EQ(d.i_last(), size_t(0));
}

TEST(bad_parameters_are_input_errors) {
    CHECK_THROWS_AS(NgramSimple(0, 4), InputError, "size_n must be 1 to 1024, got 0");
    CHECK_THROWS_AS(NgramMap(12, 1025), InputError, "size_m must be 1 to 1024");
    CHECK_THROWS_AS(NgramMap(12, 48, 0), InputError, "min_hits");
    CHECK_THROWS_AS(NgramMod(nullptr, 24, 48, 1025), InputError, "n_max must be 0 to 1024");
    CHECK_THROWS_AS(NgramModTable(0), InputError, "1 to 2^32 entries");
}

// The adapter's proposals are what the llama.cpp-shaped drafter drafts in the same loop.
template <class D>
static void check_adapter(D plain, SequenceAdapter<D> seq, const Tokens& s) {
    seq.reset(s.data(), 1);
    size_t have = 1;
    std::vector<token_t> want;
    token_t buf[64];
    while (have < s.size()) {
        plain.draft(s.data(), have - 1, s[have - 1], want);
        const size_t k = seq.propose(64, buf);
        check::note() = "at " + std::to_string(have);
        CHECK_EQ(Tokens(buf, buf + k), Tokens(want.begin(), want.begin() + static_cast<long>(std::min<size_t>(64, want.size()))));
        size_t acc = 0;
        while (acc < k && have + acc < s.size() && s[have + acc] == buf[acc]) ++acc;
        if (!want.empty()) plain.accept(acc);
        const size_t n_new = std::min(acc + 1, s.size() - have);
        // the llama-shaped drafter sees every position the adapter skips over, too
        for (size_t i = 1; i < n_new; ++i) {
            plain.draft(s.data(), have - 1 + i, s[have - 1 + i], want);
            if (!want.empty()) plain.accept(0);
        }
        seq.accept(s.data() + have, n_new);
        have += n_new;
        if (n_new > 1) return;  // the loops part ways after a skipped position
    }
}

TEST(adapter_proposes_what_the_drafter_drafts) {
    std::mt19937 rng(5);
    const Tokens s = repetitive(rng, 2000, 3);
    check_adapter(NgramSimple(3, 8), SequenceAdapter<NgramSimple>(3, 8), s);
    check_adapter(NgramMap(2, 4), SequenceAdapter<NgramMap>(2, 4), s);
    auto t1 = std::make_shared<NgramModTable>(4096), t2 = std::make_shared<NgramModTable>(4096);
    check_adapter(NgramMod(t1, 4, 1, 8), SequenceAdapter<NgramMod>(t2, 4, 1, 8), s);
}

TEST(adapter_replays_like_the_plain_drafter_per_step) {
    // replay_drafter with n_draft = 0: the adapter sees one token per step, so every
    // proposal equals the plain drafter's draft at that position
    std::mt19937 rng(6);
    const Tokens s = repetitive(rng, 3000, 3);
    SequenceAdapter<NgramSimple> seq(2, 6);
    const ReplayOptions o = test::replay_options(2999, 6);
    auto r = replay_drafter(seq, s.data(), s.size(), o);
    CHECK(r.n_drafted > 0);
    CHECK(r.n_accept > 0);
    // the same through a hand loop with the plain drafter
    NgramSimple plain(2, 6);
    int64_t drafted = 0, accepted = 0;
    size_t have = 1;
    std::vector<token_t> d;
    while (have < 2999) {
        plain.draft(s.data(), have - 1, s[have - 1], d);
        const size_t k = std::min<size_t>(6, d.size());
        size_t acc = 0;
        while (acc < k && have + acc < 2999 && s[have + acc] == d[acc]) ++acc;
        drafted += static_cast<int64_t>(k);
        accepted += static_cast<int64_t>(acc);
        have += std::min(acc + 1, 2999 - have);
    }
    CHECK_EQ(r.n_drafted, drafted);
    CHECK_EQ(r.n_accept, accepted);
}

// extend_history against its definition: the history becomes prompt[:start] + tokens when
// it was prompt[:start] + a prefix of tokens, and stays as it was otherwise.
template <class D>
static void check_extend(D& d, std::mt19937& rng) {
    for (int round = 0; round < 400; ++round) {
        const Tokens prompt = test::random_stream(rng, rng() % 40, 2);
        // the history: a prefix of the prompt, sometimes with a token changed or one too many
        Tokens hist(prompt.begin(), prompt.begin() + static_cast<long>(rng() % (prompt.size() + 1)));
        if (!hist.empty() && rng() % 4 == 0) hist[rng() % hist.size()] ^= 1;
        if (rng() % 6 == 0) hist.push_back(0);
        d.sync(hist.data(), hist.size());
        const size_t start = rng() % (prompt.size() + 2);
        const Tokens tokens(prompt.begin() + static_cast<long>(std::min(start, prompt.size())), prompt.end());
        const bool fits = start <= hist.size() && hist.size() <= start + tokens.size() &&
                          std::equal(hist.begin() + static_cast<long>(start), hist.end(), tokens.begin());
        check::note() = "round " + std::to_string(round) + " start " + std::to_string(start);
        CHECK_EQ(extend_history(d, tokens.data(), tokens.size(), start), fits);
        Tokens want = hist;
        if (fits) want.insert(want.end(), tokens.begin() + static_cast<long>(hist.size() - start), tokens.end());
        CHECK_EQ(Tokens(d.history().data(), d.history().data() + d.history().size()), want);
    }
    check::note().clear();
}

TEST(extend_history_appends_only_a_continuation) {
    std::mt19937 rng(9);
    NgramSimple simple(2, 4);
    check_extend(simple, rng);
    NgramMap map(2, 4);
    check_extend(map, rng);
    NgramMod mod(std::make_shared<NgramModTable>(1024), 4, 1, 8);
    check_extend(mod, rng);
}

TEST(eight_threads_share_one_mod_table) {
    // Every thread replays the same stream on a table filled beforehand with that stream;
    // its windows map to slots with one continuation each (a random text repeated), so every add rewrites
    // the value already there, and each thread must draft exactly what a lone drafter
    // drafts, however the threads interleave. Under ThreadSanitizer this is the race check.
    const size_t n = 6;
    auto table = std::make_shared<NgramModTable>();
    // the first seed whose stream has one continuation per slot
    auto one_per_slot = [&](const Tokens& s) {
        std::vector<std::pair<size_t, token_t>> seen;
        for (size_t i = 0; i + n < s.size(); ++i)
            seen.emplace_back(table->slot_of(NgramModTable::hash(s.data() + i, n)), s[i + n]);
        std::sort(seen.begin(), seen.end());
        for (size_t i = 1; i < seen.size(); ++i)
            if (seen[i].first == seen[i - 1].first && seen[i].second != seen[i - 1].second) return false;
        return true;
    };
    Tokens s;
    for (unsigned seed = 7;; ++seed) {
        CHECK(seed < 200);
        std::mt19937 rng(seed);
        const Tokens r = test::random_stream(rng, 750, 50);
        s.clear();
        for (int k = 0; k < 4; ++k) s.insert(s.end(), r.begin(), r.end());  // repeats: drafts happen
        if (one_per_slot(s)) break;
    }
    NgramMod(table, n, 1, 16).begin(s.data(), s.size());
    auto run = [&](std::vector<Tokens>& drafts) {
        NgramMod d(table, n, 1, 16);
        std::vector<token_t> out;
        for (size_t pos = 1; pos <= s.size(); ++pos) {
            if (pos == 513) d.begin(s.data(), 512);
            d.draft(s.data(), pos - 1, s[pos - 1], out);
            size_t acc = 0;
            while (acc < out.size() && pos + acc < s.size() && s[pos + acc] == out[acc]) ++acc;
            if (!out.empty()) d.accept(acc);
            drafts.push_back(out);
        }
    };
    std::vector<Tokens> alone;
    run(alone);
    size_t n_drafts = 0;
    for (const Tokens& d : alone) n_drafts += !d.empty();
    CHECK(n_drafts > 100);
    std::vector<std::vector<Tokens>> got(8);
    std::vector<std::thread> threads;
    for (auto& g : got) threads.emplace_back([&run, &g] { run(g); });
    for (auto& t : threads) t.join();
    for (const auto& g : got) CHECK(g == alone);
    CHECK_EQ(table->resets(), uint64_t(0));

    // and with resets racing against drafts: no data race, every draft from the table
    std::atomic<bool> stop{false};
    std::thread resetter([&] {
        while (!stop.load()) table->reset();
    });
    std::vector<std::thread> readers;
    for (int k = 0; k < 7; ++k)
        readers.emplace_back([&] {
            std::vector<Tokens> d;
            run(d);
        });
    for (auto& t : readers) t.join();
    stop = true;
    resetter.join();
}

CHECK_MAIN()
