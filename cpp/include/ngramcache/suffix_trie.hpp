// The suffix drafter's trie (suffix.hpp proposes from it and keeps the store in it).
//
// The structure is a depth-bounded suffix trie with counts: every substring of length
// <= max_depth + 1 of the text is in it, with its number of occurrences. A suffix
// automaton would take O(n) memory instead of O(n * max_depth), but it cannot keep the
// per-node "best child" up to date in O(1) (a count change there touches every state
// with a transition into the changed one), its occurrence counts need a walk up the
// suffix-link chain that is unbounded on repetitive text, and it cannot forget a
// request: the store would have to be rebuilt on every eviction. The trie does all
// three in O(max_depth) per token at most with a flat hash table of edges (O(length of
// the longest repeat) where the text does not repeat), and a proposal of k tokens is k
// steps (best child, or the next token of the text below a leaf, plus a suffix link
// when the context reaches max_depth; below a leaf that link is found by walking down
// from the deepest node above, O(max_depth + k) lookups in all). A full trie
// would cost max_depth + 1 nodes a token; here a string seen once is a leaf that points
// into the text, so text that does not repeat costs one or two nodes a token, and text
// seen again up to max_depth + 1 (docs/drafters.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ngram.hpp"
#include "token_buffer.hpp"

namespace ngramcache {

constexpr size_t kSuffixMaxDepth = 1024;  // beyond this the trie's memory per token is absurd

// The trie over a list of texts (the store's requests, or a request's one sequence, which
// grows at the end). A string seen once is not a chain of nodes: the shortest prefix of
// it that occurs once is a leaf recording where its occurrence ends (text and offset),
// and the longer strings are read from that text. When a second occurrence reaches a
// leaf, the leaf becomes a node and the first occurrence's next token a new leaf below
// it, one level per token appended. A node's count, best child, stamp and suffix link
// are exactly those of the full trie; a leaf's count is 1, its stamp that of its
// occurrence, and its one continuation the text after that occurrence.
//
// A node's suffixes are nodes too: it had two occurrences when it stopped being a leaf,
// so its suffix had as many and was a node already, and nodes never become leaves again
// (a removal only ends them, and a suffix occurs at least as often). So an append or a
// removal follows nodes only, from the root: the longer suffixes ending at the token
// lie below leaves, occur only there and need no change. Texts are forgotten whole,
// oldest first, and with them every leaf into them (such a leaf's count falls to 0).
class SuffixTrie {
public:
    static constexpr uint32_t kLeaf = 0xfffffffeu;
    struct Node {
        uint32_t last = 0;        // stamp of the newest occurrence, relative to a base
        uint32_t count = 0;       // occurrences of this node's string
        uint32_t nsucc = 0;       // of those, followed by a token (= sum of the children's counts)
        uint32_t best = 0;        // the child with the highest count, newest among equals; kLeaf: a leaf
        uint32_t best_count = 0;  // its count and token, so that a step reads one node
        token_t best_tok = 0;
        uint32_t link = 0;   // the node of this string without its first token; a leaf: where its occurrence ends
        uint32_t first = 0;  // children, a singly linked list; a leaf: its request
        uint32_t next = 0;
        token_t tok = 0;     // the last token of this node's string
    };

    // A string in the trie: node g's (d == dg), or one below a leaf (d > dg): then it is
    // request rid's tokens [end - d, end), and g is the deepest node on its path.
    struct Pos {
        uint32_t g = 0, dg = 0, d = 0;
        uint32_t rid = 0, end = 0;
    };

    explicit SuffixTrie(size_t max_depth) : depth_(max_depth) { clear(); }

    size_t max_depth() const { return depth_; }
    size_t n_nodes() const { return nodes_.size() - 1 - free_.size(); }
    size_t n_texts() const { return texts_.size(); }
    const TokenBuffer& text_at(size_t i) const { return texts_[i]; }  // 0: the oldest
    size_t front_size() const { return texts_.front().size(); }
    const Node& node(uint32_t i) const { return nodes_[i]; }

    size_t memory_bytes() const {
        size_t b = nodes_.capacity() * sizeof(Node) + slots_.capacity() * sizeof(Slot) +
                   free_.capacity() * sizeof(uint32_t) + starts_.size() * sizeof(uint32_t);
        for (const auto& t : texts_) b += t.capacity() * sizeof(token_t) + sizeof(t);
        return b;
    }

    void clear() {
        nodes_.assign(1, Node{});
        free_.clear();
        slots_.assign(kMinSlots, Slot{});
        used_ = 0;
        texts_.clear();
        starts_.clear();
        act_.assign(depth_ + 1, 0);
        F_ = 0;
    }

    uint32_t child(uint32_t u, token_t c) const { return slots_[find_slot(u, c)].child; }

