// An index of a growing token sequence by the runs of tokens in it, for drafters that copy
// earlier spans (copy_drafter.hpp, prompt_lookup.hpp).
//
// A flat open-addressing table of (hash, position). The key itself is never stored: it is
// the run of tokens at the position, read back from the sequence, so an entry costs 16
// bytes whatever the run's length, and the caller says through `same(position)` whether a
// slot holds the run it is probing for. Hashes only speed the search up; results never
// depend on them, collisions included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ngram.hpp"

namespace ngramcache {

// Order-sensitive hash of a run, built from its newest token backwards (a drafter knows
// where a run ends, and runs of several lengths ending at one place share the work).
class SpanHash {
public:
    void push_front(token_t t) {
        h_ = (h_ ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9E3779B97F4A7C15ull)) * 0xC2B2AE3D27D4EB4Full;
    }
    uint64_t value() const { return fmix64(h_); }

private:
    uint64_t h_ = 0x165667B19E3779F9ull;
};

// The hash of the n tokens ending at p[end].
inline uint64_t hash_span_ending(const token_t* p, size_t end, size_t n) {
    SpanHash h;
    for (size_t i = 0; i < n; ++i) h.push_front(p[end - i]);
    return h.value();
}

class SpanIndex {
public:
    static constexpr size_t npos = static_cast<size_t>(-1);

    SpanIndex() { clear(); }

    void clear() {
        slots_.assign(16, Slot{});
        size_ = 0;
    }
    size_t size() const { return size_; }

    // The position stored for the run with hash `h` (same(pos) true), or npos.
    template <class Same>
    size_t find(uint64_t h, Same&& same) const {
        const size_t mask = slots_.size() - 1;
        for (size_t s = h & mask;; s = (s + 1) & mask) {
            const Slot& sl = slots_[s];
            if (sl.pos == npos) return npos;
            if (sl.hash == h && same(sl.pos)) return sl.pos;
        }
    }

    // The stored position for the run, set to `pos` first if the run was absent
    // (`inserted` says which); the reference stays valid until the next insertion.
    template <class Same>
    size_t& find_or_insert(uint64_t h, size_t pos, Same&& same, bool& inserted) {
        if (4 * (size_ + 1) > 3 * slots_.size()) grow();
        const size_t mask = slots_.size() - 1;
        size_t s = h & mask;
        for (;; s = (s + 1) & mask) {
            Slot& sl = slots_[s];
            if (sl.pos == npos) break;
            if (sl.hash == h && same(sl.pos)) {
                inserted = false;
                return sl.pos;
            }
        }
        inserted = true;
        ++size_;
        slots_[s] = Slot{h, pos};
        return slots_[s].pos;
    }

    // f(position) for every entry, in no particular order.
    template <class F>
    void for_each(F&& f) const {
        for (const Slot& sl : slots_)
            if (sl.pos != npos) f(sl.pos);
    }

    size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

private:
    struct Slot {
        uint64_t hash = 0;
        size_t pos = npos;
    };

    void grow() {
        std::vector<Slot> old(2 * slots_.size(), Slot{});
        old.swap(slots_);
        const size_t mask = slots_.size() - 1;
        for (const Slot& sl : old) {
            if (sl.pos == npos) continue;
            size_t s = sl.hash & mask;
            while (slots_[s].pos != npos) s = (s + 1) & mask;
            slots_[s] = sl;
        }
    }

    std::vector<Slot> slots_;
    size_t size_ = 0;
};

}  // namespace ngramcache
