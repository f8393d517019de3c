// The iteration order of libstdc++'s std::unordered_map, reproduced from the insertion
// sequence (docs/parity.md). llama.cpp keeps every n-gram cache part in an
// unordered_map<int32_t, int32_t> and lets that order break ties when drafting, so
// matching its drafts exactly means knowing, for a part, which of two tied tokens its
// map would visit first. The order is a deterministic function of the keys' hash codes
// in insertion order:
// - all nodes sit in one singly linked list, and iteration walks it;
// - bucket = hash code mod bucket count;
// - a node whose bucket is empty goes to the front of the list, otherwise to the front of
//   its bucket's run of nodes;
// - the bucket count follows _Prime_rehash_policy (max load factor 1): 13 at the first
//   insertion, then, when one more node would exceed the count, the first prime of
//   libstdc++'s table that is at least twice the count; a rehash walks the old list in
//   order and reinserts every node by the rule above;
// - copying a map keeps its bucket count and its list, and so does clear() (the buckets).
// Counts never matter, only which keys were inserted in which order. Token hash codes
// are std::hash<int32_t>: the value itself, sign-extended to 64 bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ngramcache::libstdcxx {

// The bucket counts a map passes through as it grows one insertion at a time.
constexpr uint64_t kBucketChain[] = {
    13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933,
    351061, 712697, 1447153, 2938679, 5967347, 12117689, 24607243, 49969847, 101473717,
    206062531, 418451333, 849749479, 1725587117, 3504151727ull, 8589934583ull};
constexpr size_t kChainLength = sizeof(kBucketChain) / sizeof(kBucketChain[0]);

// Index into kBucketChain of the bucket count of a map holding n >= 1 nodes that it
// received one insertion at a time (from empty, or into a copy of such a map).
inline size_t chain_index(uint64_t n) {
    size_t i = 0;
    while (i + 1 < kChainLength && n > kBucketChain[i]) ++i;
    return i;
}

// The bucket count of a map that held n nodes, grown one insertion at a time from a map
// with `start` buckets (0: default-constructed; a kBucketChain value: one that clear()
// emptied). clear() keeps it, so this is where the next growth starts from.
inline uint64_t buckets_after(uint64_t start, uint64_t n) {
    if (n <= start || n == 0) return start;
    size_t i = start == 0 ? 0 : chain_index(start) + 1;
    while (i + 1 < kChainLength && n > kBucketChain[i]) ++i;
    return kBucketChain[i];
}

inline uint64_t token_hash(int32_t token) {
    return static_cast<uint64_t>(static_cast<int64_t>(token));
}

// llama.cpp's common_ngram_hash_function: the XOR over the key's four slots (unused ones
// hold -1) of Fibonacci hashing of each token.
inline uint64_t llama_ngram_hash(const int32_t* slots) {
    uint64_t h = 0;
    for (int i = 0; i < 4; ++i) h ^= token_hash(slots[i]) * 0x9E3779B97F4A7C15ull;
    return h;
}

// The list of a map as nodes are inserted, for any hash codes. Nodes are numbered by
// insertion, 0, 1, 2, ...; order() lists them in iteration order.
class NodeList {
public:
    // A map built from empty; `start_buckets` > 0 models a map that clear() emptied
    // after it had grown to that bucket count (a member of kBucketChain).
    explicit NodeList(uint64_t start_buckets = 0) {
        if (start_buckets != 0) set_buckets(start_buckets);
    }

    void reserve(size_t n) {
        hash_.reserve(n);
        next_.reserve(n);
    }

    void insert(uint64_t hash_code) {
        const uint32_t node = static_cast<uint32_t>(hash_.size());
        if (hash_.size() + 1 > next_resize_) grow();
        hash_.push_back(hash_code);
        next_.push_back(kNone);
        link(node);
    }

    size_t size() const { return hash_.size(); }
    uint64_t bucket_count() const { return n_buckets_; }

    // Node numbers in iteration order.
    std::vector<uint32_t> order() const {
        std::vector<uint32_t> out;
        out.reserve(hash_.size());
        for (uint32_t p = head_; p != kNone; p = next_[p]) out.push_back(p);
        return out;
    }

private:
    static constexpr uint32_t kNone = 0xFFFFFFFFu;
    static constexpr uint32_t kBeforeBegin = 0xFFFFFFFEu;  // the list's head pointer
    static constexpr uint32_t kEmpty = 0xFFFFFFFDu;

