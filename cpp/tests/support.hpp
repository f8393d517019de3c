// Helpers shared by the test files: random token streams, a slow reference cache written
// straight from llama.cpp's pseudo-code, comparisons, and a scratch folder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "check.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/ngram.hpp"
#include "ngramcache/replay.hpp"

namespace test {

using ngramcache::token_t;
using Tokens = std::vector<token_t>;
using Key = std::vector<token_t>;  // the n-gram's tokens, no padding
using RefPart = std::vector<std::pair<token_t, int64_t>>;  // first-seen order

inline Tokens random_stream(std::mt19937& rng, size_t n, token_t vocab) {
    std::uniform_int_distribution<token_t> d(0, vocab - 1);
    Tokens t(n);
    for (auto& x : t) x = d(rng);
    return t;
}

// One random phrase of `phrase_len` tokens repeated `repeats` times, each copy followed by
// `noise_len` random tokens: text a drafter that copies or looks up should mostly draft.
inline Tokens repeated_phrase(std::mt19937& rng, size_t phrase_len, int repeats, size_t noise_len, token_t vocab) {
    Tokens text;
    const Tokens phrase = random_stream(rng, phrase_len, vocab);
    for (int i = 0; i < repeats; ++i) {
        text.insert(text.end(), phrase.begin(), phrase.end());
        const Tokens noise = random_stream(rng, noise_len, vocab);
        text.insert(text.end(), noise.begin(), noise.end());
    }
    return text;
}

inline ngramcache::Ngram key_of(const Key& k) { return ngramcache::Ngram(k.data(), static_cast<int>(k.size())); }

// Replay options with the two sizes a test chooses; the rest at their defaults.
inline ngramcache::ReplayOptions replay_options(size_t n_ctx, size_t n_draft) {
    ngramcache::ReplayOptions o;
    o.n_ctx = n_ctx;
    o.n_draft = n_draft;
    return o;
}

#ifndef __GLIBCXX__
#error "the reference reads llama.cpp's tie order from real libstdc++ unordered_maps"
#endif

// A part as llama.cpp visits it: the pairs in the iteration order of a real
// std::unordered_map<int32_t, int32_t> that received them in first-seen order.
inline RefPart llama_visit(const RefPart& p) {
    std::unordered_map<token_t, int64_t> m;
    for (const auto& e : p) m.emplace(e.first, e.second);
    return RefPart(m.begin(), m.end());
}

// llama.cpp's common_ngram and its hash, for the order of a real outer map.
struct LlamaKey {
    token_t t[4];
    bool operator==(const LlamaKey& o) const { return std::equal(t, t + 4, o.t); }
};
struct LlamaKeyHash {
    size_t operator()(const LlamaKey& k) const {
        uint64_t h = 0;
        for (token_t x : k.t) h ^= uint64_t(int64_t(x)) * 0x9E3779B97F4A7C15ull;
        return h;
    }
};

// llama.cpp's cache semantics with ordered containers: keys in first-insertion order,
// parts in first-seen order; what llama.cpp's unordered_maps would visit comes from real
// ones built in those orders.
struct RefCache {
    std::map<Key, size_t> index;
    std::vector<Key> keys;
    std::vector<RefPart> parts;