    // Whether the string at p was followed by a token (p.d <= max_depth).
    bool has_next(const Pos& p) const {
        if (p.d == p.dg) return nodes_[p.g].nsucc > 0;
        return p.end < text(p.rid).size();
    }

    // One step along the most frequent continuation of p (has_next(p)): its token, and
    // in q its share of the continuations.
    token_t best_step(Pos& p, double& q) const {
        if (p.d != p.dg) {
            q = 1.0;
            ++p.d;
            return text(p.rid)[p.end++];
        }
        const Node& un = nodes_[p.g];
        q = static_cast<double>(un.best_count) / static_cast<double>(un.nsucc);
        enter(p, un.best);
        return un.best_tok;
    }

    // p extended by token c, if that string occurs.
    bool advance(Pos& p, token_t c) const {
        if (p.d != p.dg) {
            const auto& t = text(p.rid);
            if (p.end >= t.size() || t[p.end] != c) return false;
            ++p.d;
            ++p.end;
            return true;
        }
        const uint32_t w = child(p.g, c);
        if (!w) return false;
        enter(p, w);
        return true;
    }

    // p without its first token (p.d >= 1). Below a leaf, the suffix's deepest node is
    // found from the suffix link of g downwards: g's depth falls by one a call and rises
    // by one a step, so this is O(1) amortised over a walk along the text.
    void shorten(Pos& p) const {
        const uint32_t target = p.d - 1;
        if (p.d == p.dg) {
            p.g = nodes_[p.g].link;
            p.d = p.dg = target;
            return;
        }
        uint32_t u = p.dg ? nodes_[p.g].link : 0, du = p.dg ? p.dg - 1 : 0;
        const token_t* t = text(p.rid).data() + (p.end - target);
        while (du < target) {
            const uint32_t w = child(u, t[du]);
            if (nodes_[w].best == kLeaf) break;
            u = w;
            ++du;
        }
        p.g = u;
        p.dg = du;
        p.d = target;
    }

    // Keep a request; its tokens get stamps stamp, stamp + 1, ... (one past on return).
    void add(const token_t* p, size_t n, uint32_t& stamp) {
        open(stamp);
        texts_.back().reserve(n);
        for (size_t j = 0; j < n; ++j) push(p[j]);
        stamp += static_cast<uint32_t>(n);
    }

    // Start a new text (the newest), whose first token will have stamp `stamp`.
    void open(uint32_t stamp) {
        texts_.emplace_back();
        starts_.push_back(stamp);
        act_.assign(depth_ + 1, 0);
        F_ = 0;
    }

    // Append a token to the newest text.
    void push(token_t c) {
        TokenBuffer& t = texts_.back();
        if (t.size() >= kLeaf) throw std::length_error("suffix trie: text too long");  // offsets are 32-bit
        const uint32_t rid = first_id_ + static_cast<uint32_t>(texts_.size() - 1);
        const uint32_t j = static_cast<uint32_t>(t.size());
        const uint32_t stamp = starts_.back() + j;
        t.push_back(c);
        uint32_t below = 0;
        size_t nf = 0;
        for (size_t i = 0; i <= F_; ++i) {
            const uint32_t u = act_[i];
            if ((used_ + 2) * 4 > slots_.size() * 3) grow();
            const size_t s = find_slot(u, c);
            uint32_t w = slots_[s].child;
            bool full = true;
            if (!w) {
                w = new_child(s, u, c);
                make_leaf(w, rid, j + 1);
                full = false;
            } else if (nodes_[w].best == kLeaf) {
                split(w, below, i + 1);
            }
            Node& wn = nodes_[w];
            ++wn.count;
            wn.last = stamp;
            Node& un = nodes_[u];
            ++un.nsucc;
            // the root's best child is never asked for; the newest wins a tie
            if (u != 0 && wn.count >= un.best_count) {
                un.best = w;
                un.best_count = wn.count;
                un.best_tok = c;
            }
            if (i > 0) act_[i] = below;
            below = w;
            if (full) nf = i + 1;
        }
        if (F_ < depth_) act_[F_ + 1] = below;
        F_ = std::min(nf, depth_);
    }

    // The newest text, and the longest of its suffixes that is a node (its depth and node).
    const TokenBuffer& newest() const { return texts_.back(); }
    size_t node_depth() const { return F_; }
    uint32_t suffix_node(size_t d) const { return act_[d]; }

