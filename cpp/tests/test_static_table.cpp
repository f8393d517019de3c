// StaticTable (the NGST file): build() agrees with NgramCache, the documented image is
// reproduced byte for byte, damaged images are rejected (header at open, every section by
// verify), and the lookup.bin export round-trips.
#include <sys/stat.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;
using test::Tokens;

using Image = std::vector<uint8_t>;

static Image image_of(const StaticTable& t) { return Image(t.data(), t.data() + t.nbytes()); }

static StaticTable table_of(const Image& img) { return StaticTable::from_image(img.data(), img.size(), "t.ngst"); }

// NgramCache is neither copied nor moved: handed out on the heap.
static std::unique_ptr<NgramCache> cache_of(const Tokens& t, int n) {
    auto c = std::make_unique<NgramCache>();
    c->update(t.data(), t.size(), n, n, t.size());
    return c;
}

// The best token llama.cpp picks from part `p` when the part reaches it through the
// lookup.bin saved from it (`through_file`) or as it is (a loaded file's record).
static token_t llama_best(const Part& p, bool through_file) {
    if (!through_file) return best_by_count(p);
    const int32_t mx = p.max_count();
    const size_t i = libstdcxx::first_after_reload(
        p.size(), [&](size_t j) { return p[uint32_t(j)].token; }, [&](size_t j) { return p[uint32_t(j)].count == mx; });
    return p[uint32_t(i)].token;
}

// Every key of `c` of size n is in `t` with the same counts and llama.cpp's best token.
static void check_table_has_cache(const StaticTable& t, const NgramCache& c, int n, bool through_file = true) {
    uint64_t keys = 0, entries = 0, total = 0;
    for (size_t i = 0; i < c.size(); ++i) {
        const Ngram& k = c.key_at(i);
        if (k.size() != n) continue;
        const Part& p = c.part_at(i);
        ++keys;
        entries += p.size();
        total += uint64_t(p.sum());
        const StaticTable::Ref r = t.find(k.t);
        check::note() = "key " + test::show_key(k);
        CHECK(r != nullptr);
        if (n == 2) CHECK(t.find2(k.t[0], k.t[1]) == r);
        CHECK_EQ(t.sum(r), p.sum());
        CHECK_EQ(t.best_count(r), int64_t(p.max_count()));
        CHECK_EQ(t.best_token(r), llama_best(p, through_file));
        for (const Entry& e : p) CHECK_EQ(t.count(r, e.token), int64_t(e.count));
        CHECK_EQ(t.count(r, 1 << 30), int64_t(0));
        uint64_t seen = 0;
        token_t prev = -1;
        t.for_each_entry(r, [&](token_t tok, int64_t cnt) {
            CHECK(tok > prev);  // ascending
            prev = tok;
            CHECK_EQ(cnt, int64_t(p.count_of(tok)));
            ++seen;
        });
        CHECK_EQ(seen, uint64_t(p.size()));
    }
    check::note().clear();
    CHECK_EQ(t.n_keys(), keys);
    CHECK_EQ(t.n_entries(), entries);
    CHECK_EQ(t.total(), total);
    CHECK_EQ(t.ngram_size(), n);
}

// Streams that reach the build's different paths: tiny and wide vocabularies, keys with
// hundreds of continuations, ids that need 128-bit packing and sparse huge ids.
static std::vector<Tokens> streams() {
    std::mt19937 rng(40);
    std::vector<Tokens> s;
    s.push_back({});
    s.push_back({3});
    s.push_back({3, 4});
    s.push_back({1, 2, 3, 1, 2, 4, 1, 2, 3});
    s.push_back(Tokens(50, 7));
    for (token_t v : {1, 2, 3, 9, 60, 1000}) s.push_back(test::random_stream(rng, 200 + rng() % 2000, v));
    s.push_back(test::random_stream(rng, 20000, 100));
    s.push_back(test::random_stream(rng, 3000, 200000));  // 18-bit ids: 4-grams need 72 bits
    Tokens sparse = test::random_stream(rng, 1500, 12);
    for (auto& x : sparse) x = x * 150000000 + (x % 3);  // ids up to ~1.6e9, 12 distinct
    s.push_back(sparse);
    Tokens top = test::random_stream(rng, 800, 4);
    for (auto& x : top) x = INT32_MAX - x;
    s.push_back(top);
    return s;
}

