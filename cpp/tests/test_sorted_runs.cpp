// Sorted runs and their k-way merge: shards of a stream merged into the bytes of the
// single-pass builds (NGST and lookup.bin), caches merged into the bytes of
// NgramCache::merge, with blocks small enough that every run is refilled many times.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngst_build.hpp"
#include "ngramcache/sorted_runs.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;
using test::Tokens;

static void write_bytes(const std::string& path, const std::vector<uint8_t>& data) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

static std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Shards [cuts[i], cuts[i+1]) of `t` as runs, plus the run of the n-grams across cuts
// (as ngramcache.sharded builds it from each shard's edges).
static std::vector<std::string> shard_runs(const test::TempDir& dir, const Tokens& t, std::vector<size_t> cuts,
                                           int n) {
    cuts.insert(cuts.begin(), 0);
    cuts.push_back(t.size());
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::string> paths;
    std::vector<runs::TokenStretch> edges;
    std::vector<Tokens> seqs;
    seqs.reserve(cuts.size());
    Tokens before;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
        const Tokens shard(t.begin() + long(cuts[r]), t.begin() + long(cuts[r + 1]));
        paths.push_back(dir.file("shard" + std::to_string(r)));
        write_bytes(paths.back(), runs::run_from_tokens({{shard.data(), shard.size(), r, size_t(n), uint64_t(n)}}, n));
        if (!before.empty()) {
            Tokens seq = before;
            seq.insert(seq.end(), shard.begin(), shard.begin() + long(std::min<size_t>(n, shard.size())));
            seqs.push_back(seq);
            edges.push_back({seqs.back().data(), seqs.back().size(), r, before.size(), 0});
        }
        before.insert(before.end(), shard.begin(), shard.end());
        if (before.size() > size_t(n)) before.erase(before.begin(), before.end() - n);
    }
    paths.push_back(dir.file("edges"));
    write_bytes(paths.back(), runs::run_from_tokens(edges, n));
    return paths;
}

TEST(shards_merge_into_the_single_pass_bytes) {
    std::mt19937 rng(7);
    for (int round = 0; round < 60; ++round) {
        const int n = 1 + round % 4;
        const Tokens t = test::random_stream(rng, rng() % 3000, token_t(2 + rng() % 40));
        std::vector<size_t> cuts;
        for (int c = int(rng() % 9); c-- > 0;) cuts.push_back(t.empty() ? 0 : rng() % (t.size() + 1));
        test::TempDir dir;
        const auto paths = shard_runs(dir, t, cuts, n);
        check::note() = "round " + std::to_string(round);
        const size_t block = 1 + rng() % 7;
        runs::MergeCounts counts;
        const ngst::Image img = runs::merge_to_ngst(paths, n, ngst::Source::tokens, runs::BestRule::tokens, block, counts);
        const ngst::Image want = ngst::build_image(t.data(), t.size(), n);
        CHECK_EQ(img.size, want.size);
        CHECK(std::memcmp(img.bytes.get(), want.bytes.get(), img.size) == 0);
        const runs::MergeCounts file_counts =
            runs::merge_to_ngst_file(paths, dir.file("out.ngst"), n, true, 1 + rng() % 7);
        const std::vector<uint8_t> file = read_bytes(dir.file("out.ngst"));
        CHECK_EQ(file.size(), want.size);
        CHECK(std::memcmp(file.data(), want.bytes.get(), file.size()) == 0);
        CHECK_EQ(file_counts.keys, counts.keys);
        CHECK_EQ(file_counts.total, counts.total);
        NgramCache cache;
        cache.update(t.data(), t.size(), n, n, t.size());
        runs::merge_to_lookup(paths, dir.file("out.bin"), dir.file("spool"), block);
        const std::vector<char> lookup = serialize_lookup(cache);
        const std::vector<uint8_t> got = read_bytes(dir.file("out.bin"));
        CHECK_EQ(got.size(), lookup.size());
        CHECK(std::memcmp(got.data(), lookup.data(), got.size()) == 0);
        CHECK_EQ(counts.keys, uint64_t(cache.size()));
        CHECK_EQ(counts.entries, uint64_t(cache.n_entries()));
    }
}

