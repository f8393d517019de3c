// Bench only (docs/benchmarks.md): NgramCache's part storage behind boost::unordered_flat_map
// instead of our own flat table, so that bench_table.cpp can compare the hash tables alone.
// Everything except the key -> part-index map is what cache.hpp does: parts in fixed-size
// segments (stable addresses), keys kept in insertion order (key_at, merge and save need
// that order), the same update loop. The package never includes this file and never
// depends on Boost.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include <boost/container_hash/hash.hpp>
#include <boost/unordered/unordered_flat_map.hpp>
#include <boost/version.hpp>

#include "ngramcache/cache.hpp"
#include "ngramcache/ngram.hpp"

namespace ngramcache_bench {

using ngramcache::Ngram;
using ngramcache::Part;
using ngramcache::token_t;

// Our key hash. It ends in murmur3's finaliser, so Boost may use it as is: declaring it
// avalanching skips Boost's extra multiply-xor mixing of the hash value.
struct OurHash {
    using is_avalanching = void;
    size_t operator()(const Ngram& k) const { return ngramcache::hash_ngram(k); }
};

// Boost's own hash of the four slots (what boost::hash<Ngram> gives with the usual
// hash_value overload). Not avalanching, so the table post-mixes it.
struct BoostHash {
    size_t operator()(const Ngram& k) const { return boost::hash_range(k.t, k.t + ngramcache::kNgramMax); }
};

template <class Hash>
class BoostCache {
public:
    using Map = boost::unordered_flat_map<Ngram, uint32_t, Hash>;

    size_t size() const { return keys_.size(); }
    const Ngram& key_at(size_t i) const { return keys_[i]; }
    const Part& part_at(size_t i) const { return part_ref(i); }

    const Part* find(const Ngram& k) const {
        const auto it = map_.find(k);
        return it == map_.end() ? nullptr : &part_ref(it->second);
    }

    Part& get_or_insert(const Ngram& k) {
        const uint32_t next = static_cast<uint32_t>(keys_.size());
        const auto [it, inserted] = map_.try_emplace(k, next);
        if (inserted) {
            if (next >= std::numeric_limits<uint32_t>::max() - 1)
                throw std::length_error("n-gram cache holds too many keys");
            if (next % kSegment == 0) segments_.emplace_back(new Part[kSegment]);
            keys_.push_back(k);
        }
        return part_ref(it->second);
    }

    // NgramCache::update, line for line.
    void update(const token_t* inp, size_t n_inp, int ngram_min, int ngram_max, size_t nnew) {
        ngramcache::NgramCache::check_sizes(ngram_min, ngram_max);
        if (nnew > n_inp) nnew = n_inp;
        for (int n = ngram_min; n <= ngram_max; ++n) {
            size_t i_start = n_inp - nnew;
            if (i_start < static_cast<size_t>(n)) i_start = n;
            for (size_t i = i_start; i < n_inp; ++i) get_or_insert(Ngram(inp + i - n, n)).add(inp[i], 1);
        }
    }

    // As NgramCache::memory_bytes; the map's slots plus its one metadata byte per slot
    // (Boost groups 15 slots with 16 bytes of metadata).
    size_t memory_bytes() const {
        size_t b = map_.bucket_count() * (sizeof(typename Map::value_type) + 1) +
                   keys_.capacity() * sizeof(Ngram) + segments_.size() * kSegment * sizeof(Part);
        for (size_t i = 0; i < keys_.size(); ++i) {
            const Part& p = part_ref(i);
            if (p.size() > 1) b += sizeof(ngramcache::Entry) * p.size();
        }
        return b;
    }

private:
    static constexpr size_t kSegment = 4096;  // as cache.hpp

    Part& part_ref(size_t i) { return segments_[i / kSegment][i % kSegment]; }
    const Part& part_ref(size_t i) const { return segments_[i / kSegment][i % kSegment]; }

    Map map_;
    std::vector<Ngram> keys_;
    std::vector<std::unique_ptr<Part[]>> segments_;
};

}  // namespace ngramcache_bench
