// The core against llama.cpp's own outputs (the public reference vectors): cache files
// re-serialised byte for byte, counts of update, merge and the static build, every
// public draft, and llama-lookup-stats' totals. Skipped when the vectors are absent.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;
using test::Tokens;

// NGRAMCACHE_VECTORS is set by CTest (CMake option of the same name).
// A folder holding the full set, or the compact copy unpacked by
// `scripts/compact_vectors.py --unpack` (which adds its compact.json).
static std::string vectors_file(const std::string& name, bool required = true) {
    const char* dir = std::getenv("NGRAMCACHE_VECTORS");
    if (dir == nullptr || *dir == '\0') SKIP("NGRAMCACHE_VECTORS is not set");
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (required && !std::filesystem::is_regular_file(p)) SKIP("reference vector " + p.string() + " is absent");
    return p.string();
}

static std::unique_ptr<NgramCache> load(const std::string& name) {
    auto c = std::make_unique<NgramCache>();
    load_lookup_file(*c, vectors_file(name));
    return c;
}

static Tokens tokens(const std::string& name) {
    const std::vector<char> raw = read_file(vectors_file(name));
    CHECK_EQ(raw.size() % 4, size_t(0));
    Tokens t(raw.size() / 4);
    for (size_t i = 0; i < t.size(); ++i) t[i] = load_i32(raw.data() + 4 * i);
    return t;
}

struct Triple {
    Ngram key;
    token_t token;
    int64_t count;
    bool operator==(const Triple& o) const { return key == o.key && token == o.token && count == o.count; }
};

// Order-free content (llama.cpp writes records in libstdc++'s hash-map order): every
// (key, token, count), sorted.
static std::vector<Triple> canonical(const NgramCache& c) {
    std::vector<Triple> v;
    for (size_t i = 0; i < c.size(); ++i)
        for (const Entry& e : c.part_at(i)) v.push_back({c.key_at(i), e.token, e.count});
    std::sort(v.begin(), v.end(), [](const Triple& a, const Triple& b) {
        return a.key < b.key || (a.key == b.key && a.token < b.token);
    });
    return v;
}

static void check_same_content(const NgramCache& a, const NgramCache& b) {
    CHECK_EQ(a.size(), b.size());
    CHECK(canonical(a) == canonical(b));
}

// The README's loop: append a token, update(1..4, nnew 1) from two tokens on.
static void grow_context(NgramCache& c, const Tokens& t, size_t upto) {
    for (size_t len = 2; len <= upto; ++len) c.update(t.data(), len, 1, 4, 1);
}

// Built the way llama.cpp built them, the caches serialise to the very bytes of its files.
TEST(cache_files_are_rebuilt_byte_for_byte) {
    for (const char* name : {"prose", "dynpub"}) {  // incremental updates, one token at a time
        check::note() = name;
        const Tokens t = tokens(std::string(name) + ".tokens.i32");
        NgramCache c;
        grow_context(c, t, t.size());
        CHECK(serialize_lookup(c) == read_file(vectors_file(std::string(name) + ".context.bin")));
    }
    const Tokens small = tokens("small-static.tokens.i32");
    NgramCache st;  // llama-lookup-create
    st.update(small.data(), small.size(), 2, 2, small.size());
    CHECK(serialize_lookup(st) == read_file(vectors_file("static-small.lcs.bin")));
    auto merged = load("prose.context.bin");  // llama-lookup-merge
    merged->merge(*load("dynpub.context.bin"));
    CHECK(serialize_lookup(*merged) == read_file(vectors_file("merged.prose+dynpub.bin")));
}

TEST(context_cache_matches_llama_cpp) {
    const Tokens prose = tokens("prose.tokens.i32");
    CHECK_EQ(prose.size(), size_t(60394));
    NgramCache ours;
    grow_context(ours, prose, prose.size());
    const auto theirs = load("prose.context.bin");
    CHECK_EQ(theirs->size(), size_t(132923));
    check_same_content(ours, *theirs);
}

TEST(merge_matches_llama_lookup_merge) {
    const auto merged = load("prose.context.bin");
    merged->merge(*load("dynpub.context.bin"));
    const auto theirs = load("merged.prose+dynpub.bin");
    CHECK_EQ(theirs->size(), size_t(230022));
    check_same_content(*merged, *theirs);
}