TEST(build_equals_from_cache) {
    const std::vector<Tokens> all = streams();
    for (size_t si = 0; si < all.size(); ++si)
        for (int n = 1; n <= 4; ++n) {
            const Tokens& t = all[si];
            check::note() = "stream " + std::to_string(si) + " n " + std::to_string(n);
            const auto owned = cache_of(t, n);
            const NgramCache& c = *owned;
            const StaticTable built = StaticTable::build(t.data(), t.size(), n);
            // build() decides ties as llama.cpp does with the lookup.bin of the same tokens.
            const std::vector<char> file = serialize_lookup(c);
            NgramCache loaded;
            load_lookup(loaded, file.data(), file.size(), "cache.bin");
            const StaticTable from = StaticTable::from_cache(loaded, n, ngst::Source::tokens);
            CHECK(image_of(built) == image_of(from));  // equal contents give equal files
            CHECK_EQ(built.total(), uint64_t(t.size() > size_t(n) ? t.size() - n : 0));
            built.verify();
            check_table_has_cache(built, c, n);
            CHECK(!built.mapped());
        }
}

TEST(documented_example_image) {
    // docs/format.md, "Example": StaticTable.build([1, 2, 3, 1, 2, 4, 1, 2, 3]).
    const char* rows[] = {
        "4e475354 0100fffe 02020000 05000000", "06000000 00000000 07000000 00000000",
        "02000000 fea3dec3 c7421970 ade52e0a", "4d1c205f 50a36247 53852336 6beff636",
        "00000000 01000000 02000000 04000000", "05000000",
    };
    const char* records[] = {
        "00000000 01000000 01000000 01000000 02000000 03000000",
        "00000000 01000000 02000000 01000000 03000000 01000000",
        "00000000 03000000 03000000 02000000 01000000 02000000",
        "02000000 01000000 02000000 01000000 04000000 01000000",
        "02000000 01000000 01000000 01000000 02000000 04000000",
    };
    auto hex = [](const char* s, Image& out) {
        for (const char* p = s; *p;) {
            if (*p == ' ') {
                ++p;
                continue;
            }
            out.push_back(uint8_t(std::stoi(std::string(p, 2), nullptr, 16)));
            p += 2;
        }
    };
    Image want;
    for (const char* r : rows) hex(r, want);
    want.resize(0x80, 0);
    for (const char* r : records) hex(r, want);
    want.resize(0x100, 0);
    hex("03000000 02000000 04000000 01000000", want);  // the entries section
    want.resize(320, 0);
    const Tokens t = {1, 2, 3, 1, 2, 4, 1, 2, 3};
    const StaticTable built = StaticTable::build(t.data(), t.size(), 2);
    CHECK_EQ(built.nbytes(), uint64_t(320));
    CHECK(image_of(built) == want);
    CHECK_EQ(built.n_keys(), uint64_t(5));
    CHECK_EQ(built.n_entries(), uint64_t(6));
    CHECK_EQ(built.header().n_stored, uint64_t(2));
    CHECK_EQ(built.header().bucket_bits, 2u);
}

TEST(describe_places_every_section) {
    // the documented example again (docs/format.md, "Example"): its sections and checksums
    const Tokens t = {1, 2, 3, 1, 2, 4, 1, 2, 3};
    const StaticTable built = StaticTable::build(t.data(), t.size(), 2);
    const ngst::Description d = ngst::describe(built.header());
    CHECK_EQ(std::string(d.magic), std::string("NGST"));
    CHECK_EQ(d.layout.file_size, uint64_t(320));
    CHECK_EQ(d.layout.n_buckets, uint64_t(4));
    CHECK_EQ(d.layout.stride, 24u);
    const uint64_t want[4][2] = {{0, 64}, {64, 20}, {128, 120}, {256, 16}};
    const char* names[4] = {"header", "index", "records", "entries"};
    for (int i = 0; i < 4; ++i) {
        check::note() = names[i];
        CHECK_EQ(std::string(d.sections[i].name), std::string(names[i]));
        CHECK_EQ(d.sections[i].offset, want[i][0]);
        CHECK_EQ(d.sections[i].size, want[i][1]);
    }
    check::note().clear();
    CHECK_EQ(d.sections[0].checksum, uint64_t(built.header().ck_header));
    CHECK_EQ(d.sections[0].checksum, uint64_t(0xc3dea3feull));
    CHECK_EQ(d.sections[1].checksum, uint64_t(0x0a2ee5ad701942c7ull));
    CHECK_EQ(d.sections[2].checksum, built.header().ck_records);
    CHECK_EQ(d.sections[3].checksum, built.header().ck_entries);
}

