// Suffix drafting (SuffixDecoding, Oliaro et al. 2024): propose the most frequent
// continuation of the longest suffix match, from the current request and from a store
// of earlier requests.
//
// The structure is a depth-bounded suffix trie with counts (suffix_trie.hpp: why a trie and
// not a suffix automaton, and what it costs).
//
// Proposal rule, shared by the request's own trie and the store's:
//   * match: the longest suffix x of the sequence, |x| <= max_depth, that occurs
//     earlier followed by a token; m = |x| (0: no proposal);
//   * step: c = the most frequent token after x (equal counts: the one seen latest),
//     p = count(x c) / count(x followed by anything); the running product P *= p;
//     stop before a token with P < min_prob, when x has no successor, or after
//     min(n_max, floor(alpha * m)) tokens; x = the last max_depth tokens of x c.
// With a store both are proposed; the one with the longer match wins (evidence of a
// longer repeat), then the one with more expected accepted tokens (the sum of the P's),
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "ngram.hpp"
#include "suffix_trie.hpp"

namespace ngramcache {

// Earlier requests, for every drafter that shares the store. Readers (proposals) hold a
// shared lock for the O(k + max_depth) of a proposal; a writer (add, clear) holds the
// lock exclusively for O(max_depth) at most per token added or evicted. Whole requests are evicted,
// oldest first, to keep the tokens held within max_tokens.
class SuffixStore {
public:
    // Stamps are 32-bit, counted from the oldest request held: when they would pass
    // stamp_limit (below 2^32 only in tests), they are all moved down.
    // The options' defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr size_t max_tokens = 1000000;
        static constexpr size_t max_depth = 64;
    };

    explicit SuffixStore(size_t max_tokens = Defaults::max_tokens, size_t max_depth = Defaults::max_depth,
                         uint64_t stamp_limit = UINT32_MAX)
        : max_tokens_(max_tokens), stamp_limit_(std::min<uint64_t>(stamp_limit, UINT32_MAX)),
          trie_(check_depth(max_depth)) {
        if (max_tokens < 1) throw InputError("max_tokens must be >= 1, got 0");
    }

    // A request longer than max_tokens is not kept, and evicts nothing.
    void add(const token_t* p, size_t n) {
        if (n == 0 || n > max_tokens_) return;
        std::unique_lock<std::shared_mutex> lk(mu_);
        ++version_;  // first: node ids change even if this add throws
        while (trie_.n_texts() && n_tokens_ + n > max_tokens_) {
            n_tokens_ -= trie_.front_size();
            trie_.pop_front();
        }
        if (uint64_t(stamp_) + n > stamp_limit_) {
            const uint32_t delta = trie_.oldest_stamp(stamp_);
            trie_.rebase(delta);
            stamp_ -= delta;
            if (uint64_t(stamp_) + n > stamp_limit_) throw std::length_error("suffix store: too many tokens");
        }
        trie_.add(p, n, stamp_);
        n_tokens_ += n;
    }

    void clear() {
        std::unique_lock<std::shared_mutex> lk(mu_);
        trie_ = SuffixTrie(trie_.max_depth());  // gives the memory back (clear() keeps it)
        n_tokens_ = 0;
        stamp_ = 0;
        ++version_;
    }

    size_t max_tokens() const { return max_tokens_; }
    size_t max_depth() const { return trie_.max_depth(); }
    size_t n_tokens() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return n_tokens_;
    }
    size_t n_requests() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return trie_.n_texts();
    }
    size_t n_nodes() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return trie_.n_nodes();
    }
    // The requests held, oldest first (a copy taken under the lock: what saving needs).
    std::vector<std::vector<token_t>> requests() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        std::vector<std::vector<token_t>> out;
        out.reserve(trie_.n_texts());
        for (size_t i = 0; i < trie_.n_texts(); ++i) out.push_back(trie_.text_at(i).to_vector());
        return out;
    }
    bool consistent() const {  // for tests
        std::shared_lock<std::shared_mutex> lk(mu_);
        return trie_.consistent();
    }
    // Bytes allocated: the trie and the tokens held.
    size_t memory_bytes() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return trie_.memory_bytes();
    }

    static size_t check_depth(size_t d) {
        if (d < 1 || d > kSuffixMaxDepth)
            throw InputError("max_depth must be in 1.." + std::to_string(kSuffixMaxDepth) + ", got " +
                             std::to_string(d));
        return d;
    }

private:
    friend class SuffixDrafter;
    const size_t max_tokens_;
    const uint64_t stamp_limit_;
    mutable std::shared_mutex mu_;
    SuffixTrie trie_;
    size_t n_tokens_ = 0;
    uint32_t stamp_ = 0;  // the next token's
    uint64_t version_ = 1;  // changes with every add and clear; 0 is never current
};

// The sequence-protocol drafter (drafter_replay.hpp).
class SuffixDrafter {
public:
    // The options' defaults, which the binding's keywords take and _core.defaults() reports
    // (the package declares the same for its users; the tests compare the two).
    struct Defaults {
        static constexpr size_t max_depth = SuffixStore::Defaults::max_depth;
        static constexpr double alpha = 4.0;
        static constexpr double min_prob = 0.1;
    };

