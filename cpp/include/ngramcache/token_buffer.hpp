// TokenBuffer: a drafter's growing token sequence, whose storage readers may share.
//
// Like std::vector<token_t> for what the drafters do with their sequence (append, read,
// start again), with one difference: the storage is a reference-counted block that share()
// hands out, so that the Python layer reads a drafter's sequence in place (a numpy array
// over the block, holding a reference) without a copy, and without a lifetime to respect.
//
// The rule that makes such a view safe: the tokens of a shared block are never written
// again. Appending writes past the current size only, so a view of the first n tokens never
// sees a change. Growing moves the sequence to a new block and lets this one go (a view
// keeps the old block alive). Shrinking (truncate, clear, assign) would rewrite tokens a
// view may cover, so while the block is shared it moves the kept tokens to a new block
// instead. A block nobody else holds is reused in place, as a vector's storage is.
//
// Sharing is decided under the owner's exclusive use (the binding claims the drafter for
// share() as for any other call), so a block's count grows only while no write is running;
// a count that drops meanwhile (a view freed in another thread) costs at most a copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "ngram.hpp"

namespace ngramcache {

class TokenBuffer {
public:
    TokenBuffer() = default;
    // A copy owns its own block: two owners appending into one block would write the same
    // positions.
    TokenBuffer(const TokenBuffer& o) { append(o.data(), o.size()); }
    TokenBuffer& operator=(const TokenBuffer& o) {
        if (this != &o) assign(o.data(), o.size());
        return *this;
    }
    TokenBuffer(TokenBuffer&& o) noexcept
        : block_(std::move(o.block_)), size_(std::exchange(o.size_, 0)), cap_(std::exchange(o.cap_, 0)) {}
    TokenBuffer& operator=(TokenBuffer&& o) noexcept {
        block_ = std::move(o.block_);
        size_ = std::exchange(o.size_, 0);
        cap_ = std::exchange(o.cap_, 0);
        return *this;
    }

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    size_t capacity() const { return cap_; }
    const token_t* data() const { return block_.get(); }
    const token_t* begin() const { return block_.get(); }
    const token_t* end() const { return block_.get() + size_; }
    token_t operator[](size_t i) const { return block_[i]; }
    token_t back() const { return block_[size_ - 1]; }
    std::vector<token_t> to_vector() const { return std::vector<token_t>(begin(), end()); }

    void reserve(size_t n) {
        if (n > cap_) move_to_new_block(n);
    }
    void push_back(token_t t) {
        if (size_ == cap_) move_to_new_block(grown(size_ + 1));
        block_[size_++] = t;
    }
    void append(const token_t* p, size_t n) {
        if (n == 0) return;
        if (size_ + n > cap_) move_to_new_block(grown(size_ + n));
        std::memcpy(block_.get() + size_, p, n * sizeof(token_t));
        size_ += n;
    }
    // Keep the first n tokens (n <= size()).
    void truncate(size_t n) {
        if (n >= size_) return;
        if (block_.use_count() > 1) {
            size_ = n;
            move_to_new_block(cap_);
        } else {
            size_ = n;
        }
    }
    void clear() { truncate(0); }
    void assign(const token_t* p, size_t n) {
        clear();
        append(p, n);
    }

    // The block holding the tokens (empty before the first token): its first size() tokens
    // stay as they are for as long as the caller holds it.
    std::shared_ptr<const token_t[]> share() const { return block_; }

private:
    size_t grown(size_t need) const { return std::max({need, cap_ * 2, size_t{16}}); }

    // The first size_ tokens into a new block of cap tokens; the old one is let go (a
    // holder of share() keeps it).
    void move_to_new_block(size_t cap) {
        std::shared_ptr<token_t[]> fresh(new token_t[cap]);
        if (size_) std::memcpy(fresh.get(), block_.get(), size_ * sizeof(token_t));
        block_ = std::move(fresh);
        cap_ = cap;
    }

    std::shared_ptr<token_t[]> block_;
    size_t size_ = 0;
    size_t cap_ = 0;
};

inline bool operator==(const TokenBuffer& a, const std::vector<token_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace ngramcache