    // Forget the oldest request: then the newest occurrence of every surviving node lies
    // in a surviving request and the stamps stay exact.
    void pop_front() {
        const TokenBuffer& t = texts_.front();
        std::vector<std::pair<uint32_t, uint32_t>> dead;  // (parent, node)
        std::vector<uint32_t> dirty;                      // nodes whose best child lost counts
        std::vector<uint32_t> act(depth_ + 1, 0);
        size_t F = 0;
        for (size_t j = 0; j < t.size(); ++j) {
            uint32_t below = 0;
            size_t nf = 0;
            for (size_t i = 0; i <= F; ++i) {
                const uint32_t u = act[i];
                const uint32_t w = child(u, t[j]);
                Node& wn = nodes_[w];
                const bool full = wn.best != kLeaf;  // a leaf on the way is this request's
                --wn.count;
                Node& un = nodes_[u];
                --un.nsucc;
                if (wn.count == 0) dead.emplace_back(u, w);
                if (u != 0 && un.best == w) {
                    un.best = kDirty;  // also keeps u from being listed twice
                    dirty.push_back(u);
                }
                if (i > 0) act[i] = below;
                below = w;
                if (full) nf = i + 1;
            }
            if (F < depth_) act[F + 1] = below;
            F = std::min(nf, depth_);
        }
        // Counts are exact only once the whole request is out, so nodes go only now. A
        // surviving parent drops its dead children in one pass (the root: once).
        std::vector<uint32_t> prune;
        for (const auto& [u, w] : dead) {
            erase_slot(find_slot(u, nodes_[w].tok));
            if (u == 0 || nodes_[u].count > 0) prune.push_back(u);
        }
        std::sort(prune.begin(), prune.end());
        prune.erase(std::unique(prune.begin(), prune.end()), prune.end());
        for (uint32_t u : prune) {
            uint32_t* at = &nodes_[u].first;
            while (*at) {
                if (nodes_[*at].count == 0)
                    *at = nodes_[*at].next;
                else
                    at = &nodes_[*at].next;
            }
        }
        for (const auto& dw : dead) free_.push_back(dw.second);
        for (uint32_t u : dirty) {
            Node& un = nodes_[u];
            un.best = 0;
            un.best_count = 0;
            if (un.count == 0) continue;  // removed itself
            for (uint32_t c = un.first; c; c = nodes_[c].next) {
                const Node& cn = nodes_[c];
                if (!un.best) {
                    un.best = c;
                    continue;
                }
                const Node& bn = nodes_[un.best];
                if (cn.count > bn.count || (cn.count == bn.count && cn.last > bn.last)) un.best = c;
            }
            if (un.best) {
                un.best_count = nodes_[un.best].count;
                un.best_tok = nodes_[un.best].tok;
            }
        }
        texts_.pop_front();
        starts_.pop_front();
        ++first_id_;
    }

    // Whether every node reachable from the root agrees with its children (counts, best
    // child, tie stamps) and every leaf points into a text held, at its own token; for
    // tests, O(nodes).
    bool consistent() const {
        std::vector<uint32_t> stack{0};
        size_t seen = 0;
        while (!stack.empty()) {
            const uint32_t u = stack.back();
            stack.pop_back();
            const Node& un = nodes_[u];
            if (u != 0 && un.count == 0) return false;
            if (un.best == kLeaf) {
                const uint32_t k = un.first - first_id_;
                if (k >= texts_.size() || un.link == 0 || un.link > texts_[k].size()) return false;
                if (texts_[k][un.link - 1] != un.tok || un.count != 1 || un.last != starts_[k] + un.link - 1)
                    return false;
                ++seen;
                continue;
            }
            uint64_t sum = 0;
            uint32_t best = 0;
            for (uint32_t c = un.first; c; c = nodes_[c].next) {
                const Node& cn = nodes_[c];
                if (child(u, cn.tok) != c) return false;
                sum += cn.count;
                if (!best || cn.count > nodes_[best].count ||
                    (cn.count == nodes_[best].count && cn.last > nodes_[best].last))
                    best = c;
                stack.push_back(c);
            }
            if (sum != un.nsucc) return false;
            if (u != 0 && (un.best != best || (best && (un.best_count != nodes_[best].count ||
                                                        un.best_tok != nodes_[best].tok))))
                return false;
            ++seen;
        }
        return seen == n_nodes() + 1;
    }

    // The oldest request's first stamp (every live stamp is at least that), or `none`.
    uint32_t oldest_stamp(uint32_t none) const { return starts_.empty() ? none : starts_.front(); }

    // Every stamp kept is at least `delta`: take it off them all.
    void rebase(uint32_t delta) {
        for (size_t i = 1; i < nodes_.size(); ++i)
            if (nodes_[i].count) nodes_[i].last -= delta;
        for (uint32_t& s : starts_) s -= delta;
    }

private:
    static constexpr uint32_t kDirty = 0xffffffffu;
    static constexpr size_t kMinSlots = 64;
    struct Slot {
        uint32_t parent = 0;
        token_t tok = 0;
        uint32_t child = 0;  // 0: empty (the root is nobody's child)
    };