    size_t bucket_of(uint32_t node) const { return static_cast<size_t>(hash_[node] % n_buckets_); }

    void set_buckets(uint64_t n) {
        n_buckets_ = n;
        next_resize_ = n;  // max load factor 1
        before_.assign(static_cast<size_t>(n), kEmpty);
    }

    uint32_t& next_of(uint32_t before) { return before == kBeforeBegin ? head_ : next_[before]; }

    // _M_insert_bucket_begin
    void link(uint32_t node) {
        const size_t b = bucket_of(node);
        if (before_[b] != kEmpty) {
            uint32_t& after = next_of(before_[b]);
            next_[node] = after;
            after = node;
            return;
        }
        next_[node] = head_;
        head_ = node;
        if (next_[node] != kNone) before_[bucket_of(next_[node])] = node;
        before_[b] = kBeforeBegin;
    }

    // _M_rehash_aux for unique keys: the old list, walked in order, relinked.
    void grow() {
        const size_t i = next_resize_ == 0 ? 0 : chain_index(n_buckets_) + 1;
        set_buckets(kBucketChain[i < kChainLength ? i : kChainLength - 1]);
        uint32_t p = head_;
        head_ = kNone;
        size_t begin_bucket = 0;
        while (p != kNone) {
            const uint32_t nx = next_[p];
            const size_t b = bucket_of(p);
            if (before_[b] == kEmpty) {
                next_[p] = head_;
                head_ = p;
                before_[b] = kBeforeBegin;
                if (next_[p] != kNone) before_[begin_bucket] = p;
                begin_bucket = b;
            } else {
                uint32_t& after = next_of(before_[b]);
                next_[p] = after;
                after = p;
            }
            p = nx;
        }
    }

    std::vector<uint64_t> hash_;
    std::vector<uint32_t> next_;
    std::vector<uint32_t> before_;  // per bucket: the node before its run, kBeforeBegin or kEmpty
    uint32_t head_ = kNone;
    uint64_t n_buckets_ = 1;   // a default-constructed map's single bucket
    uint64_t next_resize_ = 0; // 0: nothing allocated yet (the first insertion allocates 13)
};

// Calls visit(i) for the indices of `tokens` (distinct, inserted into an
// unordered_map<int32_t, V> in this order) in the map's iteration order, until visit
// returns true; returns that index, or n. Parts of up to 13 tokens (nearly all of them)
// have never been rehashed: the map visits the runs of its 13 buckets in the order they
// were first filled, newest first, and each run newest first. That needs no list and no
// allocation; larger parts replay the insertions into a NodeList.
template <class TokenAt, class Visit>
size_t visit_in_order(size_t n, TokenAt token_at, Visit visit) {
    constexpr size_t kFirstBuckets = 13;  // kBucketChain[0]: no rehash up to this many nodes
    if (n <= kFirstBuckets) {
        uint8_t bucket[kFirstBuckets];
        uint8_t filled[kFirstBuckets];  // buckets in the order they were first filled
        uint16_t seen = 0;
        size_t n_filled = 0;
        for (size_t i = 0; i < n; ++i) {
            bucket[i] = static_cast<uint8_t>(token_hash(token_at(i)) % kFirstBuckets);
            if (!(seen >> bucket[i] & 1u)) seen |= uint16_t(1u << bucket[i]), filled[n_filled++] = bucket[i];
        }
        for (size_t k = n_filled; k-- > 0;)
            for (size_t i = n; i-- > 0;)
                if (bucket[i] == filled[k] && visit(i)) return i;
        return n;
    }
    NodeList list;
    list.reserve(n);
    for (size_t i = 0; i < n; ++i) list.insert(token_hash(token_at(i)));
    for (uint32_t i : list.order())
        if (visit(i)) return i;
    return n;
}

// Iteration order (as indices into `tokens`) of an unordered_map<int32_t, V> into which
// `tokens` (distinct) were inserted in this order.
template <class TokenAt>
std::vector<uint32_t> part_order(size_t n, TokenAt token_at) {
    std::vector<uint32_t> out;
    out.reserve(n);
    visit_in_order(n, token_at, [&](size_t i) {
        out.push_back(static_cast<uint32_t>(i));
        return false;
    });
    return out;
}

// The first index in that iteration order for which `pick(i)` holds (n if none).
template <class TokenAt, class Pick>
size_t first_in_order(size_t n, TokenAt token_at, Pick pick) {
    return visit_in_order(n, token_at, pick);
}

