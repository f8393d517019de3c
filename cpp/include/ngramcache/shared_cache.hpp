// Caches shared between threads, and the operations that use several caches at once.
//
// A SharedCache is an NgramCache with the lock that makes sharing it safe: any number
// of readers (draft, lookups, save), writers (update, merge, clear, load) exclusive.
// Every operation that locks more than one cache goes through LockSet, which takes its
// locks in one global order (by address): no two operations can then wait for each
// other in opposite orders, whatever caches they are given. StaticTable needs no lock:
// nothing can change one.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "cache.hpp"
#include "draft.hpp"
#include "file_io.hpp"
#include "lookup_file.hpp"
#include "ngram.hpp"
#include "replay.hpp"
#include "static_table.hpp"

namespace ngramcache {

class SharedCache {
public:
    // f(const NgramCache&) under a shared lock; returns what f returns.
    template <class F>
    decltype(auto) read(F&& f) const {
        std::shared_lock<std::shared_mutex> lock(mutex_);
        return f(static_cast<const NgramCache&>(cache_));
    }
    // f(NgramCache&) under the exclusive lock.
    template <class F>
    decltype(auto) write(F&& f) {
        std::unique_lock<std::shared_mutex> lock(mutex_);
        return f(cache_);
    }
    // Installs a cache made without the lock (a load): writers wait only for the swap.
    void replace(NgramCache& fresh) {
        write([&](NgramCache& c) { c.swap(fresh); });
    }
    // The cache itself, for code that holds this cache's lock through a LockSet, or
    // that owns a SharedCache no other thread can see yet.
    NgramCache& unlocked() { return cache_; }
    const NgramCache& unlocked() const { return cache_; }

private:
    friend class LockSet;
    NgramCache cache_;
    mutable std::shared_mutex mutex_;
};

enum class Access { read, write };

// Locks up to three caches for the lifetime of the set: in address order, each cache
// once (asked for both ways, it is locked for writing); null entries are ignored.
class LockSet {
public:
    LockSet(std::initializer_list<std::pair<const SharedCache*, Access>> wanted) {
        for (const auto& w : wanted) add(w.first, w.second);
        // Insertion sort of at most three: the one lock order every operation follows.
        for (int i = 1; i < n_; ++i)
            for (int j = i; j > 0 && std::less<const void*>()(held_[j].cache, held_[j - 1].cache); --j)
                std::swap(held_[j], held_[j - 1]);
        try {
            for (; locked_ < n_; ++locked_) {
                const Held& h = held_[locked_];
                if (h.access == Access::write) h.cache->mutex_.lock();
                else h.cache->mutex_.lock_shared();
            }
        } catch (...) {
            release();
            throw;
        }
    }
    LockSet(const LockSet&) = delete;
    LockSet& operator=(const LockSet&) = delete;
    ~LockSet() { release(); }

private:
    static constexpr int kMax = 3;
    struct Held {
        const SharedCache* cache;
        Access access;
    };

    void add(const SharedCache* c, Access a) {
        if (c == nullptr) return;
        for (int i = 0; i < n_; ++i)
            if (held_[i].cache == c) {
                if (a == Access::write) held_[i].access = a;
                return;
            }
        if (n_ == kMax) throw std::logic_error("LockSet holds at most three caches");
        held_[n_++] = Held{c, a};
    }

    void release() noexcept {
        while (locked_ > 0) {
            const Held& h = held_[--locked_];
            if (h.access == Access::write) h.cache->mutex_.unlock();
            else h.cache->mutex_.unlock_shared();
        }
    }

