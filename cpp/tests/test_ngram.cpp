// Keys (llama.cpp's common_ngram layout) and the hashes whose values are part of the
// NGST file format or of the cache's behaviour.
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "check.hpp"
#include "ngramcache/ngram.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;

static uint64_t h(std::vector<token_t> v) { return hash_ngram(Ngram(v.data(), static_cast<int>(v.size()))); }
static uint64_t kh(std::vector<token_t> v) { return ngst::key_hash(v.data(), static_cast<int>(v.size())); }

TEST(key_layout_is_four_int32_padded_with_minus_one) {
    static_assert(sizeof(Ngram) == 16, "16 bytes, no padding");
    const token_t two[2] = {15043, 3186};
    const Ngram k(two, 2);
    int32_t raw[4];
    std::memcpy(raw, &k, sizeof raw);
    CHECK_EQ(raw[0], 15043);
    CHECK_EQ(raw[1], 3186);
    CHECK_EQ(raw[2], -1);
    CHECK_EQ(raw[3], -1);
    const Ngram empty;
    for (int i = 0; i < kNgramMax; ++i) CHECK_EQ(empty.t[i], kTokenNull);
    CHECK(Ngram::of2(15043, 3186) == k);
}

TEST(size_counts_the_tokens_before_the_padding) {
    const token_t t[4] = {0, 5, 9, 2};
    for (int n = 0; n <= 4; ++n) CHECK_EQ(Ngram(t, n).size(), n);
    CHECK_EQ(Ngram().size(), 0);
}

TEST(keys_of_different_sizes_differ) {
    const token_t t[4] = {3, 3, 3, 3};
    std::set<uint64_t> hashes;
    for (int a = 1; a <= 4; ++a) {
        hashes.insert(hash_ngram(Ngram(t, a)));
        for (int b = 1; b <= 4; ++b) CHECK_EQ(Ngram(t, a) == Ngram(t, b), a == b);
    }
    CHECK_EQ(hashes.size(), size_t(4));
}

TEST(order_is_lexicographic_over_signed_slots) {
    const token_t a[2] = {1, 2}, b[2] = {1, 3}, c[1] = {1};
    CHECK(Ngram(a, 2) < Ngram(b, 2));
    CHECK(!(Ngram(b, 2) < Ngram(a, 2)));
    CHECK(!(Ngram(a, 2) < Ngram(a, 2)));
    CHECK(Ngram(c, 1) < Ngram(a, 2));  // the -1 padding sorts first
    CHECK(Ngram(a, 2) != Ngram(b, 2));
}

TEST(hash_is_order_sensitive) {
    CHECK(h({1, 2}) != h({2, 1}));
    CHECK(h({1, 2, 3}) != h({3, 2, 1}));
    CHECK(h({1, 2, 3, 4}) != h({2, 1, 3, 4}));
    CHECK(h({1, 2, 3, 4}) != h({1, 2, 4, 3}));
    CHECK(kh({1, 2}) != kh({2, 1}));
    CHECK(kh({1, 2, 3, 4}) != kh({1, 2, 4, 3}));
    // llama.cpp's XOR hash collides exactly here: a 2-gram and its reverse.
    std::mt19937 rng(7);
    std::uniform_int_distribution<token_t> d(0, 49151);
    std::set<uint64_t> seen;
    for (int i = 0; i < 2000; ++i) {
        const token_t a = d(rng), b = d(rng);
        if (a == b) continue;
        CHECK(h({a, b}) != h({b, a}));
        seen.insert(h({a, b}) >> 32);  // the fingerprint half the cache compares
    }
    CHECK(seen.size() > 1990);
}

TEST(hash_ngram_values_are_pinned) {
    CHECK_EQ(h({}), 0xef83e36c33d7e147ull);
    CHECK_EQ(h({0}), 0x6b13cf7d57a3c8c1ull);
    CHECK_EQ(h({1}), 0xee5efc1f976fa0edull);
    CHECK_EQ(h({1, 2}), 0x5d0c005a7ed3e245ull);
    CHECK_EQ(h({2, 1}), 0x7f376f330c9ab03dull);
    CHECK_EQ(h({15043, 3186}), 0x2da0ceccada21927ull);
    CHECK_EQ(h({1, 2, 3, 4}), 0x06157fe1c10a6f14ull);
}

TEST(fmix64_is_murmur3s_finaliser) {
    CHECK_EQ(fmix64(0), 0ull);
    // Reference values of MurmurHash3's fmix64.
    CHECK_EQ(fmix64(1), 0xb456bcfc34c2cb2cull);
    CHECK_EQ(fmix64(0xffffffffffffffffull), 0x64b5720b4b825f21ull);
}

TEST(ngst_key_hash_values_are_pinned) {
    CHECK_EQ(kh({7}), 0x714acef581142f5full);
    CHECK_EQ(kh({1, 2}), 0xa186c6fdae2f5d76ull);
    CHECK_EQ(kh({2, 1}), 0x153448159dfc9cafull);
    CHECK_EQ(kh({15043, 3186}), 0x1dcb3a1c341f0d41ull);
    CHECK_EQ(kh({1, 2, 3, 4}), 0x0ba98fb404dcfbe7ull);
}

TEST(ngst_checksum_values_are_pinned) {
    uint8_t b[64];
    for (int i = 0; i < 64; ++i) b[i] = static_cast<uint8_t>(i);
    CHECK_EQ(ngst::checksum(b, 0), 0xaa80f7466ca3941full);
    CHECK_EQ(ngst::checksum(b, 8), 0x558d55bfa0d95fd5ull);
    CHECK_EQ(ngst::checksum(b, 24), 0x36fb6da5bfe1e112ull);  // trailing words only
    CHECK_EQ(ngst::checksum(b, 32), 0xc2a10e3226a68027ull);
    CHECK_EQ(ngst::checksum(b, 64), 0xb99e87c2aa418611ull);
    const uint8_t z[64] = {0};
    CHECK_EQ(ngst::checksum(z, 64), 0x10411327d9adeb8aull);
}

TEST(ngst_checksum_detects_any_change_of_one_word) {
    std::mt19937_64 rng(11);
    uint8_t b[200];
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    const uint64_t base = ngst::checksum(b, 200);
    for (int i = 0; i < 200; ++i)
        for (int bit = 0; bit < 8; ++bit) {
            b[i] ^= uint8_t(1u << bit);
            CHECK(ngst::checksum(b, 200) != base);
            b[i] ^= uint8_t(1u << bit);
        }
    CHECK_EQ(ngst::checksum(b, 200), base);
    CHECK(ngst::checksum(b, 192) != base);  // the size is part of the sum
}

CHECK_MAIN()
