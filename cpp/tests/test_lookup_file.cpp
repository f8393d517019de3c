// llama.cpp's lookup.bin (docs/llama-lookup.md §4): the exact bytes, every malformed case, the
// first-wins rule for duplicates, and the file helpers (read_file, write_file_atomic).
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/lookup_file.hpp"

using namespace ngramcache;
using test::Tokens;

using Bytes = std::vector<char>;

static void put_i32(Bytes& b, int32_t v) { store_i32(b, v); }

// One record: the key (padded to 4 slots with -1; pass 4 values to set every slot), ntokens
// (the pair count unless given), the pairs.
static Bytes record(std::vector<int32_t> key, std::vector<std::pair<int32_t, int32_t>> pairs, int32_t ntokens = -99) {
    Bytes b;
    while (key.size() < 4) key.push_back(-1);
    for (int32_t t : key) put_i32(b, t);
    put_i32(b, ntokens == -99 ? int32_t(pairs.size()) : ntokens);
    for (auto& p : pairs) {
        put_i32(b, p.first);
        put_i32(b, p.second);
    }
    return b;
}

static Bytes cat(Bytes a, const Bytes& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

static void load(NgramCache& c, const Bytes& b) { load_lookup(c, b.data(), b.size(), "x.bin"); }

static void expect_format_error(const Bytes& b, const std::string& why, size_t offset) {
    NgramCache c;
    CHECK_THROWS_AS(load(c, b), FormatError, "x.bin: not a valid lookup.bin: ");
    CHECK_THROWS_AS(load(c, b), FormatError, why);
    CHECK_THROWS_AS(load(c, b), FormatError, "at byte offset " + std::to_string(offset));
    // The offset is the whole number at the end of the message, not a prefix of it.
    try {
        load(c, b);
    } catch (const FormatError& e) {
        const std::string msg = e.what(), tail = "at byte offset " + std::to_string(offset);
        CHECK_EQ(msg.substr(msg.size() - tail.size()), tail);
    }
}

TEST(serialize_gives_the_documented_bytes) {
    // The documented example (docs/llama-lookup.md §4): key (15043, 3186), next tokens 29871 x 5 and 13 x 2. A map
    // that received 13 and then 29871 visits 29871 first.
    NgramCache c;
    Part& p = c.get_or_insert(Ngram::of2(15043, 3186));
    p.add(13, 2);
    p.add(29871, 5);
    const Bytes img = serialize_lookup(c);
    const unsigned char want[] = {0xc3, 0x3a, 0x00, 0x00, 0x72, 0x0c, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
                                  0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00, 0xaf, 0x74, 0x00, 0x00,
                                  0x05, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00};
    CHECK_EQ(img.size(), sizeof want);
    CHECK(std::memcmp(img.data(), want, sizeof want) == 0);
}

TEST(round_trip_keeps_counts_and_order) {
    std::mt19937 rng(30);
    for (int round = 0; round < 12; ++round) {
        const Tokens t = test::random_stream(rng, rng() % 3000, round % 2 ? 7 : 400);
        NgramCache c;
        test::RefCache r;
        c.update(t.data(), t.size(), 1, 4, t.size());
        r.update(t, t.size(), 1, 4, t.size());
        const Bytes img = serialize_lookup(c);
        size_t want = 0;
        for (auto& part : r.parts) want += 20 + 8 * part.size();
        CHECK_EQ(img.size(), want);
        NgramCache back;
        load(back, img);
        test::check_same(back, r.as_loaded());
    }
}

TEST(empty_image_is_an_empty_cache) {
    NgramCache c;
    load(c, Bytes{});
    CHECK_EQ(c.size(), size_t(0));
    CHECK(serialize_lookup(c).empty());
}

TEST(parse_reports_records_in_file_order) {
    const Bytes img = cat(record({4, 5}, {{6, 1}, {7, 2}}), record({9}, {{1, 3}}));
    std::vector<std::pair<Ngram, int32_t>> seen;
    std::vector<int32_t> values;
    parse_lookup(img.data(), img.size(), "x.bin", [&](const Ngram& k, const char* pairs, int32_t n) {
        seen.emplace_back(k, n);
        for (int32_t j = 0; j < 2 * n; ++j) values.push_back(load_i32(pairs + 4 * j));
    });
    CHECK_EQ(seen.size(), size_t(2));
    CHECK(seen[0].first == Ngram::of2(4, 5));
    CHECK_EQ(seen[0].second, 2);
    const token_t k9[1] = {9};
    CHECK(seen[1].first == Ngram(k9, 1));
    CHECK_EQ(values, (std::vector<int32_t>{6, 1, 7, 2, 1, 3}));
}

TEST(malformed_images_name_the_byte_offset) {
    const Bytes good = record({4, 5}, {{6, 1}, {7, 2}});  // 36 bytes
    CHECK_EQ(good.size(), size_t(36));
    {
        Bytes b = good;
        b.resize(38);
        expect_format_error(b, "file size 38 is not a multiple of 4", 36);
    }
    {
        Bytes b = good;
        b.resize(16);
        expect_format_error(b, "truncated record (16 bytes left, a record needs at least 20)", 0);
        b = good;
        b.resize(32);  // ntokens says 2 pairs, one is missing
        expect_format_error(b, "truncated record (needs 36 bytes, 32 left)", 0);
        expect_format_error(cat(good, Bytes(good.begin(), good.begin() + 28)), "needs 36 bytes, 28 left", 36);
    }
    expect_format_error(record({-1, -1, -1, -1}, {{6, 1}}), "invalid n-gram key", 0);
    expect_format_error(cat(good, record({1, -1, 2, -1}, {{6, 1}})), "invalid n-gram key", 36);
    expect_format_error(record({-5, 2}, {{6, 1}}), "invalid n-gram key", 0);
    expect_format_error(record({1, 2, 3, -7}, {{6, 1}}), "invalid n-gram key", 0);
    expect_format_error(record({4, 5}, {}, 0), "ntokens = 0 (must be > 0)", 16);
    expect_format_error(cat(good, record({4, 5}, {{1, 1}}, -3)), "ntokens = -3 (must be > 0)", 36 + 16);
    expect_format_error(record({4, 5}, {{6, 1}, {-2, 1}}), "token id -2 < 0", 28);
    expect_format_error(record({4, 5}, {{6, 0}}), "count 0 (must be > 0)", 24);
    expect_format_error(cat(good, record({4, 5}, {{6, 1}, {7, -9}})), "count -9 (must be > 0)", 36 + 32);
}

TEST(a_malformed_record_adds_nothing_after_it) {
    // Records before the bad one may have been added (the caller discards the cache);
    // nothing from the bad record or beyond is.
    const Bytes img = cat(cat(record({1}, {{2, 1}}), record({3}, {{4, 0}})), record({5}, {{6, 1}}));
    NgramCache c;
    CHECK_THROWS_AS(load(c, img), FormatError, "count 0");
    const token_t k3[1] = {3}, k5[1] = {5};
    CHECK(c.find(Ngram(k3, 1)) == nullptr);
    CHECK(c.find(Ngram(k5, 1)) == nullptr);
}

TEST(duplicate_keys_and_tokens_keep_the_first) {
    const Bytes img = cat(record({4, 5}, {{6, 1}, {7, 2}, {6, 9}}), record({4, 5}, {{8, 3}}));
    NgramCache c;
    load(c, img);
    CHECK_EQ(c.size(), size_t(1));
    const Part& p = c.part_at(0);
    CHECK_EQ(p.size(), 2u);
    CHECK_EQ(p[0].token, 6);
    CHECK_EQ(p[0].count, 1);
    CHECK_EQ(p[1].token, 7);
    CHECK_EQ(p[1].count, 2);
    CHECK_EQ(p.count_of(8), 0);
    CHECK_EQ(p.sum(), 3);
    CHECK_EQ(p.max_count(), 2);
}

TEST(read_file_errors) {
    test::TempDir dir;
    CHECK_THROWS_AS(read_file(dir.file("missing.bin")), FileNotFound, "missing.bin: no such file");
    CHECK_THROWS_AS(read_file(dir.path().string()), std::system_error, "is a directory");
    std::ofstream(dir.file("three.bin"), std::ios::binary) << "abc";
    CHECK_EQ(read_file(dir.file("three.bin")), (Bytes{'a', 'b', 'c'}));
    std::ofstream(dir.file("empty.bin"), std::ios::binary).close();
    CHECK(read_file(dir.file("empty.bin")).empty());
}

TEST(read_file_reads_large_files_whole) {
    test::TempDir dir;
    Bytes big(300000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 7 + i / 251);
    write_file_atomic(dir.file("big.bin"), big.data(), big.size());
    CHECK(read_file(dir.file("big.bin")) == big);
}

TEST(write_file_atomic_replaces_and_leaves_no_temporary) {
    test::TempDir dir;
    const mode_t old_mask = ::umask(022);
    const std::string path = dir.file("cache.bin");
    const char first[] = "first version, longer than the second";
    write_file_atomic(path, first, sizeof first - 1);
    CHECK_EQ(read_file(path).size(), sizeof first - 1);
    write_file_atomic(path, "second", 6);
    CHECK_EQ(read_file(path), (Bytes{'s', 'e', 'c', 'o', 'n', 'd'}));
    write_file_atomic(path, "", 0);
    CHECK(read_file(path).empty());
    CHECK_EQ(dir.listing(), std::vector<std::string>{"cache.bin"});
    struct stat st;
    CHECK(::stat(path.c_str(), &st) == 0);
    ::umask(old_mask);
    CHECK_EQ(st.st_mode & 0777, 0644u);
}

TEST(write_file_atomic_into_a_missing_folder_throws) {
    test::TempDir dir;
    CHECK_THROWS_AS(write_file_atomic(dir.file("no/such/cache.bin"), "x", 1), PathError,
                    "cache.bin: the folder " + dir.file("no/such") + " does not exist");
    CHECK(dir.listing().empty());
}

TEST(save_and_load_files) {
    test::TempDir dir;
    std::mt19937 rng(31);
    const Tokens t = test::random_stream(rng, 5000, 50);
    NgramCache c;
    c.update(t.data(), t.size(), 1, 4, t.size());
    save_lookup_file(c, dir.file("c.bin"));
    NgramCache back;
    load_lookup_file(back, dir.file("c.bin"));
    test::RefCache r;
    r.update(t, t.size(), 1, 4, t.size());
    test::check_same(back, r.as_loaded());
    CHECK_EQ(dir.listing(), std::vector<std::string>{"c.bin"});
    NgramCache none;
    CHECK_THROWS_AS(load_lookup_file(none, dir.file("d.bin")), FileNotFound, "d.bin");
    std::ofstream(dir.file("bad.bin"), std::ios::binary) << "abcde";
    CHECK_THROWS_AS(load_lookup_file(none, dir.file("bad.bin")), FormatError, dir.file("bad.bin") + ": not a valid");
}

CHECK_MAIN()