    const TokenBuffer& text(uint32_t rid) const { return texts_[rid - first_id_]; }

    void enter(Pos& p, uint32_t w) const {
        const Node& wn = nodes_[w];
        if (wn.best == kLeaf) {
            p.rid = wn.first;
            p.end = wn.link;
            ++p.d;
        } else {
            p.g = w;
            p.dg = p.d = p.d + 1;
        }
    }

    // A leaf for the occurrence in text rid that ends at `end` (its count is the caller's).
    void make_leaf(uint32_t w, uint32_t rid, uint32_t end) {
        Node& wn = nodes_[w];
        wn.best = kLeaf;
        wn.first = rid;
        wn.link = end;
        wn.last = starts_[rid - first_id_] + end - 1;
    }

    // Leaf w at depth `depth` is reached a second time: it becomes a node (suffix link
    // `link`), and its occurrence's next token a leaf below it. The caller counts the
    // new occurrence.
    void split(uint32_t w, uint32_t link, size_t depth) {
        const uint32_t rid = nodes_[w].first, end = nodes_[w].link;
        // the first occurrence has no next token at the end of its text (not the newest:
        // there it is at the latest the token being added now), nor a child at depth
        // max_depth + 1
        if (depth > depth_ || end >= text(rid).size()) {
            nodes_[w].best = 0;
            nodes_[w].link = link;
            nodes_[w].first = 0;
            return;
        }
        const token_t c = text(rid)[end];
        Node& wn = nodes_[w];
        wn.best = 0;
        wn.best_count = 0;
        wn.nsucc = 0;
        wn.first = 0;
        wn.link = link;
        const uint32_t x = new_child(find_slot(w, c), w, c);
        make_leaf(x, rid, end + 1);
        Node& xn = nodes_[x];
        xn.count = 1;
        Node& wn2 = nodes_[w];
        wn2.nsucc = 1;
        wn2.best = x;
        wn2.best_count = 1;
        wn2.best_tok = c;
    }

    // A new node, child of u by token c, in the empty slot s.
    uint32_t new_child(size_t s, uint32_t u, token_t c) {
        uint32_t w;
        if (!free_.empty()) {
            w = free_.back();
            free_.pop_back();
            nodes_[w] = Node{};
        } else {
            if (nodes_.size() >= kLeaf) throw std::length_error("suffix trie: too many nodes");
            w = static_cast<uint32_t>(nodes_.size());
            nodes_.emplace_back();
        }
        Node& wn = nodes_[w];
        wn.tok = c;
        wn.next = nodes_[u].first;
        nodes_[u].first = w;
        slots_[s] = Slot{u, c, w};
        ++used_;
        return w;
    }

    size_t home(uint32_t u, token_t c) const {
        uint64_t k = (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(c);
        k ^= k >> 30;
        k *= 0xBF58476D1CE4E5B9ull;
        k ^= k >> 27;
        k *= 0x94D049BB133111EBull;
        k ^= k >> 31;
        return static_cast<size_t>(k) & (slots_.size() - 1);
    }

    size_t find_slot(uint32_t u, token_t c) const {
        const size_t mask = slots_.size() - 1;
        size_t i = home(u, c);
        while (slots_[i].child && !(slots_[i].parent == u && slots_[i].tok == c)) i = (i + 1) & mask;
        return i;
    }

    void grow() {
        std::vector<Slot> old(slots_.size() * 2);
        old.swap(slots_);
        const size_t mask = slots_.size() - 1;
        for (const Slot& s : old) {
            if (!s.child) continue;
            size_t i = home(s.parent, s.tok);
            while (slots_[i].child) i = (i + 1) & mask;
            slots_[i] = s;
        }
    }

    // Backward-shift deletion keeps linear probing free of tombstones.
    void erase_slot(size_t i) {
        const size_t mask = slots_.size() - 1;
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (!slots_[j].child) break;
            const size_t k = home(slots_[j].parent, slots_[j].tok);
            const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (stays) continue;
            slots_[i] = slots_[j];
            i = j;
        }
        slots_[i] = Slot{};
        --used_;
    }

    size_t depth_;
    std::vector<Node> nodes_;
    std::vector<uint32_t> free_;
    std::vector<Slot> slots_;
    size_t used_ = 0;
    std::deque<TokenBuffer> texts_;  // the requests held, oldest first
    std::deque<uint32_t> starts_;             // each one's first stamp
    uint32_t first_id_ = 0;                   // the oldest one's id (ids count up, modulo 2^32)
    std::vector<uint32_t> act_;               // the newest text's suffixes that are nodes:
    size_t F_ = 0;                            // act_[d] for d = 0..F_ (the deeper ones are below leaves)
};

}  // namespace ngramcache
