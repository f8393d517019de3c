// Micro-benchmark (docs/benchmarks.md): ngramcache's NgramCache against std::unordered_map and
// boost::unordered_flat_map on the context-cache workload, without Python in the way.
//
// Workload: the vectors' replay loop over a token stream: at every position, update the
// context cache with the newest token (nnew = 1, n-gram sizes 1..4), then draft up to 8
// tokens with the context cache only (lax thresholds, longest n-gram first).
//
// Default mode, layout + algorithm against llama.cpp's:
//   ngramcache    NgramCache (flat table, segmented parts) + ngramcache::draft
//   std-llama     llama.cpp's layout and algorithm: unordered_map<key, unordered_map<tok, cnt>>
//                 with its XOR-of-Fibonacci hash; draft copies every part it looks at
//   std-nocopy    the same maps, but drafting reads parts by reference (isolates the copies)
//
// --tables mode, the hash table alone (needs Boost >= 1.81 headers; bench only): the same
// parts, update loop and drafting code (draft_context below) over three key -> part maps:
//   ours          NgramCache's own flat table
//   boost-ourhash boost::unordered_flat_map with our key hash (declared avalanching)
//   boost-bhash   boost::unordered_flat_map with boost::hash_range over the 4 slots
// Workloads: update only; replay (update + draft 8); find() of existing keys in stream order,
// of every distinct key once in shuffled order, and of absent keys. Repetitions alternate the
// variants; every variant must produce the same drafts and lookup sums or the run fails.
//
// --one VARIANT WORKLOAD runs one workload once, with only the measured part instrumented
// under `valgrind --tool=callgrind --instr-atstart=no` (deterministic instruction counts).
//
// Build and run by hand (the token file is the one bench/bench_core.py caches, raw int32;
// -O3 -DNDEBUG is the package's Release build, and keeps Boost's assertions off):
//   g++ -O3 -DNDEBUG -std=c++17 -Icpp/include cpp/bench/bench_table.cpp -o /tmp/bench_table
//   /tmp/bench_table /tmp/ngramcache-bench-stdlib-<tag>.i32 [n_tokens [--ours-only]]
//   /tmp/bench_table /tmp/ngramcache-bench-stdlib-<tag>.i32 N --tables [reps]
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null
//       /tmp/bench_table TOKENS 100000 --one ours|boost-ourhash|boost-bhash
//       update|replay|hit|hit-shuffled|miss      (one command line)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"

#if __has_include(<boost/unordered/unordered_flat_map.hpp>)
#include "boost_cache.hpp"
#define HAVE_BOOST_FLAT_MAP 1
#endif

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else  // outside valgrind these are no-ops anyway
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

using namespace ngramcache;

