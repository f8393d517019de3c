// Lookup micro-benchmark for bench/bench_static.py: a static source's cost per
// lookup without Python in the way, StaticTable (mapped NGST file) against NgramCache
// (llama.cpp's lookup.bin loaded, what llama.cpp drafts from).
//
// The keys are the consecutive 2-grams of a token stream (held-out text: a realistic mix
// of present and absent keys). Per key, as drafting does: find2, then best (try_static),
// then count of one candidate (the static re-ranking of a context candidate).
//
//   g++ -O2 -std=c++17 -Icpp/include cpp/bench/bench_static.cpp -o /tmp/bench_static
//   /tmp/bench_static TABLE.ngst LOOKUP.bin STREAM.i32 [rounds]
// Prints one JSON object.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;

namespace {

template <class Static>
double ns_per_lookup(const Static& st, const std::vector<token_t>& s, int rounds, int64_t& checksum) {
    double best = 1e30;
    for (int r = 0; r < rounds; ++r) {
        int64_t acc = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i + 2 < s.size(); ++i) {
            const auto ref = st.find2(s[i], s[i + 1]);
            if (ref == nullptr) continue;
            token_t tok = kTokenNull;
            if (st.best(ref, tok)) acc += tok;
            acc += st.count(ref, s[i + 2]);
        }
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, ns / double(s.size() - 2));
        checksum = acc;
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s TABLE.ngst LOOKUP.bin STREAM.i32 [rounds]\n", argv[0]);
        return 2;
    }
    const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
    const std::vector<char> raw = read_file(argv[3]);
    std::vector<token_t> stream(raw.size() / 4);
    for (size_t i = 0; i < stream.size(); ++i) stream[i] = load_i32(raw.data() + 4 * i);

    const StaticTable table = StaticTable::open(argv[1]);
    NgramCache cache;
    load_lookup_file(cache, argv[2]);
    const CacheAsStatic as_static{&cache};

    // Same answers from both, or the figures mean nothing.
    int64_t ck_table = 0, ck_cache = 0;
    size_t present = 0;
    for (size_t i = 0; i + 1 < stream.size(); ++i) present += table.find2(stream[i], stream[i + 1]) != nullptr;
    // Alternate the variants so that machine noise hits both alike.
    double t_table = 1e30, t_cache = 1e30;
    for (int r = 0; r < 2; ++r) {
        t_table = std::min(t_table, ns_per_lookup(table, stream, rounds, ck_table));
        t_cache = std::min(t_cache, ns_per_lookup(as_static, stream, rounds, ck_cache));
    }
    if (ck_table != ck_cache) {
        std::fprintf(stderr, "different answers: %lld vs %lld\n", (long long)ck_table, (long long)ck_cache);
        return 1;
    }
    std::printf("{\"lookups\": %zu, \"present\": %zu, \"ns_static_table\": %.1f, \"ns_ngramcache\": %.1f}\n",
                stream.size() - 2, present, t_table, t_cache);
    return 0;
}