TEST(decode_header_prefix_reads_no_further_than_given) {
    const Tokens t = {1, 2, 3, 1, 2, 4, 1, 2, 3};
    const Image img = image_of(StaticTable::build(t.data(), t.size(), 2));
    const ngst::Header whole = ngst::decode_header_prefix(img.data(), img.size(), img.size(), "t.ngst");
    CHECK_EQ(whole.n_keys, uint64_t(5));
    CHECK_EQ(whole.ck_index, uint64_t(0x0a2ee5ad701942c7ull));
    // a short file: its bytes alone (a copy of exactly that length, so ASan sees any read past it)
    for (size_t n : {size_t(0), size_t(10), size_t(63)}) {
        const std::vector<uint8_t> head(img.begin(), img.begin() + static_cast<long>(n));
        CHECK_THROWS_AS(ngst::decode_header_prefix(head.data(), n, n, "s.ngst"), FormatError,
                        n == 0 ? "empty file" : "truncated");
    }
    // the full header of a longer file than it describes
    CHECK_THROWS_AS(ngst::decode_header_prefix(img.data(), 64, img.size() + 64, "l.ngst"), FormatError,
                    "trailing data");
}

TEST(find_of_absent_keys) {
    std::mt19937 rng(41);
    const Tokens t = test::random_stream(rng, 3000, 30);
    for (int n = 1; n <= 4; ++n) {
        const auto owned = cache_of(t, n);
            const NgramCache& c = *owned;
        const StaticTable tab = StaticTable::build(t.data(), t.size(), n);
        int absent = 0;
        for (int i = 0; i < 3000; ++i) {
            token_t k[4];
            for (auto& x : k) x = token_t(rng() % 34);
            const bool in_cache = c.find(Ngram(k, n)) != nullptr;
            CHECK_EQ(tab.find(k) != nullptr, in_cache);
            if (n == 2) CHECK_EQ(tab.find2(k[0], k[1]) != nullptr, in_cache);
            absent += !in_cache;
        }
        CHECK(absent > 100);
    }
    const Tokens none = {5};
    const StaticTable empty = StaticTable::build(none.data(), none.size(), 2);
    CHECK_EQ(empty.n_keys(), uint64_t(0));
    CHECK(empty.find2(5, 5) == nullptr);
    const token_t k[2] = {0, 0};
    CHECK(empty.find(k) == nullptr);
    token_t tok = -1;
    CHECK(!empty.best(nullptr, tok));
    empty.verify();
    CHECK(empty.to_lookup().empty());
}

TEST(best_applies_the_static_thresholds) {
    // (1 2) -> 3 x2, 4 x1 passes; (2 3) -> 1 x1 has sample 1 and fails; (3 1) -> 2 x1 too.
    const Tokens t = {1, 2, 3, 1, 2, 4, 1, 2, 3};
    const StaticTable tab = StaticTable::build(t.data(), t.size(), 2);
    token_t tok = -1;
    CHECK(tab.best(tab.find2(1, 2), tok));
    CHECK_EQ(tok, 3);
    CHECK(!tab.best(tab.find2(2, 3), tok));
    // 1 and 2 tie, 2 first seen later: the file lists 2 then 1, and the map loaded from it
    // visits 1 first.
    const Tokens tie = {7, 8, 1, 7, 8, 2, 7, 8, 2, 7, 8, 1};
    const StaticTable tt = StaticTable::build(tie.data(), tie.size(), 2);
    CHECK(tt.best(tt.find2(7, 8), tok));
    CHECK_EQ(tok, 1);
}

TEST(build_rejects_bad_input) {
    const Tokens t = {1, 2, -3, 4};
    CHECK_THROWS_AS(StaticTable::build(t.data(), t.size(), 2), InputError, "negative token id -3 at index 2");
    for (int n : {0, 5, -1})
        CHECK_THROWS_AS(StaticTable::build(t.data(), 2, n), InputError, "ngram_size must be 1 to 4, got " + std::to_string(n));
    NgramCache c;
    CHECK_THROWS_AS(StaticTable::from_cache(c, 0), InputError, "ngram_size must be 1 to 4");
    Part& p = c.get_or_insert(Ngram::of2(1, 2));
    p.add(1, INT32_MAX);
    p.add(2, INT32_MAX);
    p.add(3, 2);  // sum 2^32
    CHECK_THROWS_AS(StaticTable::from_cache(c, 2), InputError, "beyond the 2^32-1");
}