namespace {

constexpr int kDraft = 8;

struct LlamaHash {  // common_ngram_hash_function: XOR of Fibonacci-hashed slots
    size_t operator()(const Ngram& k) const {
        size_t h = 0;
        for (int i = 0; i < kNgramMax; ++i)
            h ^= static_cast<size_t>(static_cast<int64_t>(k.t[i])) * 0x9E3779B97F4A7C15ull;
        return h;
    }
};
using StdPart = std::unordered_map<token_t, int32_t>;
using StdCache = std::unordered_map<Ngram, StdPart, LlamaHash>;

void std_update(StdCache& c, const token_t* inp, size_t n) {  // nnew = 1, sizes 1..4
    for (int s = 1; s <= kNgramMax; ++s) {
        if (n <= static_cast<size_t>(s)) continue;
        StdPart& p = c[Ngram(inp + n - 1 - s, s)];
        ++p[inp[n - 1]];
    }
}

// common_ngram_cache_draft, context cache only. Copy = true copies each part as llama.cpp does.
template <bool Copy>
size_t std_draft(const StdCache& c, const token_t* inp, size_t n, token_t* out) {
    if (n < 2) return 0;
    std::vector<token_t> seq(inp + (n > 4 ? n - 4 : 0), inp + n);
    size_t k = 0;
    while (k < static_cast<size_t>(kDraft)) {
        token_t tok = kTokenNull;
        for (int s = kNgramMax; s >= 1 && tok == kTokenNull; --s) {
            if (static_cast<size_t>(s) > seq.size()) continue;
            auto it = c.find(Ngram(seq.data() + seq.size() - s, s));
            if (it == c.end()) continue;
            StdPart copy;
            if (Copy) copy = it->second;
            const StdPart& part = Copy ? copy : it->second;
            token_t best = kTokenNull;
            int64_t best_cnt = 0, sum = 0;
            for (const auto& [t, cnt] : part) {
                if (cnt > best_cnt) best = t, best_cnt = cnt;
                sum += cnt;
            }
            if (sum < kMinSampleLax[s - 1] || 100 * best_cnt < kMinPercentLax[s - 1] * sum) continue;
            tok = best;
        }
        if (tok == kTokenNull) break;
        out[k++] = tok;
        seq.push_back(tok);
    }
    return k;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
    double seconds;
    size_t drafted;
    size_t keys;
    uint64_t checksum;  // of the drafted tokens, so the compiler cannot drop the work
};

// The default mode's workload over one cache type: Update(cache, tokens, n) adds the newest
// token, Draft(cache, tokens, n, out) drafts up to kDraft tokens after tokens[0..n-1].
template <class Cache, class Update, class Draft>
Result run_replay(const std::vector<token_t>& toks, Update update, Draft draft_after) {
    Cache c;
    token_t out[kDraft];
    size_t drafted = 0;
    uint64_t sum = 0;
    const double t0 = now_s();
    for (size_t pos = 1; pos <= toks.size(); ++pos) {
        if (pos >= 2) update(c, toks.data(), pos);
        const size_t k = draft_after(c, toks.data(), pos, out);
        drafted += k;
        for (size_t i = 0; i < k; ++i) sum = sum * 31 + uint64_t(out[i]);
    }
    return {now_s() - t0, drafted, c.size(), sum};
}

Result run_ours(const std::vector<token_t>& toks) {
    return run_replay<NgramCache>(
        toks, [](NgramCache& c, const token_t* inp, size_t n) { c.update(inp, n, 1, 4, 1); },
        [](const NgramCache& c, const token_t* inp, size_t n, token_t* out) {
            return draft(inp, n, kDraft, 1, 4, c, nullptr, NoStatic{}, out);
        });
}

template <bool Copy>
Result run_std(const std::vector<token_t>& toks) {
    // lambdas, not function pointers, so the calls inline as run_ours' do
    return run_replay<StdCache>(
        toks, [](StdCache& c, const token_t* inp, size_t n) { std_update(c, inp, n); },
        [](const StdCache& c, const token_t* inp, size_t n, token_t* out) { return std_draft<Copy>(c, inp, n, out); });
}

// Update only (the table's insert/find path), all positions, nnew = 1.
double update_ours(const std::vector<token_t>& toks) {
    NgramCache c;
    const double t0 = now_s();
    for (size_t pos = 2; pos <= toks.size(); ++pos) c.update(toks.data(), pos, 1, 4, 1);
    return now_s() - t0;
}

double update_std(const std::vector<token_t>& toks) {
    StdCache c;
    const double t0 = now_s();
    for (size_t pos = 2; pos <= toks.size(); ++pos) std_update(c, toks.data(), pos);
    return now_s() - t0;
}

// ---- --tables / --one: the key -> part map alone --------------------------------------
#ifdef HAVE_BOOST_FLAT_MAP

// ngramcache::draft for the context cache only (no dynamic, no static), over any table with
// find(key) -> const Part*: the library's function takes an NgramCache, and the comparison
// needs the very same drafting code over every table. run_tables checks it drafts exactly
// what ngramcache::draft drafts.
template <class Table>
size_t draft_context(const Table& c, const token_t* inp, size_t n_inp, token_t* out) {
    if (n_inp < static_cast<size_t>(kNgramStatic)) return 0;
    token_t window[kNgramMax];
    int window_len = n_inp < size_t(kNgramMax) ? int(n_inp) : kNgramMax;
    for (int i = 0; i < window_len; ++i) window[i] = inp[n_inp - window_len + i];
    size_t n = 0;
    while (n < size_t(kDraft)) {
        token_t tok = kTokenNull;
        for (int s = kNgramMax; s >= 1; --s) {
            if (s > window_len) continue;
            const Part* part = c.find(Ngram(window + window_len - s, s));
            if (part == nullptr) continue;
            const int64_t sum = part->sum();
            if (sum < kMinSampleLax[s - 1]) continue;
            if (100 * int64_t(part->max_count()) < int64_t(kMinPercentLax[s - 1]) * sum) continue;
            tok = best_by_count(*part);
            break;
        }
        if (tok == kTokenNull) break;
        out[n++] = tok;
        if (window_len < kNgramMax) {
            window[window_len++] = tok;
        } else {
            for (int i = 0; i + 1 < kNgramMax; ++i) window[i] = window[i + 1];
            window[kNgramMax - 1] = tok;
        }
    }
    return n;
}

// Each workload returns its seconds and a checksum that must agree across tables.
struct Timed {
    double seconds;
    uint64_t checksum;
};

template <class Table>
Timed work_update(Table& c, const std::vector<token_t>& toks) {
    const double t0 = now_s();
    CALLGRIND_START_INSTRUMENTATION;
    for (size_t pos = 2; pos <= toks.size(); ++pos) c.update(toks.data(), pos, 1, 4, 1);
    CALLGRIND_STOP_INSTRUMENTATION;
    return {now_s() - t0, c.size()};
}

template <class Table>
Timed work_replay(Table& c, const std::vector<token_t>& toks) {
    token_t out[kDraft];
    uint64_t sum = 0;
    const double t0 = now_s();
    CALLGRIND_START_INSTRUMENTATION;
    for (size_t pos = 1; pos <= toks.size(); ++pos) {
        if (pos >= 2) c.update(toks.data(), pos, 1, 4, 1);
        const size_t k = draft_context(c, toks.data(), pos, out);
        for (size_t i = 0; i < k; ++i) sum = sum * 31 + uint64_t(out[i]) + 1;
    }
    CALLGRIND_STOP_INSTRUMENTATION;
    return {now_s() - t0, sum};
}

template <class Table>
Timed work_find(const Table& c, const std::vector<Ngram>& keys) {
    uint64_t acc = 0;
    const double t0 = now_s();
    CALLGRIND_START_INSTRUMENTATION;
    for (const Ngram& k : keys) {
        const Part* p = c.find(k);
        acc += p == nullptr ? 1 : uint64_t(p->sum()) << 1;
    }
    CALLGRIND_STOP_INSTRUMENTATION;
    return {now_s() - t0, acc};
}

// The lookup key sets, from a cache built over the whole stream.
struct KeySets {
    std::vector<Ngram> hit;           // the 1..4-grams ending at every position, stream order
    std::vector<Ngram> hit_shuffled;  // every distinct key once, shuffled (cache-cold)
    std::vector<Ngram> miss;          // reversed 2..4-gram windows the stream never contains
};

KeySets make_keys(const std::vector<token_t>& toks) {
    NgramCache c;
    for (size_t pos = 2; pos <= toks.size(); ++pos) c.update(toks.data(), pos, 1, 4, 1);
    KeySets ks;
    for (size_t pos = kNgramMax; pos < toks.size(); ++pos)
        for (int s = 1; s <= kNgramMax; ++s) ks.hit.emplace_back(toks.data() + pos - s, s);
    for (size_t i = 0; i < c.size(); ++i) ks.hit_shuffled.push_back(c.key_at(i));
    std::mt19937_64 rng(12345);
    std::shuffle(ks.hit_shuffled.begin(), ks.hit_shuffled.end(), rng);
    for (size_t pos = kNgramMax; pos < toks.size(); ++pos)
        for (int s = 2; s <= kNgramMax; ++s) {
            Ngram k;
            for (int i = 0; i < s; ++i) k.t[i] = toks[pos - 1 - i];
            if (c.find(k) == nullptr) ks.miss.push_back(k);
        }
    return ks;
}

template <class Table>
Table* built(const std::vector<token_t>& toks) {
    Table* c = new Table;
    for (size_t pos = 2; pos <= toks.size(); ++pos) c->update(toks.data(), pos, 1, 4, 1);
    return c;
}

const char* const kWorkloads[] = {"update", "replay", "hit", "hit-shuffled", "miss"};
constexpr int kNumWorkloads = 5;

// One workload on a fresh table; the table's destruction is not timed.
template <class Table>
Timed run_workload(int w, const std::vector<token_t>& toks, const KeySets* ks) {
    if (w == 0 || w == 1) {
        std::unique_ptr<Table> c(new Table);
        return w == 0 ? work_update(*c, toks) : work_replay(*c, toks);
    }
    std::unique_ptr<Table> c(built<Table>(toks));
    const std::vector<Ngram>& keys = w == 2 ? ks->hit : w == 3 ? ks->hit_shuffled : ks->miss;
    return work_find(*c, keys);
}

using BoostOurs = ngramcache_bench::BoostCache<ngramcache_bench::OurHash>;
using BoostOwn = ngramcache_bench::BoostCache<ngramcache_bench::BoostHash>;
const char* const kVariants[] = {"ours", "boost-ourhash", "boost-bhash"};
constexpr int kNumVariants = 3;

Timed run_variant(int v, int w, const std::vector<token_t>& toks, const KeySets* ks) {
    switch (v) {
        case 0: return run_workload<NgramCache>(w, toks, ks);
        case 1: return run_workload<BoostOurs>(w, toks, ks);
        default: return run_workload<BoostOwn>(w, toks, ks);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run_tables(const std::vector<token_t>& toks, int reps) {
    const size_t n = toks.size();
    const KeySets ks = make_keys(toks);
    std::printf("Boost %s; %zu tokens; keys: hit %zu, hit-shuffled %zu (distinct), miss %zu; %d alternated "
                "repetitions\n", BOOST_LIB_VERSION, n, ks.hit.size(), ks.hit_shuffled.size(), ks.miss.size(), reps);

    // Same drafts as the library's drafting function, and a memory figure per table.
    {
        NgramCache c;
        token_t out[kDraft];
        uint64_t sum = 0;
        for (size_t pos = 1; pos <= n; ++pos) {
            if (pos >= 2) c.update(toks.data(), pos, 1, 4, 1);
            const size_t k = draft(toks.data(), pos, kDraft, 1, 4, c, nullptr, NoStatic{}, out);
            for (size_t i = 0; i < k; ++i) sum = sum * 31 + uint64_t(out[i]) + 1;
        }
        NgramCache c2;
        if (work_replay(c2, toks).checksum != sum) {
            std::printf("FAIL: draft_context differs from ngramcache::draft\n");
            return 1;
        }
        std::unique_ptr<BoostOurs> b(built<BoostOurs>(toks));
        std::printf("memory after the stream (table + keys + parts): ours %.1f MB, boost %.1f MB, %zu keys\n",
                    c.memory_bytes() / 1e6, b->memory_bytes() / 1e6, c.size());
    }

    // times[w][v][rep]
    std::vector<std::vector<std::vector<double>>> times(
        kNumWorkloads, std::vector<std::vector<double>>(kNumVariants));
    for (int r = 0; r < reps; ++r) {
        for (int w = 0; w < kNumWorkloads; ++w) {
            uint64_t want = 0;
            for (int j = 0; j < kNumVariants; ++j) {
                const int v = (j + r) % kNumVariants;  // rotate who goes first
                const Timed t = run_variant(v, w, toks, &ks);
                if (j == 0) want = t.checksum;
                else if (t.checksum != want) {
                    std::printf("FAIL: %s on %s disagrees with the other tables\n", kVariants[v], kWorkloads[w]);
                    return 1;
                }
                times[w][v].push_back(t.seconds);
            }
        }
        std::printf("rep %d done\n", r + 1);
    }

    std::printf("%-13s %-14s %9s %9s %12s %16s\n", "workload", "variant", "median s", "min s", "ns per op",
                "vs ours (paired)");
    for (int w = 0; w < kNumWorkloads; ++w) {
        const size_t ops = w <= 1 ? n : w == 2 ? ks.hit.size() : w == 3 ? ks.hit_shuffled.size() : ks.miss.size();
        for (int v = 0; v < kNumVariants; ++v) {
            std::vector<double> ratio;
            for (int r = 0; r < reps; ++r) ratio.push_back(times[w][v][r] / times[w][0][r]);
            const double med = median(times[w][v]);
            std::printf("%-13s %-14s %9.4f %9.4f %12.1f %15.3fx\n", kWorkloads[w], kVariants[v], med,
                        *std::min_element(times[w][v].begin(), times[w][v].end()), 1e9 * med / double(ops),
                        median(ratio));
        }
    }
    std::printf("(ns per op: per position for update/replay, per find otherwise; "
                "vs ours > 1 means slower than ours)\n");
    return 0;
}

int run_one(const std::vector<token_t>& toks, const std::string& variant, const std::string& workload) {
    int v = -1, w = -1;
    for (int i = 0; i < kNumVariants; ++i) if (variant == kVariants[i]) v = i;
    for (int i = 0; i < kNumWorkloads; ++i) if (workload == kWorkloads[i]) w = i;
    if (v < 0 || w < 0) {
        std::fprintf(stderr, "unknown variant or workload: %s %s\n", variant.c_str(), workload.c_str());
        return 2;
    }
    KeySets ks;
    if (w >= 2) ks = make_keys(toks);
    const Timed t = run_variant(v, w, toks, &ks);
    std::printf("%s %s: %.4f s, checksum %llu\n", variant.c_str(), workload.c_str(), t.seconds,
                static_cast<unsigned long long>(t.checksum));
    return 0;
}
#endif  // HAVE_BOOST_FLAT_MAP

void print(const char* name, const Result& r, size_t n, double base) {
    std::printf("%-12s %7.3f s  %6.0f ns/position  %6.0f ns/drafted  drafted %zu  keys %zu  x%.2f vs ngramcache\n",
                name, r.seconds, 1e9 * r.seconds / n, 1e9 * r.seconds / (r.drafted ? r.drafted : 1), r.drafted,
                r.keys, r.seconds / base);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up when redirected
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s TOKENS.i32 [n_tokens [--ours-only | --tables [reps] | --one VARIANT WORKLOAD]]\n",
                     argv[0]);
        return 2;
    }
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 1;
    }
    std::vector<token_t> toks;
    token_t buf[4096];
    size_t got;
    while ((got = std::fread(buf, sizeof(token_t), 4096, f)) > 0) toks.insert(toks.end(), buf, buf + got);
    std::fclose(f);
    if (argc > 2) toks.resize(std::min(toks.size(), size_t(std::atoll(argv[2]))));
    const size_t n = toks.size();
    if (argc > 3 && (std::string(argv[3]) == "--tables" || std::string(argv[3]) == "--one")) {
#ifdef HAVE_BOOST_FLAT_MAP
        if (std::string(argv[3]) == "--tables") return run_tables(toks, argc > 4 ? std::atoi(argv[4]) : 5);
        if (argc < 6) {
            std::fprintf(stderr, "usage: %s TOKENS.i32 n_tokens --one VARIANT WORKLOAD\n", argv[0]);
            return 2;
        }
        return run_one(toks, argv[4], argv[5]);
#else
        std::fprintf(stderr, "built without Boost >= 1.81 (boost/unordered/unordered_flat_map.hpp)\n");
        return 2;
#endif
    }
    std::printf("%zu tokens; replay: update(nnew=1, 1..4) + draft(8, context only) at every position\n", n);