TEST(static_build_matches_llama_lookup_create) {
    const Tokens corpus = tokens("small-static.tokens.i32");
    const auto theirs = load("static-small.lcs.bin");
    const StaticTable built = StaticTable::build(corpus.data(), corpus.size(), 2);
    built.verify();
    CHECK_EQ(built.n_keys(), uint64_t(79343));
    CHECK_EQ(built.n_entries(), uint64_t(143761));
    CHECK_EQ(built.total(), uint64_t(248750));
    for (size_t i = 0; i < theirs->size(); ++i) {
        const StaticTable::Ref r = built.find(theirs->key_at(i).t);
        CHECK(r != nullptr);
        for (const Entry& e : theirs->part_at(i)) CHECK_EQ(built.count(r, e.token), int64_t(e.count));
    }
    NgramCache ours;
    ours.update(corpus.data(), corpus.size(), 2, 2, corpus.size());
    check_same_content(ours, *theirs);
}

struct Row {
    size_t pos;
    Tokens draft;
};

// Lines of the form {"pos": 3, "draft": [49126, 35696]}.
static std::vector<Row> read_drafts(const std::string& name) {
    std::ifstream f(vectors_file(name));
    std::vector<Row> rows;
    std::string line;
    while (std::getline(f, line)) {
        Row r;
        const size_t p = line.find("\"pos\":"), b = line.find('[');
        CHECK(p != std::string::npos && b != std::string::npos);
        r.pos = std::stoul(line.substr(p + 6));
        for (const char* c = line.c_str() + b + 1; *c != ']';) {
            char* end;
            r.draft.push_back(token_t(std::strtol(c, &end, 10)));
            CHECK(end != c);
            c = end;
            while (*c == ',' || *c == ' ') ++c;
        }
        rows.push_back(std::move(r));
    }
    return rows;
}

// Every row of the log against the draft at its position. The full log has a row for every
// position; the compact copy of the vectors (tests/data) keeps some of them, in order (the
// Python tests check the rows left out through their hash).
template <class Static>
static void check_drafts(const std::vector<Row>& want, const Tokens& prose, const NgramCache* dynamic,
                         const Static& st) {
    const bool compact = std::filesystem::is_regular_file(vectors_file("compact.json", false));
    if (!compact) CHECK_EQ(want.size(), prose.size());
    CHECK(want.size() >= 600 && want.size() <= prose.size());
    NgramCache context;
    Tokens out(8);
    size_t drafted = 0, row = 0;
    for (size_t i = 0; i < prose.size(); ++i) {
        const size_t len = i + 1;
        if (len >= 2) context.update(prose.data(), len, 1, 4, 1);
        const size_t n = draft(prose.data(), len, 8, 1, 4, context, dynamic, st, out.data());
        drafted += n;
        if (row == want.size() || want[row].pos != len) continue;
        check::note() = "pos " + std::to_string(len);
        CHECK_EQ(Tokens(out.begin(), out.begin() + n), want[row].draft);
        ++row;
    }
    check::note().clear();
    CHECK_EQ(row, want.size());  // every row matched a position, in order
    CHECK(drafted > 80000);
}

TEST(context_only_drafts) {
    const std::vector<Row> want = read_drafts("prose.drafts.context-only.jsonl");
    check_drafts(want, tokens("prose.tokens.i32"), nullptr, NoStatic{});
}

TEST(full_pub_drafts) {
    const std::vector<Row> want = read_drafts("prose.drafts.full-pub.jsonl");
    const Tokens prose = tokens("prose.tokens.i32");
    const auto dynamic = load("dynpub.context.bin");
    const auto st = load("static-small.lcs.bin");
    check_drafts(want, prose, dynamic.get(), CacheAsStatic{st.get()});
    const StaticTable table = StaticTable::from_lookup_file(vectors_file("static-small.lcs.bin"), 2);
    check_drafts(want, prose, dynamic.get(), table);
}

TEST(replay_matches_llama_lookup_stats) {
    // README, "Tool-level numbers": -c 4096 --spec-draft-n-max 8.
    const Tokens prose = tokens("prose.tokens.i32");
    const auto st = load("static-small.lcs.bin");
    const ReplayOptions o = test::replay_options(4096, 8);
    NgramCache none;
    ReplayResult r = replay(prose.data(), prose.size(), o, none, NoStatic{});
    CHECK_EQ(r.n_chunks, int64_t(14));
    CHECK_EQ(r.n_drafted, int64_t(44330));
    CHECK_EQ(r.n_accept, int64_t(7115));
    NgramCache none2;
    r = replay(prose.data(), prose.size(), o, none2, CacheAsStatic{st.get()});
    CHECK_EQ(r.n_drafted, int64_t(50387));
    CHECK_EQ(r.n_accept, int64_t(7938));
    const auto dynamic = load("dynpub.context.bin");
    r = replay(prose.data(), prose.size(), o, *dynamic, CacheAsStatic{st.get()});
    CHECK_EQ(r.n_drafted, int64_t(53695));
    CHECK_EQ(r.n_accept, int64_t(8967));
}

CHECK_MAIN()