    Held held_[kMax] = {};
    int n_ = 0;
    int locked_ = 0;
};

// What drafting and replay use as the static cache: nothing, an NgramCache (what
// llama.cpp does with a loaded lookup.bin) or a static table of 2-grams.
struct StaticSource {
    const SharedCache* cache = nullptr;
    const StaticTable* table = nullptr;
};

// Calls f with the Static interface of draft.hpp for `s`. A cache must be locked by the
// caller for as long as f runs.
template <class F>
decltype(auto) with_static(const StaticSource& s, F&& f) {
    if (s.table != nullptr) {
        if (s.table->ngram_size() != kNgramStatic)
            throw InputError("static: drafting needs a table of 2-grams (llama.cpp's LLAMA_NGRAM_STATIC), this one holds " +
                             std::to_string(s.table->ngram_size()) + "-grams");
        return f(*s.table);
    }
    if (s.cache != nullptr) return f(CacheAsStatic{&s.cache->unlocked()});
    return f(NoStatic{});
}

// draft() with every cache it reads locked for reading.
inline size_t draft_shared(const token_t* inp, size_t n_inp, size_t n_draft, int ngram_min, int ngram_max,
                           const SharedCache& context, const SharedCache* dynamic, const StaticSource& st,
                           token_t* out) {
    const LockSet locks{{&context, Access::read}, {dynamic, Access::read}, {st.cache, Access::read}};
    const NgramCache* dyn = dynamic != nullptr ? &dynamic->unlocked() : nullptr;
    return with_static(st, [&](const auto& s) {
        return draft(inp, n_inp, n_draft, ngram_min, ngram_max, context.unlocked(), dyn, s, out);
    });
}

// The entries that followed `key` in first-seen order (none when the key is absent).
inline std::vector<Entry> entries_of(const SharedCache& s, const Ngram& key) {
    return s.read([&](const NgramCache& c) {
        const Part* part = c.find(key);
        return part != nullptr ? std::vector<Entry>(part->begin(), part->end()) : std::vector<Entry>();
    });
}

// The cache as flat arrays (NgramCache::export_arrays), copied under the read lock:
// keys[i * kNgramMax ...] (padded), the entries of key i at [offsets[i], offsets[i + 1]).
struct CacheArrays {
    std::vector<int32_t> keys;
    std::vector<int64_t> offsets;
    std::vector<int32_t> tokens, counts;
};

inline CacheArrays export_shared(const SharedCache& s) {
    CacheArrays a;
    s.read([&](const NgramCache& c) {
        a.keys.resize(c.size() * kNgramMax);
        a.offsets.resize(c.size() + 1);
        a.tokens.resize(c.n_entries());
        a.counts.resize(c.n_entries());
        c.export_arrays(a.keys.data(), a.offsets.data(), a.tokens.data(), a.counts.data());
    });
    return a;
}

// The cache saved as llama.cpp's lookup.bin, atomically: the image is made under the read
// lock and written once it is released, so writers wait for the image only, not the disk.
inline void save_shared(const SharedCache& s, const std::string& path) {
    const std::vector<char> img = s.read(serialize_lookup);
    write_file_atomic(path, img.data(), img.size());
}

// A static table of the cache's n-grams of one size (StaticTable::from_cache), read locked.
inline StaticTable table_from_shared(const SharedCache& s, int ngram_size) {
    return s.read([&](const NgramCache& c) { return StaticTable::from_cache(c, ngram_size); });
}

// dst += src (llama.cpp's common_ngram_cache_merge); src may be dst, which doubles it.
inline void merge_shared(SharedCache& dst, const SharedCache& src) {
    const LockSet locks{{&dst, Access::write}, {&src, Access::read}};
    dst.unlocked().merge(src.unlocked());
}

// replay() against caches other threads may use. With update_dynamic the chunks are
// merged into `dynamic` itself, locked for writing throughout; otherwise into a private
// copy, and `dynamic` is locked only while it is copied. The static cache, if it is a
// cache, stays locked for reading while the replay reads it.
inline ReplayResult replay_shared(const token_t* inp, size_t n_input, const ReplayOptions& opt,
                                  const StaticSource& st, SharedCache* dynamic, bool update_dynamic,
                                  const ReplayProgress& progress = nullptr) {
    if (update_dynamic) {
        if (dynamic == nullptr) throw InputError("update_dynamic=True needs a dynamic cache");
        if (st.cache == dynamic) throw InputError("the dynamic cache to update cannot also be the static cache");
        const LockSet locks{{dynamic, Access::write}, {st.cache, Access::read}};
        return with_static(st, [&](const auto& s) { return replay(inp, n_input, opt, dynamic->unlocked(), s, progress); });
    }
    // A private copy, thrown away after the replay: the order of its keys does not matter.
    ReplayOptions private_opt = opt;
    private_opt.dynamic_key_order = false;
    NgramCache copy;
    if (dynamic != nullptr) {
        const LockSet locks{{dynamic, Access::read}};
        copy.merge(dynamic->unlocked(), false);  // into an empty cache: every part copied as it is
    }
    const LockSet locks{{st.cache, Access::read}};
    return with_static(st, [&](const auto& s) { return replay(inp, n_input, private_opt, copy, s, progress); });
}

}  // namespace ngramcache