    const Result ours = run_ours(toks);
    if (argc > 3 && std::string(argv[3]) == "--ours-only") {  // std-llama is quadratic-ish: skip it
        print("ngramcache", ours, n, ours.seconds);
        const double uo = update_ours(toks);
        std::printf("update only  ngramcache %.3f s (%.1f M tokens/s)\n", uo, n / uo / 1e6);
        return 0;
    }
    const Result nocopy = run_std<false>(toks);
    const Result llama = run_std<true>(toks);
    print("ngramcache", ours, n, ours.seconds);
    print("std-nocopy", nocopy, n, ours.seconds);
    print("std-llama", llama, n, ours.seconds);
    // Ties may be broken differently by std::unordered_map's iteration order, so the drafts
    // can differ slightly; the totals show the workloads are the same.
    std::printf("drafted tokens: ngramcache %zu, std %zu (%+.3f %%; tie order differs)\n", ours.drafted,
                llama.drafted, 100.0 * (double(llama.drafted) - double(ours.drafted)) / double(ours.drafted));
    if (nocopy.checksum != llama.checksum) std::printf("warning: copy/no-copy variants differ\n");

    const double uo = update_ours(toks), us = update_std(toks);
    std::printf("update only  ngramcache %.3f s (%.1f M tokens/s)  std %.3f s (%.1f M tokens/s)  x%.2f\n", uo,
                n / uo / 1e6, us, n / us / 1e6, us / uo);
    return 0;
}
