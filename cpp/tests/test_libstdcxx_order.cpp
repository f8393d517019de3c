// libstdcxx_order.hpp against real std::unordered_maps of this libstdc++: the iteration
// order of parts and of llama.cpp's outer map, after growth, collisions, copies, clear()
// and a save-and-load round trip; and the export order that steers a loader's tie.
#include <algorithm>
#include <climits>
#include <random>
#include <unordered_map>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/libstdcxx_order.hpp"

using namespace ngramcache;
using test::Tokens;

static Tokens distinct_tokens(std::mt19937& rng, size_t n, int kind) {
    std::vector<token_t> out;
    std::unordered_map<token_t, int> seen;
    std::uniform_int_distribution<int64_t> wide(INT32_MIN, INT32_MAX);
    while (out.size() < n) {
        token_t t;
        switch (kind % 4) {
            case 0: t = token_t(rng() % (4 * n + 1)); break;
            case 1: t = token_t(13 * (rng() % (8 * n + 1))); break;  // one bucket until a rehash
            case 2: t = token_t(wide(rng)); break;                   // negative ids too
            default: t = token_t(29 * (rng() % (8 * n + 1)) + 1); break;
        }
        if (seen.emplace(t, 0).second) out.push_back(t);
    }
    return out;
}

static std::vector<token_t> real_order(const Tokens& ins) {
    std::unordered_map<token_t, int32_t> m;
    for (token_t t : ins) m.emplace(t, 1);
    std::vector<token_t> out;
    for (const auto& kv : m) out.push_back(kv.first);
    return out;
}

static std::vector<token_t> model_order(const Tokens& ins) {
    std::vector<token_t> out;
    for (uint32_t i : libstdcxx::part_order(ins.size(), [&](size_t j) { return ins[j]; })) out.push_back(ins[i]);
    return out;
}

TEST(part_order_matches_a_real_map) {
    std::mt19937 rng(5);
    const size_t sizes[] = {1, 2, 3, 12, 13, 14, 15, 29, 30, 31, 59, 60, 128, 258, 700, 2400, 5200};
    for (size_t n : sizes)
        for (int kind = 0; kind < 4; ++kind) {
            check::note() = "n " + std::to_string(n) + " kind " + std::to_string(kind);
            const Tokens ins = distinct_tokens(rng, n, kind);
            CHECK_EQ(model_order(ins), real_order(ins));
        }
}

// Parts of up to 13 tokens take their order from their buckets, without the list: every
// size, many insertion orders, collisions in one bucket and negative ids.
TEST(small_part_order_matches_a_real_map) {
    std::mt19937 rng(11);
    for (size_t n = 1; n <= 14; ++n)
        for (int trial = 0; trial < 300; ++trial) {
            check::note() = "n " + std::to_string(n) + " trial " + std::to_string(trial);
            const Tokens ins = distinct_tokens(rng, n, trial);
            CHECK_EQ(model_order(ins), real_order(ins));
            const token_t want = real_order(ins).back();  // first_in_order stops where asked
            const size_t i = libstdcxx::first_in_order(ins.size(), [&](size_t j) { return ins[j]; },
                                                       [&](size_t j) { return ins[j] == want; });
            CHECK(i < ins.size() && ins[i] == want);
        }
}

TEST(bucket_chain_matches_a_real_map) {
    std::unordered_map<int32_t, int32_t> m;
    size_t buckets = m.bucket_count();
    for (int32_t i = 0; i < 200000; ++i) {
        m.emplace(i, 0);
        if (m.bucket_count() != buckets) {
            buckets = m.bucket_count();
            CHECK_EQ(uint64_t(buckets), libstdcxx::buckets_after(0, uint64_t(i) + 1));
        }
    }
    CHECK_EQ(uint64_t(buckets), libstdcxx::kBucketChain[libstdcxx::chain_index(200000)]);
}