TEST(cache_runs_merge_like_ngramcache_merge) {
    std::mt19937 rng(11);
    for (int round = 0; round < 40; ++round) {
        const int lo = 1 + int(rng() % 2), hi = lo + int(rng() % 3);
        std::vector<std::unique_ptr<NgramCache>> caches;
        test::TempDir dir;
        std::vector<std::string> paths;
        NgramCache merged;
        for (int i = 0, k = 1 + int(rng() % 4); i < k; ++i) {
            caches.emplace_back(new NgramCache);
            const Tokens t = test::random_stream(rng, rng() % 800, token_t(2 + rng() % 25));
            caches.back()->update(t.data(), t.size(), lo, hi, t.size());
            paths.push_back(dir.file("in" + std::to_string(i)));
            std::vector<runs::RunEntry> entries = runs::cache_entries(*caches.back(), uint64_t(i), i > 0);
            runs::save_run(entries, paths.back());
        }
        // What a merge starting from a copy of the first cache gives: its file, loaded.
        const std::vector<char> first = serialize_lookup(*caches[0]);
        load_lookup(merged, first.data(), first.size(), "first");
        std::vector<std::string> reloaded = {dir.file("first")};
        {
            NgramCache again;
            load_lookup(again, first.data(), first.size(), "first");
            std::vector<runs::RunEntry> entries = runs::cache_entries(again, 0, false);
            runs::save_run(entries, reloaded[0]);
        }
        for (size_t i = 1; i < caches.size(); ++i) {
            merged.merge(*caches[i]);
            reloaded.push_back(paths[i]);
        }
        check::note() = "round " + std::to_string(round);
        runs::merge_to_lookup(reloaded, dir.file("out.bin"), dir.file("spool"), 1 + rng() % 5);
        const std::vector<char> want = serialize_lookup(merged);
        const std::vector<uint8_t> got = read_bytes(dir.file("out.bin"));
        CHECK_EQ(got.size(), want.size());
        CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
    }
}

TEST(a_shared_caches_run_is_its_entries_run_and_makes_its_table) {
    std::mt19937 rng(13);
    for (int round = 0; round < 20; ++round) {
        const int n = 1 + round % 4;
        const Tokens t = test::random_stream(rng, rng() % 1500, token_t(2 + rng() % 30));
        SharedCache shared;
        shared.unlocked().update(t.data(), t.size(), n, n, t.size());
        test::TempDir dir;
        check::note() = "round " + std::to_string(round);
        const bool llama_order = round % 2 == 1;
        runs::save_cache_run(shared, 3, llama_order, dir.file("shared.run"));
        std::vector<runs::RunEntry> entries = runs::cache_entries(shared.unlocked(), 3, llama_order);
        runs::save_run(entries, dir.file("plain.run"));
        CHECK(read_bytes(dir.file("shared.run")) == read_bytes(dir.file("plain.run")));
        // one cache's run merged into a table: the table of that cache
        runs::merge_to_ngst_file({dir.file("shared.run")}, dir.file("t.ngst"), n, false, 1 + rng() % 9);
        const StaticTable want = StaticTable::from_cache(shared.unlocked(), n);
        const std::vector<uint8_t> got = read_bytes(dir.file("t.ngst"));
        CHECK_EQ(got.size(), size_t(want.nbytes()));
        CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
    }
}

TEST(damaged_runs_are_format_errors) {
    test::TempDir dir;
    const Tokens t = {1, 2, 3, 1, 2, 4, 5};
    std::vector<uint8_t> good = runs::run_from_tokens({{t.data(), t.size(), 0, 2, 2}}, 2);
    runs::MergeCounts c;
    auto merge = [&](const std::vector<uint8_t>& img) {
        write_bytes(dir.file("r"), img);
        runs::merge_to_ngst({dir.file("r")}, 2, ngst::Source::tokens, runs::BestRule::tokens, 2, c);
    };
    CHECK_THROWS_AS(merge(std::vector<uint8_t>(good.begin(), good.begin() + 10)), FormatError, "header");
    CHECK_THROWS_AS(merge(std::vector<uint8_t>(good.begin(), good.end() - 40)), FormatError, "entry count");
    std::vector<uint8_t> swapped = good;
    std::memcpy(swapped.data() + 32, good.data() + 72, 40);
    std::memcpy(swapped.data() + 72, good.data() + 32, 40);
    CHECK_THROWS_AS(merge(swapped), FormatError, "out of order");
    CHECK_THROWS_AS(runs::merge_to_ngst({dir.file("none")}, 2, ngst::Source::tokens, runs::BestRule::tokens, 2, c),
                    FileNotFound, "no such file");
}

CHECK_MAIN()
