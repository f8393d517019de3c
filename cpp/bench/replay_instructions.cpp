// Instruction counts of the drafting loops, for comparing two revisions of the core under
// callgrind (bench/RESULTS.md, "Ties in libstdc++'s order: what they cost"). Only the loop
// itself is instrumented; the result is printed so that two builds can be checked to do
// the same work.
//
//   g++ -O3 -DNDEBUG -std=c++17 -I<revision>/cpp/include cpp/bench/replay_instructions.cpp -o /tmp/ri
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
//       /tmp/ri TOKENS.i32 300000 {replay|replay-static|positions}
//
// replay: ngramcache.replay's path (replay_shared, no dynamic cache given, n_ctx 4096,
// n_draft 8) over the first N tokens; replay-static: the same with a static cache of the
// next N tokens' 2-grams; positions: update (nnew 1) and draft 8 from the context cache at
// every position, the vectors' loop.
#include <valgrind/callgrind.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ngramcache/shared_cache.hpp"

using namespace ngramcache;

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s TOKENS.i32 N {replay|replay-static|positions}\n", argv[0]);
        return 2;
    }
    const size_t n = std::strtoul(argv[2], nullptr, 10);
    const std::string mode = argv[3];
    std::vector<token_t> t(2 * n);
    FILE* f = std::fopen(argv[1], "rb");
    if (f == nullptr || std::fread(t.data(), sizeof(token_t), t.size(), f) != t.size()) {
        std::fprintf(stderr, "%s: cannot read %zu tokens\n", argv[1], t.size());
        return 2;
    }
    std::fclose(f);
    SharedCache statc;
    statc.unlocked().update(t.data() + n, n, 2, 2, n);
    ReplayOptions opt;
    opt.n_ctx = 4096;
    opt.n_draft = 8;

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