    SuffixDrafter(size_t max_depth = Defaults::max_depth, double alpha = Defaults::alpha,
                  double min_prob = Defaults::min_prob, std::shared_ptr<SuffixStore> store = nullptr)
        : depth_(SuffixStore::check_depth(max_depth)), alpha_(alpha), min_prob_(min_prob),
          store_(std::move(store)), trie_(depth_) {
        if (!(alpha > 0.0) || !std::isfinite(alpha))
            throw InputError("alpha must be a positive finite number, got " + std::to_string(alpha));
        if (!(min_prob >= 0.0 && min_prob <= 1.0))
            throw InputError("min_prob must be in [0, 1], got " + std::to_string(min_prob));
        store_depth_ = store_ ? std::min(depth_, store_->max_depth()) : 0;
        trie_.open(0);
    }

    // The request so far goes to the store (if any), and a new one starts.
    void reset(const token_t* prompt, size_t n) {
        finish();
        accept(prompt, n);
    }

    // Hand the request so far to the store and start an empty one.
    void finish() {
        if (store_ && !tokens().empty()) store_->add(tokens().data(), tokens().size());
        trie_.clear();
        trie_.open(0);
        match_ = 0;
        conf_ = 0;
        s_version_ = 0;
    }

    void accept(const token_t* t, size_t n) {
        for (size_t j = 0; j < n; ++j) {
            trie_.push(t[j]);
            // the match grows by at most one token per token; a suffix below a leaf
            // occurs only here, so the match is a node
            match_ = std::min(match_ + 1, trie_.node_depth());
            while (match_ > 0 && trie_.node(trie_.suffix_node(match_)).nsucc == 0) --match_;
        }
    }

    size_t propose(size_t n_max, token_t* out) {
        conf_ = 0;
        if (n_max == 0 || tokens().empty()) return 0;
        double score_a = 0;
        size_t n_a = 0;
        if (match_ > 0) {
            const uint32_t m = static_cast<uint32_t>(match_);
            n_a = walk(trie_, SuffixTrie::Pos{trie_.suffix_node(match_), m, m, 0, 0}, depth_, n_max, out, score_a);
        }
        size_t m_b = 0, n_b = 0;
        double score_b = 0;
        if (store_) {
            std::shared_lock<std::shared_mutex> lk(store_->mu_);
            const SuffixTrie& st = store_->trie_;
            sync_store(st);
            SuffixTrie::Pos v = s_pos_;
            while (v.d > 0 && !st.has_next(v)) st.shorten(v);
            m_b = v.d;
            if (v.d > 0) {
                buf_.resize(n_max);
                n_b = walk(st, v, store_depth_, n_max, buf_.data(), score_b);
            }
        }
        const bool take_b = n_b > 0 && (n_a == 0 || m_b > match_ || (m_b == match_ && score_b > score_a));
        if (take_b) {
            std::copy(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n_b), out);
            conf_ = static_cast<int>(m_b);
            return n_b;
        }
        conf_ = n_a ? static_cast<int>(match_) : 0;
        return n_a;
    }

    int confidence() const { return conf_; }
    size_t max_depth() const { return depth_; }
    double alpha() const { return alpha_; }
    double min_prob() const { return min_prob_; }
    size_t n_tokens() const { return tokens().size(); }
    // The request so far.
    const TokenBuffer& tokens() const { return trie_.newest(); }
    size_t n_nodes() const { return trie_.n_nodes(); }
    bool consistent() const { return trie_.consistent(); }  // for tests
    // Bytes allocated for the request (its trie and tokens), not the store's.
    size_t memory_bytes() const { return trie_.memory_bytes(); }
    const std::shared_ptr<SuffixStore>& store() const { return store_; }

private:

    // The proposal rule's steps from the match at pos, contexts of at most dmax tokens.
    size_t walk(const SuffixTrie& t, SuffixTrie::Pos pos, size_t dmax, size_t n_max, token_t* out,
                double& score) const {
        const double cap = alpha_ * static_cast<double>(pos.d);
        const size_t limit = cap >= static_cast<double>(n_max) ? n_max : static_cast<size_t>(cap);
        double p = 1.0;
        score = 0.0;
        size_t k = 0;
        while (k < limit) {
            if (!t.has_next(pos)) break;
            double q;
            const token_t c = t.best_step(pos, q);
            p *= q;
            if (p < min_prob_) break;
            out[k++] = c;
            score += p;
            if (pos.d > dmax) t.shorten(pos);
        }
        return k;
    }

    // Keep s_pos_ = the longest suffix of the sequence, up to store_depth_ tokens, that
    // occurs in the store. After the store changed, node ids and request ids may be stale:
    // start again from the last store_depth_ tokens (the same answer, by construction).
    void sync_store(const SuffixTrie& st) {
        if (s_version_ != store_->version_) {
            s_version_ = store_->version_;
            s_pos_ = SuffixTrie::Pos{};
            s_fed_ = tokens().size() > store_depth_ ? tokens().size() - store_depth_ : 0;
        }
        const TokenBuffer& q = tokens();
        for (; s_fed_ < q.size(); ++s_fed_) {
            const token_t c = q[s_fed_];
            for (;;) {
                if (st.advance(s_pos_, c)) {
                    if (s_pos_.d > store_depth_) st.shorten(s_pos_);
                    break;
                }
                if (s_pos_.d == 0) break;
                st.shorten(s_pos_);
            }
        }
    }

    size_t depth_;
    double alpha_, min_prob_;
    std::shared_ptr<SuffixStore> store_;
    size_t store_depth_ = 0;
    SuffixTrie trie_;  // the request's: its one text is the sequence
    size_t match_ = 0;
    int conf_ = 0;
    std::vector<token_t> buf_;
    uint64_t s_version_ = 0;
    SuffixTrie::Pos s_pos_;  // in the store: positions of an evicted request are never kept
    size_t s_fed_ = 0;
};

}  // namespace ngramcache
