// Threads sharing the core's objects, as the Python binding lets them: locked caches
// (shared_cache.hpp) read, written, merged and replayed into; one opened static table
// drafted from; copy drafters reading shared caches; suffix stores and ngram-mod tables
// shared by drafters; drafters claimed by one thread at a time (exclusive.hpp). Every result that cannot depend on the interleaving must equal a
// serial run's; the rest must be well-formed. Built with -DNGRAMCACHE_TSAN=ON this is the
// race check (docs/architecture.md, "Threads").
#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "check.hpp"
#include "ngramcache/copy_drafter.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/exclusive.hpp"
#include "ngramcache/lookup_drafter.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngram_mod.hpp"
#include "ngramcache/sequence_adapter.hpp"
#include "ngramcache/shared_cache.hpp"
#include "ngramcache/static_table.hpp"
#include "ngramcache/suffix.hpp"
#include "support.hpp"

using namespace ngramcache;
using test::Tokens;

namespace {

constexpr int kThreads = 8;

// A cache's counts without its order, which concurrent writers may change.
using Contents = std::map<std::array<token_t, kNgramMax>, std::map<token_t, int64_t>>;

Contents contents(const NgramCache& c) {
    std::vector<int32_t> keys(c.size() * kNgramMax), toks(c.n_entries()), cnts(c.n_entries());
    std::vector<int64_t> offsets(c.size() + 1);
    c.export_arrays(keys.data(), offsets.data(), toks.data(), cnts.data());
    Contents out;
    for (size_t i = 0; i < c.size(); ++i) {
        std::array<token_t, kNgramMax> k;
        std::copy(keys.begin() + i * kNgramMax, keys.begin() + (i + 1) * kNgramMax, k.begin());
        for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) out[k][toks[j]] += cnts[j];
    }
    return out;
}

Contents contents(const SharedCache& c) {
    return c.read([](const NgramCache& x) { return contents(x); });
}

// Text with repeats, so that every drafter drafts: random phrases, some copied again.
Tokens text_with_repeats(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    Tokens t;
    while (t.size() < n) {
        if (t.size() > 200 && rng() % 3 == 0) {
            const size_t len = 8 + rng() % 40, from = rng() % (t.size() - len);
            t.insert(t.end(), t.begin() + from, t.begin() + from + len);
        } else {
            const Tokens r = test::random_stream(rng, 20, 400);
            t.insert(t.end(), r.begin(), r.end());
        }
    }
    t.resize(n);
    return t;
}

using ReplayFigures = std::tuple<int64_t, int64_t, int64_t, int64_t, std::vector<int64_t>>;

template <class R>
ReplayFigures figures(const R& r) {
    return {r.n_chunks, r.n_steps, r.n_drafted, r.n_accept, r.accept_length_hist};
}

// The proposals of a drafter driven over seq[start, stop) as a speculative loop drives it:
// each step accepts the matching prefix and the next true token.
template <class D>
std::vector<Tokens> walk(D& d, const Tokens& seq, size_t start, size_t stop) {
    d.reset(seq.data(), start);
    std::vector<Tokens> out;
    token_t buf[16];
    for (size_t pos = start; pos < stop;) {
        const size_t n = d.propose(16, buf);
        out.emplace_back(buf, buf + n);
        size_t k = 0;
        while (k < n && pos + k + 1 < seq.size() && seq[pos + k] == buf[k]) ++k;
        d.accept(seq.data() + pos, k + 1);
        pos += k + 1;
    }
    return out;
}

// Everything fixed, and what nobody writes while the threads run.
struct Fixed {
    Tokens text = text_with_repeats(40000, 11);
    SharedCache context, dynamic, static_cache;
    std::vector<SharedCache> pieces = std::vector<SharedCache>(kThreads);
    Tokens churn_tokens;
    Contents churn_one;
    test::TempDir dir;
    StaticTable table;

    Fixed() : table(StaticTable::build(text.data(), 16000, kNgramStatic)) {
        context.unlocked().update(text.data(), 6000, 1, kNgramMax, 6000);
        dynamic.unlocked().update(text.data() + 6000, 6000, 1, kNgramMax, 6000);
        static_cache.unlocked().update(text.data(), 16000, kNgramStatic, kNgramStatic, 16000);
        for (int i = 0; i < kThreads; ++i)
            pieces[i].unlocked().update(text.data() + 12000 + 300 * i, 300, 1, kNgramMax, 300);
        churn_tokens.assign(text.begin() + 30000, text.begin() + 31000);
        NgramCache one;
        one.update(churn_tokens.data(), churn_tokens.size(), 1, kNgramMax, churn_tokens.size());
        churn_one = contents(one);
        table.save(dir.file("static.ngst"));
        table = StaticTable::open(dir.file("static.ngst"));  // the mapped file, as Python opens it
    }
};