TEST(open_a_saved_file) {
    test::TempDir dir;
    std::mt19937 rng(42);
    const Tokens t = test::random_stream(rng, 4000, 40);
    const StaticTable tab = StaticTable::build(t.data(), t.size(), 3);
    const std::string path = dir.file("t.ngst");
    tab.save(path);
    CHECK_EQ(dir.listing(), std::vector<std::string>{"t.ngst"});
    const StaticTable opened = StaticTable::open(path);
    CHECK(opened.mapped());
    CHECK_EQ(opened.name(), path);
    CHECK(image_of(opened) == image_of(tab));
    opened.verify();
    check_table_has_cache(opened, *cache_of(t, 3), 3);
    // A moved or copied table keeps its mapping alive.
    StaticTable copy = opened;
    StaticTable moved = std::move(copy);
    CHECK(image_of(moved) == image_of(tab));
}

TEST(open_errors) {
    test::TempDir dir;
    CHECK_THROWS_AS(StaticTable::open(dir.file("none.ngst")), FileNotFound, "none.ngst: no such file");
    CHECK_THROWS_AS(StaticTable::open(dir.path().string()), std::system_error, dir.path().string());
    std::ofstream(dir.file("empty.ngst"), std::ios::binary).close();
    CHECK_THROWS_AS(StaticTable::open(dir.file("empty.ngst")), FormatError, "empty file");
    NgramCache c;
    c.get_or_insert(Ngram::of2(1, 2)).add(3, 1);
    save_lookup_file(c, dir.file("short.bin"));  // 28 bytes: shorter than a header
    CHECK_THROWS_AS(StaticTable::open(dir.file("short.bin")), FormatError, "truncated: 28 bytes");
    c.get_or_insert(Ngram::of2(2, 3)).add(1, 1);
    c.get_or_insert(Ngram::of2(3, 1)).add(2, 1);
    save_lookup_file(c, dir.file("lookup.bin"));
    CHECK_THROWS_AS(StaticTable::open(dir.file("lookup.bin")), FormatError,
                    "bad magic 0x03000000 (expected \"NGST\"; a llama.cpp lookup.bin is imported with from_llama)");  // the record of (3 1) comes first, as in llama.cpp
}

// A table whose three sections are all non-empty, and one with record padding (n = 3).
static Image sample_image(int n) {
    const Tokens t = {1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2, 4, 4, 2, 3, 9, 9, 9, 1, 2, 3, 5, 5};
    return image_of(StaticTable::build(t.data(), t.size(), n));
}

TEST(verify_rejects_every_single_byte_flip) {
    for (int n : {2, 3}) {
        const Image good = sample_image(n);
        const StaticTable ref = table_of(good);
        ref.verify();
        const ngst::Layout L = ref.layout();
        CHECK(L.entries_size > 0);
        int header_rejects = 0;
        for (size_t i = 0; i < good.size(); ++i)
            for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
                Image bad = good;
                bad[i] ^= mask;
                check::note() = "n " + std::to_string(n) + " byte " + std::to_string(i) + " mask " + std::to_string(mask);
                if (i < ngst::kHeaderSize) {
                    CHECK_THROWS_AS(table_of(bad), FormatError, "t.ngst: not a valid static table (NGST): ");
                    ++header_rejects;
                    continue;
                }
                const StaticTable t = table_of(bad);  // the header is intact: opens
                const char* section = i < L.records_off ? "index" : i < L.entries_off ? "records" : "entries";
                CHECK_THROWS_AS(t.verify(), FormatError, std::string("checksum mismatch in the ") + section);
                // Lookups on the damaged table stay inside the image (ASan checks).
                for (token_t a = 0; a < 10; ++a)
                    for (token_t b = 0; b < 10; ++b) {
                        const token_t k[4] = {a, b, a, b};
                        if (const StaticTable::Ref r = t.find(k)) {
                            (void)t.count(r, 3);
                            t.for_each_entry(r, [](token_t, int64_t) {});
                        }
                    }
                (void)t.to_lookup();
            }
        CHECK_EQ(header_rejects, 128);
    }
}

// Sets a header field, then the header check, so that decode gets past the check.
static void patch_header(Image& img, size_t off, const std::vector<uint8_t>& bytes) {
    std::memcpy(img.data() + off, bytes.data(), bytes.size());
    ngst::put32(img.data() + 36, ngst::header_check(img.data()));
}