// The iteration order of the same part after llama.cpp saved it to a lookup.bin and
// loaded it back: the file lists the pairs in the saved map's order, and loading inserts
// them in file order. This is the order a static cache has in llama-lookup and
// llama-lookup-stats.
template <class TokenAt>
std::vector<uint32_t> part_order_after_reload(size_t n, TokenAt token_at) {
    const std::vector<uint32_t> saved = part_order(n, token_at);
    std::vector<uint32_t> loaded = part_order(n, [&](size_t i) { return token_at(saved[i]); });
    for (uint32_t& x : loaded) x = saved[x];
    return loaded;
}

template <class TokenAt, class Pick>
size_t first_after_reload(size_t n, TokenAt token_at, Pick pick) {
    if (n <= 2) {  // two pairs swap on save and swap back on load: the older comes first
        for (size_t i = 0; i < n; ++i)
            if (pick(i)) return i;
        return n;
    }
    for (uint32_t i : part_order_after_reload(n, token_at))
        if (pick(i)) return i;
    return n;
}

// An insertion order for tokens[0..n) under which a map visits `first` before every
// token that `rival(i)` marks: the order a file must list them in for llama.cpp's loader
// to break their tie toward `first`. Rivals go first (those sharing first's bucket last
// among them), the rest after, `first` last. Without a rehash that is enough (a map
// visits the bucket filled most recently first, and a bucket's newest node first);
// rehashes reorder, so the result is checked and a few other arrangements tried. Returns
// indices into tokens; the fallback (no arrangement found) is that first order.
template <class TokenAt, class Rival>
std::vector<uint32_t> order_putting_first(size_t n, size_t first, TokenAt token_at, Rival rival) {
    const uint64_t buckets = n == 0 ? 1 : kBucketChain[chain_index(n)];
    const uint64_t b_first = n == 0 ? 0 : token_hash(token_at(first)) % buckets;
    std::vector<uint32_t> rivals_other, rivals_same, rest;
    for (size_t i = 0; i < n; ++i) {
        if (i == first) continue;
        if (!rival(i)) rest.push_back(static_cast<uint32_t>(i));
        else if (token_hash(token_at(i)) % buckets == b_first) rivals_same.push_back(static_cast<uint32_t>(i));
        else rivals_other.push_back(static_cast<uint32_t>(i));
    }
    auto arrange = [&](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                       const std::vector<uint32_t>& c) {
        std::vector<uint32_t> o(a);
        o.insert(o.end(), b.begin(), b.end());
        o.insert(o.end(), c.begin(), c.end());
        o.push_back(static_cast<uint32_t>(first));
        return o;
    };
    auto works = [&](const std::vector<uint32_t>& o) {
        const size_t i = first_in_order(o.size(), [&](size_t j) { return token_at(o[j]); },
                                        [&](size_t j) { return o[j] == first || rival(o[j]); });
        return i < o.size() && o[i] == first;
    };
    const std::vector<uint32_t> plan = arrange(rivals_other, rivals_same, rest);
    if (n <= 2 || works(plan)) return plan;
    std::vector<uint32_t> tries[] = {arrange(rest, rivals_other, rivals_same),
                                     arrange(rivals_same, rivals_other, rest),
                                     arrange(rest, rivals_same, rivals_other)};
    for (const auto& o : tries)
        if (works(o)) return o;
    // Rotations of the rivals, then of everything before `first`.
    std::vector<uint32_t> all(plan.begin(), plan.end() - 1);
    for (size_t r = 1; r < all.size(); ++r) {
        std::vector<uint32_t> o(all.begin() + r, all.end());
        o.insert(o.end(), all.begin(), all.begin() + r);
        o.push_back(static_cast<uint32_t>(first));
        if (works(o)) return o;
    }
    // Shuffles (deterministic), which find one for the rare parts the rules above miss.
    uint64_t state = 0x9E3779B97F4A7C15ull ^ n;
    for (int attempt = 0; attempt < 4096; ++attempt) {
        for (size_t i = all.size(); i > 1; --i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            std::swap(all[i - 1], all[(state >> 33) % i]);
        }
        std::vector<uint32_t> o(all);
        o.push_back(static_cast<uint32_t>(first));
        if (works(o)) return o;
    }
    return plan;
}

}  // namespace ngramcache::libstdcxx