// The objects the threads share, made afresh for the serial and the threaded run.
struct Shared {
    SharedCache acc;     // only ever added to: the final counts equal the serial run's
    SharedCache target;  // replays merge their chunks into it
    SharedCache churn;   // cleared or given churn_tokens whole while others read it
};

struct Output {
    std::vector<Tokens> drafts;
    std::vector<ReplayFigures> replays;
    std::vector<Contents> privates;
    std::vector<std::vector<Tokens>> walks;
    std::vector<std::vector<char>> table_caches;
    bool operator==(const Output& o) const {
        return drafts == o.drafts && replays == o.replays && privates == o.privates && walks == o.walks &&
               table_caches == o.table_caches;
    }
};

// Every whole copy of churn_tokens' counts times k: what a reader may see of `churn`.
void check_churn(const Fixed& f, const Contents& got) {
    if (got.empty()) return;
    CHECK_EQ(got.size(), f.churn_one.size());
    const auto& first = *f.churn_one.begin();
    const int64_t k = got.at(first.first).at(first.second.begin()->first) / first.second.begin()->second;
    CHECK(k >= 1);
    for (const auto& [key, part] : f.churn_one)
        for (const auto& [tok, n] : part) CHECK_EQ(got.at(key).at(tok), n * k);
}

Output work(int i, Fixed& f, Shared& s, int rounds) {
    Output out;
    const Tokens& text = f.text;
    for (int r = 0; r < rounds; ++r) {
        // add only: counts commute
        s.acc.write([&](NgramCache& c) { c.update(text.data() + 1000 + 200 * i, 300, 1, kNgramMax, 300); });
        merge_shared(s.acc, f.pieces[(i + r) % kThreads]);
        s.acc.read([](const NgramCache& c) { return serialize_lookup(c); });

        // cleared or refilled whole, read meanwhile: a reader sees whole updates only
        for (int k = 0; k < 3; ++k) {
            if ((i + k + r) % 3 == 0)
                s.churn.write([](NgramCache& c) { c.clear(); });
            else
                s.churn.write([&](NgramCache& c) {
                    c.update(f.churn_tokens.data(), f.churn_tokens.size(), 1, kNgramMax, f.churn_tokens.size());
                });
            check_churn(f, contents(s.churn));
            NgramCache loaded;
            const std::vector<char> img = s.churn.read([](const NgramCache& c) { return serialize_lookup(c); });
            load_lookup(loaded, img.data(), img.size(), "churn");
            check_churn(f, contents(loaded));
            token_t buf[8];
            const size_t n = draft_shared(f.churn_tokens.data(), 100 + 10 * i, 8, 1, kNgramMax, s.churn, &s.churn,
                                          StaticSource{nullptr, &f.table}, buf);
            CHECK(n <= 8);
        }

        // drafting from caches nobody writes: the serial drafts
        for (size_t p = 200 + 97 * i + r; p < 12000; p += 1497) {
            token_t buf[8];
            const StaticSource st = p % 2 ? StaticSource{nullptr, &f.table} : StaticSource{&f.static_cache, nullptr};
            const size_t n = draft_shared(text.data(), p, 8, 1, kNgramMax, f.context, &f.dynamic, st, buf);
            out.drafts.emplace_back(buf, buf + n);
        }

        // replays: the shared dynamic cache only read, a private copy updated, and the
        // shared target updated (its final counts are compared)
        const Tokens chunk(text.begin() + 2000 * ((i + r) % 4), text.begin() + 2000 * ((i + r) % 4) + 1601);
        const ReplayOptions opt = test::replay_options(800, 8);
        out.replays.push_back(figures(replay_shared(chunk.data(), chunk.size(), opt, {nullptr, &f.table}, &f.dynamic, false)));
        SharedCache mine;
        merge_shared(mine, f.dynamic);
        out.replays.push_back(
            figures(replay_shared(chunk.data(), chunk.size(), opt, {&f.static_cache, nullptr}, &mine, true)));
        out.privates.push_back(contents(mine));
        replay_shared(chunk.data(), chunk.size(), opt, {nullptr, &f.table}, &s.target, true);

        // the opened table, from every thread
        NgramCache from_table;
        f.table.to_cache(from_table);
        if (r == 0) out.table_caches.push_back(serialize_lookup(from_table));

        // copy drafters with their own context, sharing the dynamic cache and the table
        CopyDrafter copy(CopyOptions{}, &f.dynamic, StaticSource{nullptr, &f.table});
        out.walks.push_back(walk(copy, text, 3000 + 500 * i + r, 3300 + 500 * i + r));
    }
    return out;
}

