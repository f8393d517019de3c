// Instruction counts of the drafting loops, for comparing two revisions of the core under
// callgrind (bench/RESULTS.md, "Ties in libstdc++'s order: what they cost"). Only the loop
// itself is instrumented; the result is printed so that two builds can be checked to do
// the same work.
//
//   g++ -O3 -DNDEBUG -std=c++17 -I<revision>/cpp/include cpp/bench/replay_instructions.cpp -o /tmp/ri
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
//       /tmp/ri TOKENS.i32 300000 {replay|replay-static|positions}
//   /tmp/ri TOKENS.i32 N replay-ngst TABLE.ngst [ROUNDS]
//
// replay: ngramcache.replay's path (replay_shared, no dynamic cache given, n_ctx 4096,
// n_draft 8) over the first N tokens; replay-static: the same with a static cache of the
// next N tokens' 2-grams; positions: update (nnew 1) and draft 8 from the context cache at
// every position, the vectors' loop; replay-ngst: the replay of the first N tokens with a
// static table file as the static cache (what `ngramcache stats -lcs TABLE.ngst` runs),
// ROUNDS times (default 1), printing each round's wall time per drafted token: with tables
// of hundreds of MB the cache misses show in the wall time, not in instruction counts.
#include <valgrind/callgrind.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <string>
#include <vector>

#include "ngramcache/shared_cache.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;

int main(int argc, char** argv) {
    const std::string mode = argc >= 4 ? argv[3] : "";
    if (!(argc == 4 || (mode == "replay-ngst" && (argc == 5 || argc == 6)))) {
        std::fprintf(stderr, "usage: %s TOKENS.i32 N {replay|replay-static|positions}\n"
                             "       %s TOKENS.i32 N replay-ngst TABLE.ngst [ROUNDS]\n", argv[0], argv[0]);
        return 2;
    }
    const size_t n = std::strtoul(argv[2], nullptr, 10);
    // replay-ngst reads only the N tokens it replays; the other modes also the next N
    std::vector<token_t> t(mode == "replay-ngst" ? n : 2 * n);
    FILE* f = std::fopen(argv[1], "rb");
    if (f == nullptr || std::fread(t.data(), sizeof(token_t), t.size(), f) != t.size()) {
        std::fprintf(stderr, "%s: cannot read %zu tokens\n", argv[1], t.size());
        return 2;
    }
    std::fclose(f);
    ReplayOptions opt;
    opt.n_ctx = 4096;
    opt.n_draft = 8;
    if (mode == "replay-ngst") {
        const StaticTable table = StaticTable::open(argv[4]);
        StaticSource st;
        st.table = &table;
        const int rounds = argc == 6 ? std::atoi(argv[5]) : 1;
        for (int r = 0; r < rounds; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            const std::clock_t c0 = std::clock();
            CALLGRIND_START_INSTRUMENTATION;
            const ReplayResult res = replay_shared(t.data(), n, opt, st, nullptr, false);
            CALLGRIND_STOP_INSTRUMENTATION;
            const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            // CPU time too: on a shared machine the wall time includes waits for a core
            std::printf("replay-ngst: %lld tokens drafted, %lld accepted, t_draft %.4f us per drafted token, "
                        "whole replay %.3f s, CPU %.3f s\n", static_cast<long long>(res.n_drafted),
                        static_cast<long long>(res.n_accept), 1e-3 * double(res.t_draft_ns) / double(res.n_drafted), s,
                        cpu);
        }
        return 0;
    }
    SharedCache statc;
    statc.unlocked().update(t.data() + n, n, 2, 2, n);

    long long drafted = 0;
    CALLGRIND_START_INSTRUMENTATION;
    if (mode == "replay" || mode == "replay-static") {
        StaticSource st;
        if (mode == "replay-static") st.cache = &statc;
        drafted = replay_shared(t.data(), n, opt, st, nullptr, false).n_drafted;
    } else if (mode == "positions") {
        NgramCache ctx;
        std::vector<token_t> out(8);
        for (size_t pos = 1; pos <= n; ++pos) {
            if (pos >= 2) ctx.update(t.data(), pos, 1, 4, 1);
            drafted += static_cast<long long>(draft(t.data(), pos, 8, 1, 4, ctx, nullptr, NoStatic{}, out.data()));
        }
    } else {
        std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
        return 2;
    }
    CALLGRIND_STOP_INSTRUMENTATION;
    std::printf("%s: %lld tokens drafted\n", mode.c_str(), drafted);
    return 0;
}