TEST(decode_header_rejects_bad_headers) {
    const Image good = sample_image(2);
    auto rejects = [](const Image& img, const std::string& why) {
        CHECK_THROWS_AS(ngst::decode_header(img.data(), img.size(), "h.ngst"), FormatError, why);
        CHECK_THROWS_AS(StaticTable::from_image(img.data(), img.size(), "h.ngst"), FormatError,
                        "h.ngst: not a valid static table (NGST): ");
        CHECK_THROWS_AS(StaticTable::from_image(img.data(), img.size(), "h.ngst"), FormatError, why);
    };
    ngst::decode_header(good.data(), good.size(), "h.ngst");
    rejects(Image(), "empty file");
    rejects(Image(good.begin(), good.begin() + 10), "truncated: 10 bytes, the header alone needs 64");
    rejects(Image(good.begin(), good.begin() + 63), "truncated: 63 bytes");
    Image b = good;
    b[3] = 'X';
    rejects(b, "bad magic 0x4e475358");
    b = good;
    b[4] = 2;
    rejects(b, "unsupported format version 2 (this build reads version 1)");
    b = good;
    b[6] = 0xfe;
    b[7] = 0xff;
    rejects(b, "big-endian file");
    b = good;
    b[6] = 0;
    b[7] = 0;
    rejects(b, "bad byte-order mark 0x0000");
    b = good;
    b[20] ^= 1;
    rejects(b, "header check mismatch");
    b = good;
    b.resize(good.size() - 64);
    rejects(b, "truncated: " + std::to_string(b.size()) + " bytes, the header describes " + std::to_string(good.size()));
    b = good;
    b.resize(good.size() + 64, 0);
    rejects(b, "(trailing data)");
    b = good;
    b.resize(good.size() + 1, 0);
    rejects(b, "(trailing data)");
    b = good;
    patch_header(b, 8, {5});
    rejects(b, "n-gram size 5 (must be 1 to 4)");
    b = good;
    patch_header(b, 8, {0});
    rejects(b, "n-gram size 0");
    b = good;
    patch_header(b, 10, {3});
    rejects(b, "unknown source code 3");
    b = good;
    patch_header(b, 11, {1});
    rejects(b, "reserved byte 11 is 1");
    b = good;
    patch_header(b, 9, {uint8_t(b[9] + 1)});
    rejects(b, "bucket bits");
    b = good;
    patch_header(b, 32, {0xff, 0, 0, 0});  // stored entries beyond n_entries
    rejects(b, "are inconsistent");
    b = good;
    patch_header(b, 24, {1, 0, 0, 0, 0, 0, 0, 0});
    rejects(b, "total count 1 below the pair count");
}

TEST(verify_checks_structure_behind_good_checksums) {
    const Image good = sample_image(3);
    const StaticTable ref = table_of(good);
    const ngst::Layout L = ref.layout();
    auto rejects = [](Image img, const std::string& why) {
        ngst::rewrite_checksums(img.data(), img.size(), "s.ngst");
        const StaticTable t = StaticTable::from_image(img.data(), img.size(), "s.ngst");
        CHECK_THROWS_AS(t.verify(), FormatError, "s.ngst: static table failed verification: ");
        CHECK_THROWS_AS(t.verify(), FormatError, why);
    };
    // Record 0: find one with stored entries to damage them.
    uint64_t multi = 0;
    while (multi < ref.n_keys() && ref.stored(ref.record(multi)).second < 2) ++multi;
    CHECK(multi < ref.n_keys());
    const size_t rec = size_t(L.records_off + multi * L.stride);
    Image b = good;
    ngst::puti32(b.data() + rec + ngst::kRecBestTok, 1 << 20);
    rejects(b, "stored best token is not a most frequent entry");
    b = good;
    ngst::put32(b.data() + rec + ngst::kRecSum, 999);
    rejects(b, "stored sum differs from the entries");
    b = good;
    b[rec + ngst::kRecKey + 12] = 1;  // the padding after a 3-gram key
    rejects(b, "non-zero padding");
    b = good;
    CHECK(L.records_off + L.records_size < L.entries_off);
    b[L.records_off + L.records_size] = 1;  // the padding after the records section
    rejects(b, "non-zero padding after the records section");
    b = good;
    const size_t ent = size_t(L.entries_off + ngst::kEntrySize * ngst::load32(good.data() + rec + ngst::kRecBegin));
    Image e0(b.begin() + ent, b.begin() + ent + 8);
    std::memcpy(b.data() + ent, b.data() + ent + 8, 8);  // entries out of order
    std::memcpy(b.data() + ent + 8, e0.data(), 8);
    rejects(b, "entries not sorted");
    b = good;
    ngst::puti32(b.data() + rec + ngst::kRecKey, -4);
    rejects(b, "negative token in the key");
    b = good;
    ngst::put32(b.data() + L.index_off + 4 * L.n_buckets, uint32_t(ref.n_keys() - 1));
    rejects(b, "the bucket index does not span the records");
}