// Threads whose first exception (a failed CHECK too) is rethrown by join().
class Threads {
public:
    template <class F>
    void start(F f) {
        threads_.emplace_back([this, f] {
            try {
                f();
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (!first_) first_ = std::current_exception();
            }
        });
    }
    void join() {
        for (auto& t : threads_) t.join();
        threads_.clear();
        if (first_) std::rethrow_exception(first_);
    }
    ~Threads() {
        for (auto& t : threads_)
            if (t.joinable()) t.join();
    }

private:
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::exception_ptr first_;
};

}  // namespace

TEST(caches_shared_by_readers_writers_merges_and_replays) {
    Fixed f;
    const int rounds = 2;
    Shared serial;
    std::vector<Output> expected;
    for (int i = 0; i < kThreads; ++i) expected.push_back(work(i, f, serial, rounds));
    size_t n_drafts = 0;
    for (const Tokens& d : expected[0].drafts) n_drafts += !d.empty();
    CHECK(n_drafts > 5);
    CHECK(expected[0].replays[0] != expected[0].replays[1]);

    Shared s;
    std::vector<Output> got(kThreads);
    Threads threads;
    for (int i = 0; i < kThreads; ++i) threads.start([&, i] { got[i] = work(i, f, s, rounds); });
    threads.join();
    for (int i = 0; i < kThreads; ++i) {
        check::note() = "thread " + std::to_string(i);
        CHECK(got[i] == expected[i]);
    }
    check::note().clear();
    CHECK(contents(s.acc) == contents(serial.acc));
    CHECK(contents(s.target) == contents(serial.target));
    check_churn(f, contents(s.churn));
}

TEST(merges_in_both_directions_and_self_merges) {
    // a += b, b += a and a += a at once: LockSet's one lock order, no deadlock, no race
    const Tokens t = text_with_repeats(3000, 5);
    SharedCache a, b;
    a.unlocked().update(t.data(), 2000, 1, kNgramMax, 2000);
    b.unlocked().update(t.data() + 1000, 2000, 1, kNgramMax, 2000);
    const Contents a0 = contents(a);
    Threads threads;
    for (int i = 0; i < kThreads; ++i)
        threads.start([&, i] {
            for (int k = 0; k < 3; ++k) {
                if (i % 4 == 0) merge_shared(a, b);
                else if (i % 4 == 1) merge_shared(b, a);
                else if (i % 4 == 2) merge_shared(a, a);
                else contents(a), contents(b);
            }
        });
    threads.join();
    // every key of a is still there, with counts that only grew
    const Contents a1 = contents(a);
    for (const auto& [key, part] : a0)
        for (const auto& [tok, n] : part) CHECK(a1.at(key).at(tok) >= n);
}