    RefPart& part(const Key& k) {
        auto it = index.find(k);
        if (it != index.end()) return parts[it->second];
        index.emplace(k, keys.size());
        keys.push_back(k);
        parts.emplace_back();
        return parts.back();
    }
    const RefPart* find(const Key& k) const {
        auto it = index.find(k);
        return it == index.end() ? nullptr : &parts[it->second];
    }
    void add(const Key& k, token_t tok, int64_t cnt) {
        RefPart& p = part(k);
        for (auto& e : p)
            if (e.first == tok) {
                e.second += cnt;
                return;
            }
        p.emplace_back(tok, cnt);
    }
    // llama.cpp's update (docs/llama-lookup.md §2), literally.
    void update(const Tokens& inp, size_t len, int nmin, int nmax, size_t nnew) {
        for (int n = nmin; n <= nmax; ++n) {
            size_t i_start = len >= nnew ? len - nnew : 0;
            if (i_start < size_t(n)) i_start = n;
            for (size_t i = i_start; i < len; ++i) add(Key(inp.begin() + (i - n), inp.begin() + i), inp[i], 1);
        }
    }
    // Keys in the order a real outer map built in insertion order visits them.
    std::vector<size_t> llama_key_order() const {
        std::unordered_map<LlamaKey, size_t, LlamaKeyHash> m;
        for (size_t i = 0; i < keys.size(); ++i) {
            LlamaKey k{{-1, -1, -1, -1}};
            std::copy(keys[i].begin(), keys[i].end(), k.t);
            m.emplace(k, i);
        }
        std::vector<size_t> out;
        for (const auto& kv : m) out.push_back(kv.second);
        return out;
    }
    // What llama.cpp's load of llama.cpp's save of this cache holds: keys and pairs in the
    // orders real maps visit them, as the file lists them.
    RefCache as_loaded() const {
        RefCache out;
        for (size_t i : llama_key_order())
            for (const auto& e : llama_visit(parts[i])) out.add(keys[i], e.first, e.second);
        return out;
    }
    // common_ngram_cache_merge: `o` walked in its outer map's order; a new key copies the
    // part, an existing one receives the tokens in the order o's map of the part has them.
    void merge(const RefCache& o) {
        const bool self = &o == this;
        const std::vector<size_t> order = o.llama_key_order();
        const RefCache snapshot = self ? o : RefCache{};
        const RefCache& src = self ? snapshot : o;
        for (size_t i : order) {
            const bool is_new = find(src.keys[i]) == nullptr;
            for (const auto& e : is_new ? src.parts[i] : llama_visit(src.parts[i]))
                add(src.keys[i], e.first, e.second);
        }
    }
};

inline std::string show_key(const ngramcache::Ngram& k) {
    std::string s = "(";
    for (int i = 0; i < ngramcache::kNgramMax; ++i) s += (i ? " " : "") + std::to_string(k.t[i]);
    return s + ")";
}

// Same keys in the same order, same parts in the same order, running sum and max right.
inline void check_same(const ngramcache::NgramCache& c, const RefCache& r) {
    CHECK_EQ(c.size(), r.keys.size());
    for (size_t i = 0; i < r.keys.size(); ++i) {
        const ngramcache::Ngram k = key_of(r.keys[i]);
        CHECK(c.key_at(i) == k);
        const ngramcache::Part& p = c.part_at(i);
        CHECK(c.find(k) == &p);
        CHECK_EQ(p.size(), r.parts[i].size());
        int64_t sum = 0, mx = 0;
        for (size_t j = 0; j < r.parts[i].size(); ++j) {
            CHECK_EQ(p[uint32_t(j)].token, r.parts[i][j].first);
            CHECK_EQ(int64_t(p[uint32_t(j)].count), r.parts[i][j].second);
            CHECK_EQ(int64_t(p.count_of(r.parts[i][j].first)), r.parts[i][j].second);
            sum += r.parts[i][j].second;
            mx = std::max(mx, r.parts[i][j].second);
        }
        CHECK_EQ(p.sum(), sum);
        CHECK_EQ(int64_t(p.max_count()), mx);
    }
}

// The same keys, each with the same pairs in the same order; the key order may differ (a
// merge inserts keys in llama.cpp's outer-map order of the cache merged in).
inline void check_same_parts(const ngramcache::NgramCache& a, const ngramcache::NgramCache& b) {
    CHECK_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        const ngramcache::Part* q = b.find(a.key_at(i));
        check::note() = "key " + show_key(a.key_at(i));
        CHECK(q != nullptr);
        const ngramcache::Part& p = a.part_at(i);
        CHECK_EQ(p.size(), q->size());
        for (uint32_t j = 0; j < p.size(); ++j) {
            CHECK_EQ(p[j].token, (*q)[j].token);
            CHECK_EQ(p[j].count, (*q)[j].count);
        }
    }
}

// A fresh folder under the system's temporary folder, removed with everything in it.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "ngramcache-test-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::filesystem::path& path() const { return path_; }
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    std::vector<std::string> listing() const {
        std::vector<std::string> names;
        for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    }

private:
    std::filesystem::path path_;
};

}  // namespace test