TEST(clear_keeps_the_buckets_as_a_real_map) {
    std::mt19937 rng(6);
    for (size_t first : {size_t(5), size_t(20), size_t(300), size_t(3000)})
        for (size_t then : {size_t(3), size_t(40), size_t(1500), size_t(7000)}) {
            check::note() = std::to_string(first) + " then " + std::to_string(then);
            const Tokens a = distinct_tokens(rng, first, int(then % 3)), b = distinct_tokens(rng, then, int(first % 4));
            std::unordered_map<token_t, int32_t> m;
            for (token_t t : a) m.emplace(t, 1);
            m.clear();
            for (token_t t : b) m.emplace(t, 1);
            std::vector<token_t> want;
            for (const auto& kv : m) want.push_back(kv.first);
            libstdcxx::NodeList list(libstdcxx::buckets_after(0, first));
            for (token_t t : b) list.insert(libstdcxx::token_hash(t));
            std::vector<token_t> got;
            for (uint32_t i : list.order()) got.push_back(b[i]);
            CHECK_EQ(got, want);
        }
}

TEST(outer_map_order_matches_a_real_map) {
    std::mt19937 rng(7);
    for (size_t n : {size_t(1), size_t(14), size_t(500), size_t(9000)}) {
        std::unordered_map<test::LlamaKey, size_t, test::LlamaKeyHash> m;
        std::vector<test::LlamaKey> keys;
        while (keys.size() < n) {
            test::LlamaKey k{{-1, -1, -1, -1}};
            const int len = 1 + int(rng() % 4);
            for (int j = 0; j < len; ++j) k.t[j] = token_t(rng() % 50);
            if (m.emplace(k, keys.size()).second) keys.push_back(k);
        }
        std::vector<size_t> want;
        for (const auto& kv : m) want.push_back(kv.second);
        libstdcxx::NodeList list;
        for (const auto& k : keys) list.insert(libstdcxx::llama_ngram_hash(k.t));
        std::vector<size_t> got;
        for (uint32_t i : list.order()) got.push_back(i);
        CHECK_EQ(got, want);
    }
}

// What llama.cpp's load sees after its save: a map filled in the saved map's order.
TEST(order_after_save_and_load_matches_real_maps) {
    std::mt19937 rng(8);
    for (size_t n : {size_t(2), size_t(3), size_t(13), size_t(14), size_t(100), size_t(1000)})
        for (int kind = 0; kind < 4; ++kind) {
            const Tokens ins = distinct_tokens(rng, n, kind);
            const std::vector<token_t> loaded = real_order(real_order(ins));
            std::vector<token_t> got;
            for (uint32_t i : libstdcxx::part_order_after_reload(ins.size(), [&](size_t j) { return ins[j]; }))
                got.push_back(ins[i]);
            CHECK_EQ(got, loaded);
            for (size_t pick = 0; pick < n; pick += 1 + n / 5) {  // first_after_reload agrees
                const size_t i = libstdcxx::first_after_reload(
                    n, [&](size_t j) { return ins[j]; }, [&](size_t j) { return j >= pick; });
                token_t want = 0;
                for (token_t t : loaded)
                    if (std::find(ins.begin() + pick, ins.end(), t) != ins.end()) { want = t; break; }
                CHECK_EQ(ins[i], want);
            }
        }
}

TEST(export_order_steers_a_real_loaders_tie) {
    std::mt19937 rng(9);
    int steered = 0;
    for (int round = 0; round < 400; ++round) {
        const size_t n = 2 + rng() % (round < 200 ? 14 : 120);
        const Tokens toks = distinct_tokens(rng, n, round);
        std::vector<bool> rival(n);
        for (size_t i = 0; i < n; ++i) rival[i] = rng() % 3 == 0;
        const size_t first = rng() % n;
        const std::vector<uint32_t> order = libstdcxx::order_putting_first(
            n, first, [&](size_t i) { return toks[i]; }, [&](size_t i) { return bool(rival[i]); });
        CHECK_EQ(order.size(), n);
        Tokens file;
        for (uint32_t i : order) file.push_back(toks[i]);
        // The loader's map: `first` comes before every rival.
        for (token_t t : real_order(file)) {
            const size_t i = size_t(std::find(toks.begin(), toks.end(), t) - toks.begin());
            if (i == first) { ++steered; break; }
            check::note() = "round " + std::to_string(round);
            CHECK(!rival[i]);
        }
    }
    CHECK_EQ(steered, 400);
}

CHECK_MAIN()
