// Micro-benchmark (design.md §2): ngramcache's NgramCache against std::unordered_map on
// the context-cache workload, without Python in the way.
//
// Workload: the vectors' replay loop over a token stream: at every position, update the
// context cache with the newest token (nnew = 1, n-gram sizes 1..4), then draft up to 8
// tokens with the context cache only (lax thresholds, longest n-gram first).
//
// Variants:
//   ngramcache    NgramCache (flat table, segmented parts) + ngramcache::draft
//   std-llama     llama.cpp's layout and algorithm: unordered_map<key, unordered_map<tok, cnt>>
//                 with its XOR-of-Fibonacci hash; draft copies every part it looks at
//   std-nocopy    the same maps, but drafting reads parts by reference (isolates the copies)
//
// Build and run by hand (the token file is the one bench/bench_core.py caches, raw int32):
//   g++ -O2 -std=c++17 -Icpp/include cpp/bench/bench_table.cpp -o /tmp/bench_table
//   /tmp/bench_table /tmp/ngramcache-bench-stdlib-<tag>.i32 [n_tokens [--ours-only]]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"

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

Result run_ours(const std::vector<token_t>& toks) {
    NgramCache c;
    token_t out[kDraft];
    size_t drafted = 0;
    uint64_t sum = 0;
    const double t0 = now_s();
    for (size_t pos = 1; pos <= toks.size(); ++pos) {
        if (pos >= 2) c.update(toks.data(), pos, 1, 4, 1);
        const size_t k = draft(toks.data(), pos, kDraft, 1, 4, c, nullptr, NoStatic{}, out);
        drafted += k;
        for (size_t i = 0; i < k; ++i) sum = sum * 31 + uint64_t(out[i]);
    }
    return {now_s() - t0, drafted, c.size(), sum};
}

template <bool Copy>
Result run_std(const std::vector<token_t>& toks) {
    StdCache c;
    token_t out[kDraft];
    size_t drafted = 0;
    uint64_t sum = 0;
    const double t0 = now_s();
    for (size_t pos = 1; pos <= toks.size(); ++pos) {
        if (pos >= 2) std_update(c, toks.data(), pos);
        const size_t k = std_draft<Copy>(c, toks.data(), pos, out);
        drafted += k;
        for (size_t i = 0; i < k; ++i) sum = sum * 31 + uint64_t(out[i]);
    }
    return {now_s() - t0, drafted, c.size(), sum};
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

void print(const char* name, const Result& r, size_t n, double base) {
    std::printf("%-12s %7.3f s  %6.0f ns/position  %6.0f ns/drafted  drafted %zu  keys %zu  x%.2f vs ngramcache\n",
                name, r.seconds, 1e9 * r.seconds / n, 1e9 * r.seconds / (r.drafted ? r.drafted : 1), r.drafted,
                r.keys, r.seconds / base);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up when redirected
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s TOKENS.i32 [n_tokens]\n", argv[0]);
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