TEST(drafters_share_a_suffix_store_and_a_mod_table) {
    // Replays add their requests to one store at every chunk and write one ngram-mod table,
    // while other threads read both and reset the table: no data race; the store keeps its
    // bound and every request it holds is a chunk some replay gave it.
    const Tokens t = text_with_repeats(12000, 7);
    auto store = std::make_shared<SuffixStore>(20000, 16);
    auto table = std::make_shared<NgramModTable>(1 << 16);
    std::atomic<bool> stop{false};
    Threads drafters, reader;
    const ReplayOptions opt = test::replay_options(1000, 8);
    for (int i = 0; i < 3; ++i)
        drafters.start([&, i] {
            SuffixDrafter d(16, 4.0, 0.1, store);
            replay_drafter(d, t.data() + 2000 * i, 4001, opt);
            d.finish();
        });
    for (int i = 0; i < 3; ++i)
        drafters.start([&, i] {
            SequenceAdapter<NgramMod> d(table, 6, 1, 8);
            const auto r = replay_drafter(d, t.data() + 2000 * i, 4001, opt);
            CHECK(r.n_steps > 0);
        });
    reader.start([&] {
        std::vector<int32_t> slots(table->size());
        while (!stop.load()) {
            table->export_entries(slots.data());
            for (int32_t v : slots) CHECK(v >= NgramModTable::kEmpty && v < 400);
            table->reset();
            for (const auto& req : store->requests()) CHECK(req.size() <= 20000);
            CHECK(store->n_tokens() <= 20000);
        }
    });
    try {
        drafters.join();
    } catch (...) {
        stop = true;
        throw;
    }
    stop = true;
    reader.join();
    size_t held = 0;
    for (const auto& req : store->requests()) {
        held += req.size();
        CHECK(std::search(t.begin(), t.end(), req.begin(), req.end()) != t.end());
    }
    CHECK_EQ(held, store->n_tokens());
    CHECK(held > 0);
}

TEST(exclusive_refuses_a_second_user) {
    Exclusive<LookupDrafter> d(1, 4);
    const Tokens t{1, 2, 3, 1, 2};
    {
        Exclusive<LookupDrafter>::Claim claim(d);
        claim->reset(t.data(), t.size());
        CHECK(d.busy());
        CHECK_THROWS_AS(d.use(), InUse, "in use by another thread");
        CHECK_THROWS_AS(Exclusive<LookupDrafter>::Claim{d}, InUse, "in use by another thread");
    }
    CHECK(!d.busy());
    CHECK_EQ(d.use().tokens().to_vector(), t);
    // Threads race for claims; whoever wins steps the drafter. A step of an unclaimed
    // drafter would be a data race (ThreadSanitizer's build fails on one), and the sequence
    // holds exactly the tokens the winners accepted.
    std::atomic<int64_t> won{0}, refused{0};
    Threads threads;
    for (int i = 0; i < kThreads; ++i)
        threads.start([&, i] {
            token_t out[8];
            const token_t tok = static_cast<token_t>(i % 3 + 1);
            for (int k = 0; k < 2000; ++k) {
                try {
                    Exclusive<LookupDrafter>::Claim claim(d);
                    claim->propose(8, out);
                    claim->accept(&tok, 1);
                    ++won;
                } catch (const InUse&) {
                    ++refused;
                }
            }
        });
    threads.join();
    CHECK_EQ(won.load() + refused.load(), int64_t(kThreads) * 2000);
    CHECK_EQ(static_cast<int64_t>(d.use().tokens().size()), static_cast<int64_t>(t.size()) + won.load());
    CHECK(won.load() > 0);
}

TEST(a_cache_is_read_saved_and_exported_while_written) {
    const Tokens t = text_with_repeats(20000, 9);
    SharedCache c;
    c.unlocked().update(t.data(), 2000, 1, kNgramMax, 2000);
    const size_t keys_before = c.unlocked().size();
    test::TempDir dir;
    std::atomic<bool> stop{false};
    Threads writer, readers;
    writer.start([&] {
        for (size_t have = 2000; have < t.size(); have += 500)
            c.write([&](NgramCache& x) { x.update(t.data(), have + 500, 1, kNgramMax, 500); });
        stop = true;
    });
    for (int i = 0; i < 3; ++i)
        readers.start([&, i] {
            const std::string path = dir.file("c" + std::to_string(i) + ".bin");
            while (!stop.load()) {
                const CacheArrays a = export_shared(c);
                const size_t n = a.offsets.size() - 1;
                CHECK(n >= keys_before);
                CHECK_EQ(a.keys.size(), n * kNgramMax);
                CHECK_EQ(static_cast<size_t>(a.offsets[n]), a.tokens.size());
                CHECK(std::is_sorted(a.offsets.begin(), a.offsets.end()));
                CHECK(!entries_of(c, Ngram::of2(t[0], t[1])).empty());
                save_shared(c, path);
                NgramCache loaded;
                load_lookup_file(loaded, path);
                CHECK(loaded.size() >= keys_before);
                CHECK_EQ(table_from_shared(c, 2).ngram_size(), 2);
            }
        });
    writer.join();
    readers.join();
    NgramCache whole;
    whole.update(t.data(), t.size(), 1, kNgramMax, t.size());
    CHECK(contents(c) == contents(whole));
}

CHECK_MAIN()