TEST(to_lookup_round_trips) {
    const std::vector<Tokens> all = streams();
    for (size_t si = 0; si < all.size(); ++si)
        for (int n = 1; n <= 4; ++n) {
            check::note() = "stream " + std::to_string(si) + " n " + std::to_string(n);
            const Tokens& t = all[si];
            const StaticTable tab = StaticTable::build(t.data(), t.size(), n);
            const std::vector<char> lk = tab.to_lookup();
            NgramCache c;
            load_lookup(c, lk.data(), lk.size(), "export.bin");
            CHECK_EQ(c.size(), size_t(tab.n_keys()));
            check_table_has_cache(tab, c, n, false);  // same counts, and llama.cpp's loader picks the same best
            const StaticTable back = StaticTable::from_lookup(lk.data(), lk.size(), "export.bin", n);
            CHECK_EQ(int(back.header().source), int(ngst::Source::lookup));
            const Image a = image_of(tab), b = image_of(back);
            CHECK_EQ(a.size(), b.size());
            CHECK(std::equal(a.begin() + 64, a.end(), b.begin() + 64));  // only the source differs
            if (tab.n_keys() > 0) {
                const StaticTable inferred = StaticTable::from_lookup(lk.data(), lk.size(), "export.bin", 0);
                CHECK(std::equal(a.begin() + 64, a.end(), image_of(inferred).begin() + 64));
            }
        }
}

TEST(from_lookup_sizes) {
    NgramCache c;
    const Tokens t = {1, 2, 3, 1, 2, 4};
    c.update(t.data(), t.size(), 1, 2, t.size());
    const std::vector<char> lk = serialize_lookup(c);
    CHECK_THROWS_AS(StaticTable::from_lookup(lk.data(), lk.size(), "mixed.bin", 0), InputError,
                    "mixed.bin: holds n-grams of sizes 1, 2");
    CHECK_EQ(StaticTable::from_lookup(lk.data(), lk.size(), "mixed.bin", 1).n_keys(), uint64_t(3));
    CHECK_EQ(StaticTable::from_lookup(lk.data(), lk.size(), "mixed.bin", 2).n_keys(), uint64_t(3));
    CHECK_EQ(StaticTable::from_lookup(lk.data(), lk.size(), "mixed.bin", 3).n_keys(), uint64_t(0));
    const StaticTable empty = StaticTable::from_lookup(nullptr, 0, "empty.bin", 0);
    CHECK_EQ(empty.ngram_size(), 2);
    CHECK_EQ(empty.n_keys(), uint64_t(0));
    const char bad[6] = {0};
    CHECK_THROWS_AS(StaticTable::from_lookup(bad, 6, "bad.bin", 0), FormatError, "bad.bin: not a valid lookup.bin");
    test::TempDir dir;
    save_lookup_file(c, dir.file("c.bin"));
    CHECK_EQ(StaticTable::from_lookup_file(dir.file("c.bin"), 2).n_keys(), uint64_t(3));
    CHECK_THROWS_AS(StaticTable::from_lookup_file(dir.file("none.bin"), 2), FileNotFound, "none.bin");
}

TEST(tables_used_for_drafting_agree_with_the_cache) {
    std::mt19937 rng(43);
    const Tokens corpus = test::random_stream(rng, 5000, 8);
    const auto owned = cache_of(corpus, 2);
    const NgramCache& c = *owned;
    const StaticTable tab = StaticTable::build(corpus.data(), corpus.size(), 2);
    const CacheAsStatic cs{&c};
    for (token_t a = 0; a < 9; ++a)
        for (token_t b = 0; b < 9; ++b) {
            const auto rc = cs.find2(a, b);
            const auto rt = tab.find2(a, b);
            CHECK_EQ(rc == nullptr, rt == nullptr);
            token_t x = -1, y = -1;
            CHECK_EQ(cs.best(rc, x), tab.best(rt, y));
            CHECK_EQ(x, y);
            if (rc != nullptr)
                for (token_t k = 0; k < 9; ++k) CHECK_EQ(cs.count(rc, k), tab.count(rt, k));
        }
}

CHECK_MAIN()
