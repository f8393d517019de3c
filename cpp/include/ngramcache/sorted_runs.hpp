// Sorted runs of counts and their streaming k-way merge into one cache file.
//
// A run is the counts of one part of the work (one shard of a corpus, one input cache)
// as (key, next token) entries sorted by key, then token. Each entry also carries where
// the pair was first seen, which is all the order-dependent outputs need: an NGST best
// token breaks ties by first-seen order, and llama.cpp's lookup.bin lists keys and
// tokens in the order its hash maps visit them, which follows insertion order.
//
// `first` orders first sightings across runs: (run rank << 40) | position, where the
// position is a token index for a corpus shard, or a key's insertion rank for an input
// cache. A run made from a cache also gives each token two ranks inside its key: the
// part's own order (used when that cache brings the key into the merged cache: the part
// is copied as it is) and llama.cpp's visiting order of that part (used when the key is
// already there: common_ngram_cache_merge appends new tokens as it visits them).
//
// Run image: a 32-byte header ("NGRN", version, n-gram sizes bitmask, entry count,
// total count), then the entries, 40 bytes each, little-endian.
//
// Merging holds one block of entries per run, the entries of the key being merged, and
// per key 8 bytes (NGST: the hash and the entry count the layout needs, plus the image
// itself) or about 50 bytes (lookup.bin: first sighting, llama.cpp's hash, where its
// record was spooled, and the replay of llama.cpp's map that orders the records); never a
// whole run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <queue>
#include <string>
#include <system_error>
#include <vector>

#include "cache.hpp"
#include "draft.hpp"
#include "file_io.hpp"
#include "libstdcxx_order.hpp"
#include "lookup_file.hpp"
#include "ngram.hpp"
#include "ngst_build.hpp"
#include "ngst_format.hpp"
#include "shared_cache.hpp"

namespace ngramcache {
namespace runs {

constexpr char kMagic[4] = {'N', 'G', 'R', 'N'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 32;
constexpr int kRankShift = 40;  // positions below 2^40, run ranks above
constexpr uint64_t kMaxPosition = (uint64_t(1) << kRankShift) - 1;

struct RunEntry {
    token_t key[kNgramMax];  // kTokenNull-padded, as an Ngram
    token_t token;
    uint32_t count;
    uint64_t first;
    uint32_t own_rank;    // the token's place in its source part
    uint32_t visit_rank;  // its place in llama.cpp's visiting order of that part
};
static_assert(sizeof(RunEntry) == 40, "run entries are 40 bytes on disk");

inline int compare_pair(const RunEntry& a, const RunEntry& b) {
    for (int i = 0; i < kNgramMax; ++i)
        if (a.key[i] != b.key[i]) return a.key[i] < b.key[i] ? -1 : 1;
    if (a.token != b.token) return a.token < b.token ? -1 : 1;
    return 0;
}

inline bool same_key(const RunEntry& a, const RunEntry& b) {
    return std::memcmp(a.key, b.key, sizeof a.key) == 0;
}

inline int key_size(const RunEntry& e) {
    int n = 0;
    while (n < kNgramMax && e.key[n] != kTokenNull) ++n;
    return n;
}

struct RunHeader {
    uint32_t sizes = 0;  // bit n set: the run holds n-grams of size n
    uint64_t n_entries = 0;
    uint64_t total = 0;
};

inline void put_header(uint8_t* out, const RunHeader& h) {
    std::memset(out, 0, kHeaderSize);
    std::memcpy(out, kMagic, 4);
    std::memcpy(out + 4, &kVersion, 4);
    std::memcpy(out + 8, &h.sizes, 4);
    std::memcpy(out + 16, &h.n_entries, 8);
    std::memcpy(out + 24, &h.total, 8);
}

inline RunHeader parse_header(const uint8_t* in, uint64_t file_size, const std::string& name) {
    auto fail = [&](const std::string& why) { throw FormatError(name + ": not a sorted run: " + why); };
    if (file_size < kHeaderSize) fail("shorter than its 32-byte header");
    if (std::memcmp(in, kMagic, 4) != 0) fail("bad magic");
    uint32_t version;
    std::memcpy(&version, in + 4, 4);
    if (version != kVersion) fail("version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
    RunHeader h;
    std::memcpy(&h.sizes, in + 8, 4);
    std::memcpy(&h.n_entries, in + 16, 8);
    std::memcpy(&h.total, in + 24, 8);
    if ((file_size - kHeaderSize) / sizeof(RunEntry) != h.n_entries || (file_size - kHeaderSize) % sizeof(RunEntry))
        fail("its size does not match its entry count " + std::to_string(h.n_entries));
    return h;
}

// Buffered writes into one AtomicFile save (the package's one way of writing a file:
// temporary file, fsync, rename, the old file's mode, links followed; atomic_file.hpp).
class AtomicWriter {
public:
    explicit AtomicWriter(const std::string& path) : file_(path) { buf_.reserve(kBuffer); }

    void write(const void* data, size_t size) {
        const char* p = static_cast<const char*>(data);
        if (buf_.size() + size > kBuffer) {
            flush();
            if (size >= kBuffer) return file_.write(p, size);
        }
        buf_.insert(buf_.end(), p, p + size);
    }

    void commit() {
        flush();
        file_.commit();
    }

private:
    static constexpr size_t kBuffer = size_t(1) << 20;
    void flush() {
        if (!buf_.empty()) file_.write(buf_.data(), buf_.size());
        buf_.clear();
    }
    AtomicFile file_;
    std::vector<char> buf_;
};

// Sorts `entries` into run order and adds up repeated pairs (the earliest sighting and
// its ranks stay); returns the run's header.
inline RunHeader sort_run(std::vector<RunEntry>& entries) {
    ngst::check_host();
    std::sort(entries.begin(), entries.end(), [](const RunEntry& a, const RunEntry& b) {
        const int c = compare_pair(a, b);
        return c != 0 ? c < 0 : a.first < b.first;
    });
    RunHeader h;
    size_t out = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        if (out > 0 && compare_pair(entries[out - 1], entries[i]) == 0) {
            RunEntry& e = entries[out - 1];
            if (uint64_t(e.count) + entries[i].count > uint64_t(INT32_MAX))
                throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
            e.count += entries[i].count;
        } else {
            entries[out++] = entries[i];
        }
        h.total += entries[i].count;
        h.sizes |= 1u << key_size(entries[i]);
    }
    entries.resize(out);
    h.n_entries = out;
    return h;
}

// The run image of `entries` (any order; a pair may repeat).
inline std::vector<uint8_t> run_image(std::vector<RunEntry>& entries) {
    const RunHeader h = sort_run(entries);
    std::vector<uint8_t> img(kHeaderSize + entries.size() * sizeof(RunEntry));
    put_header(img.data(), h);
    if (!entries.empty()) std::memcpy(img.data() + kHeaderSize, entries.data(), entries.size() * sizeof(RunEntry));
    return img;
}

// The run of `entries` written to `path` (atomically), without an image in memory.
inline void save_run(std::vector<RunEntry>& entries, const std::string& path) {
    const RunHeader h = sort_run(entries);
    uint8_t head[kHeaderSize];
    put_header(head, h);
    AtomicWriter w(path);
    w.write(head, kHeaderSize);
    w.write(entries.data(), entries.size() * sizeof(RunEntry));
    w.commit();
}

inline void check_rank(uint64_t rank) {
    if (rank >= (uint64_t(1) << (64 - kRankShift)))
        throw InputError("run rank " + std::to_string(rank) + " is too large (at most 2^24 - 1)");
}

// A stretch of tokens whose observations go into a run: those whose next token sits at
// index first_target or later (and at n or later, so the key fits), each first seen at
// (rank << 40) | (first_position + index - first_target).
struct TokenStretch {
    const token_t* tokens;
    size_t n_tokens;
    uint64_t rank;
    size_t first_target;
    uint64_t first_position;
};

// The observations of the stretches, as update(tokens, n, n) counts them, as one run.
inline std::vector<uint8_t> run_from_tokens(const std::vector<TokenStretch>& stretches, int n) {
    ngst::check_ngram_size(n);
    size_t total = 0;
    for (const TokenStretch& s : stretches) {
        check_rank(s.rank);
        if (s.first_position + s.n_tokens > kMaxPosition) throw InputError("a shard of more than 2^40 tokens");
        total += s.n_tokens;
    }
    std::vector<RunEntry> entries;
    entries.reserve(total);
    for (const TokenStretch& s : stretches) {
        for (size_t i = 0; i < s.n_tokens; ++i)
            if (s.tokens[i] < 0)
                throw InputError("tokens: negative token id " + std::to_string(s.tokens[i]) + " at index " +
                                 std::to_string(i));
        for (size_t i = std::max<size_t>(s.first_target, static_cast<size_t>(n)); i < s.n_tokens; ++i) {
            RunEntry e;
            std::memset(&e, 0, sizeof e);
            for (int j = 0; j < kNgramMax; ++j) e.key[j] = j < n ? s.tokens[i - n + j] : kTokenNull;
            e.token = s.tokens[i];
            e.count = 1;
            e.first = (s.rank << kRankShift) | (s.first_position + i - s.first_target);
            entries.push_back(e);
        }
    }
    return run_image(entries);
}

// The counts of `cache` as run entries (unsorted). With `llama_order`, keys are ranked in
// the order llama.cpp's outer map visits them (how common_ngram_cache_merge walks a cache
// it adds), else in insertion order (the cache a merge starts from).
inline std::vector<RunEntry> cache_entries(const NgramCache& cache, uint64_t rank, bool llama_order) {
    check_rank(rank);
    std::vector<uint32_t> order;
    if (llama_order) {
        order = cache.llama_key_order();
    } else {
        order.resize(cache.size());
        for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    }
    std::vector<RunEntry> entries;
    entries.reserve(cache.n_entries());
    uint64_t key_rank = 0;
    for (uint32_t i : order) {
        const Part& p = cache.part_at(i);
        if (p.size() == 0) continue;
        RunEntry e;
        std::memset(&e, 0, sizeof e);
        std::memcpy(e.key, cache.key_at(i).t, sizeof e.key);
        e.first = (rank << kRankShift) | key_rank++;
        const std::vector<uint32_t> visit =
            p.size() < 2 ? std::vector<uint32_t>{0}
                         : libstdcxx::part_order(p.size(), [&](size_t x) { return p[uint32_t(x)].token; });
        for (uint32_t v = 0; v < visit.size(); ++v) {
            const Entry& pe = p[visit[v]];
            e.token = pe.token;
            e.count = static_cast<uint32_t>(pe.count);
            e.own_rank = visit[v];
            e.visit_rank = v;
            entries.push_back(e);
        }
    }
    return entries;
}

// Reads a run file a block at a time.
class RunReader {
public:
    RunReader(const std::string& path, size_t block_entries) : path_(path), block_(block_entries) {
        check_path(path);
        f_ = std::fopen(path.c_str(), "rb");
        if (f_ == nullptr) {
            if (errno == ENOENT) throw FileNotFound(path + ": no such file");
            throw std::system_error(errno, std::generic_category(), path);
        }
        uint8_t head[kHeaderSize];
        const size_t got = std::fread(head, 1, kHeaderSize, f_);
        std::fseek(f_, 0, SEEK_END);
        const long size = std::ftell(f_);
        std::fseek(f_, long(kHeaderSize), SEEK_SET);
        header_ = parse_header(head, got < kHeaderSize ? got : uint64_t(size), path);
        left_ = header_.n_entries;
        buf_.resize(std::max<size_t>(1, std::min<uint64_t>(block_, left_)));
        refill();
    }
    RunReader(const RunReader&) = delete;
    RunReader& operator=(const RunReader&) = delete;
    ~RunReader() {
        if (f_ != nullptr) std::fclose(f_);
    }

    const RunHeader& header() const { return header_; }
    bool done() const { return at_ == have_; }
    const RunEntry& current() const { return buf_[at_]; }

    void advance() {
        prev_ = buf_[at_];
        if (++at_ == have_) refill();
        if (!done() && compare_pair(prev_, buf_[at_]) >= 0)
            throw FormatError(path_ + ": not a sorted run: entries out of order or repeated");
    }

private:
    void refill() {
        at_ = have_ = 0;
        if (left_ == 0) return;
        const size_t want = static_cast<size_t>(std::min<uint64_t>(left_, buf_.size()));
        if (std::fread(buf_.data(), sizeof(RunEntry), want, f_) != want)
            throw FormatError(path_ + ": not a sorted run: truncated");
        left_ -= want;
        have_ = want;
    }

    std::string path_;
    size_t block_;
    FILE* f_ = nullptr;
    RunHeader header_;
    uint64_t left_ = 0;
    std::vector<RunEntry> buf_;
    size_t at_ = 0, have_ = 0;
    RunEntry prev_{};
};

// One key of the merge: its entries sorted by token, equal pairs of all runs added up.
struct KeyGroup {
    Ngram key;
    std::vector<RunEntry> entries;  // count, first sighting and ranks as merged
    uint64_t first = 0;              // the key's first sighting
    uint64_t sum = 0;

    // Indices into entries in the order the tokens entered the merged part.
    std::vector<uint32_t> seen_order() const {
        std::vector<uint32_t> idx(entries.size());
        for (uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
        const uint64_t key_run = first >> kRankShift;
        auto rank_of = [&](const RunEntry& e) {
            return (e.first >> kRankShift) == key_run ? e.own_rank : e.visit_rank;
        };
        std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
            const RunEntry& x = entries[a];
            const RunEntry& y = entries[b];
            if (x.first != y.first) return x.first < y.first;
            return rank_of(x) < rank_of(y);
        });
        return idx;
    }
};

// The k-way merge: key groups in key order, reading every run a block at a time.
class Merger {
public:
    Merger(const std::vector<std::string>& paths, size_t block_entries) {
        readers_.reserve(paths.size());
        for (const std::string& p : paths) {
            readers_.emplace_back(new RunReader(p, block_entries));
            sizes_ |= readers_.back()->header().sizes;
            total_ += readers_.back()->header().total;
        }
        for (uint32_t r = 0; r < readers_.size(); ++r)
            if (!readers_[r]->done()) heap_.push(r);
    }

    uint32_t sizes() const { return sizes_; }   // bitmask of the n-gram sizes present
    uint64_t total() const { return total_; }  // sum of every count

    bool next(KeyGroup& g) {
        if (heap_.empty()) return false;
        g.entries.clear();
        g.sum = 0;
        std::memcpy(g.key.t, readers_[heap_.top()]->current().key, sizeof g.key.t);
        while (!heap_.empty()) {
            const uint32_t r = heap_.top();
            const RunEntry& e = readers_[r]->current();
            if (std::memcmp(e.key, g.key.t, sizeof g.key.t) != 0) break;
            heap_.pop();
            if (!g.entries.empty() && g.entries.back().token == e.token) {
                RunEntry& m = g.entries.back();
                if (uint64_t(m.count) + e.count > uint64_t(INT32_MAX))
                    throw InputError("an n-gram count exceeds the int32 range of lookup.bin");
                m.count += e.count;
                if (e.first < m.first) {
                    m.first = e.first;
                    m.own_rank = e.own_rank;
                    m.visit_rank = e.visit_rank;
                }
            } else {
                g.entries.push_back(e);
            }
            g.sum += e.count;
            readers_[r]->advance();
            if (!readers_[r]->done()) heap_.push(r);
        }
        g.first = g.entries[0].first;
        for (const RunEntry& e : g.entries) g.first = std::min(g.first, e.first);
        return true;
    }

private:
    struct Later {
        const std::vector<std::unique_ptr<RunReader>>* readers;
        bool operator()(uint32_t a, uint32_t b) const {
            const int c = compare_pair((*readers)[a]->current(), (*readers)[b]->current());
            return c != 0 ? c > 0 : a > b;
        }
    };
    std::vector<std::unique_ptr<RunReader>> readers_;
    std::priority_queue<uint32_t, std::vector<uint32_t>, Later> heap_{Later{&readers_}};
    uint32_t sizes_ = 0;
    uint64_t total_ = 0;
};

// Which best-token rule the merged table follows: a table built from tokens
// (StaticTable.build: llama.cpp's order after the lookup.bin is saved and reloaded) or
// one made from a cache (StaticTable.from_cache: the cache's own order).
enum class BestRule { tokens, cache };

struct Best {
    token_t token;
    uint32_t count;
};

inline Best best_of(const KeyGroup& g, const std::vector<uint32_t>& seen, BestRule rule) {
    if (rule == BestRule::cache) {
        Part p;
        for (uint32_t i : seen) p.add_new(g.entries[i].token, static_cast<int32_t>(g.entries[i].count));
        return Best{best_by_count(p), static_cast<uint32_t>(p.max_count())};
    }
    uint32_t best_cnt = 0, n_at_best = 0;
    for (const RunEntry& e : g.entries) {
        if (e.count > best_cnt) {
            best_cnt = e.count;
            n_at_best = 1;
        } else if (e.count == best_cnt) {
            ++n_at_best;
        }
    }
    auto at = [&](size_t i) -> const RunEntry& { return g.entries[seen[i]]; };
    size_t pick = 0;
    if (n_at_best == 1) {
        while (at(pick).count != best_cnt) ++pick;
    } else {
        pick = libstdcxx::first_after_reload(
            seen.size(), [&](size_t i) { return at(i).token; }, [&](size_t i) { return at(i).count == best_cnt; });
    }
    return Best{at(pick).token, best_cnt};
}

// What a merge wrote: distinct keys, (key, token) entries, the sum of all counts.
struct MergeCounts {
    uint64_t keys = 0, entries = 0, total = 0;
};

// The one n-gram size of the runs; `n` (0: none) is the size to use when they are empty.
inline int single_size(uint32_t sizes, int n) {
    if (n != 0 && (sizes & ~(1u << n)))
        throw InputError("the runs hold n-grams of another size than " + std::to_string(n));
    if (sizes == 0) return n != 0 ? n : kNgramStatic;
    if (sizes & (sizes - 1))
        throw InputError("a static table (.ngst) holds n-grams of one size; these runs hold several");
    int size = 1;
    while (!(sizes & (1u << size))) ++size;
    return size;
}

// The NGST image of the merged runs (of n-grams of size n; 0: whatever size they hold):
// one merge pass for the layout (hash and entry count per key), a second that fills the
// records in key order.
inline ngst::Image merge_to_ngst(const std::vector<std::string>& paths, int ngram_size, ngst::Source src,
                                 BestRule rule, size_t block_entries, MergeCounts& counts) {
    if (ngram_size != 0) ngst::check_ngram_size(ngram_size);
    ngst::check_host();
    std::vector<uint32_t> hash_hi, ntok;
    uint64_t total = 0;
    int n = kNgramStatic;
    {
        Merger m(paths, block_entries);
        n = single_size(m.sizes(), ngram_size);
        KeyGroup g;
        while (m.next(g)) {
            if (g.sum > ngst::kMaxU32)
                throw InputError("a key's counts sum to " + std::to_string(g.sum) +
                                 ", beyond the 2^32-1 an NGST record holds");
            hash_hi.push_back(static_cast<uint32_t>(ngst::key_hash(g.key.t, n) >> 32));
            ntok.push_back(static_cast<uint32_t>(g.entries.size()));
            total += g.sum;
            counts.entries += g.entries.size();
        }
    }
    counts.keys = hash_hi.size();
    counts.total = total;
    Merger m(paths, block_entries);
    KeyGroup g;
    auto fill = [&](size_t, uint8_t* rec, uint8_t* ent) {
        if (!m.next(g)) throw FormatError("sorted runs changed while they were merged");
        ngst::write_key(rec, g.key.t, n);
        const Best b = best_of(g, g.seen_order(), rule);
        ngst::write_best(rec, b.token, b.count, g.sum);
        if (g.entries.size() >= 2)
            for (size_t j = 0; j < g.entries.size(); ++j) ngst::write_entry(ent, j, g.entries[j].token, g.entries[j].count);
    };
    return ngst::image_from_sorted_keys(n, src, std::move(hash_hi), ntok, total, fill);
}

// The merged runs written to `path` as an NGST file, atomically: from runs of tokens (a
// key's best token the first seen of its most frequent, as StaticTable::build picks it)
// or from runs of caches (as StaticTable::from_cache picks it).
inline MergeCounts merge_to_ngst_file(const std::vector<std::string>& paths, const std::string& path,
                                      int ngram_size, bool from_tokens, size_t block_entries) {
    MergeCounts counts;
    const ngst::Image img =
        merge_to_ngst(paths, ngram_size, from_tokens ? ngst::Source::tokens : ngst::Source::cache,
                      from_tokens ? BestRule::tokens : BestRule::cache, block_entries, counts);
    write_file_atomic(path, img.bytes.get(), img.size);
    return counts;
}

// The run of a cache other threads may use, written to `path` atomically: its entries are
// copied under the read lock, sorted and written after it is released.
inline void save_cache_run(const SharedCache& cache, uint64_t rank, bool llama_order, const std::string& path) {
    std::vector<RunEntry> entries = cache.read([&](const NgramCache& c) { return cache_entries(c, rank, llama_order); });
    save_run(entries, path);
}

// The merged runs as llama.cpp's lookup.bin, written to `path` atomically: what
// common_ngram_cache_save writes for the cache whose insertions the runs record (keys in
// order of first sighting into a fresh map). Records are spooled in key order to
// `spool_path`, then copied out in the map's order.
inline MergeCounts merge_to_lookup(const std::vector<std::string>& paths, const std::string& path,
                                   const std::string& spool_path, size_t block_entries) {
    MergeCounts counts;
    ngst::check_host();
    struct KeyPlace {
        uint64_t first;
        uint64_t offset;
    };
    std::vector<KeyPlace> places;
    std::vector<uint64_t> hashes;
    {
        AtomicWriter spool(spool_path);
        Merger m(paths, block_entries);
        KeyGroup g;
        std::vector<char> rec;
        uint64_t offset = 0;
        while (m.next(g)) {
            const std::vector<uint32_t> seen = g.seen_order();
            rec.clear();
            for (int s = 0; s < kNgramMax; ++s) store_i32(rec, g.key.t[s]);
            store_i32(rec, static_cast<int32_t>(seen.size()));
            for (uint32_t j : libstdcxx::part_order(seen.size(), [&](size_t x) { return g.entries[seen[x]].token; })) {
                store_i32(rec, g.entries[seen[j]].token);
                store_i32(rec, static_cast<int32_t>(g.entries[seen[j]].count));
            }
            spool.write(rec.data(), rec.size());
            places.push_back(KeyPlace{g.first, offset});
            hashes.push_back(libstdcxx::llama_ngram_hash(g.key.t));
            offset += rec.size();
            counts.entries += g.entries.size();
            counts.total += g.sum;
        }
        spool.commit();
    }
    FileMapping spooled = FileMapping::open(spool_path);
    const uint64_t K = places.size();
    std::vector<uint32_t> by_first(K);
    for (uint32_t k = 0; k < K; ++k) by_first[k] = k;
    std::sort(by_first.begin(), by_first.end(), [&](uint32_t a, uint32_t b) { return places[a].first < places[b].first; });
    libstdcxx::NodeList list;
    list.reserve(K);
    for (uint32_t k : by_first) list.insert(hashes[k]);
    std::vector<uint64_t>().swap(hashes);
    AtomicWriter out(path);
    for (uint32_t node : list.order()) {
        const uint32_t k = by_first[node];
        const uint64_t end = k + 1 < K ? places[k + 1].offset : spooled.size();
        out.write(spooled.data() + places[k].offset, end - places[k].offset);
    }
    out.commit();
    std::remove(spool_path.c_str());
    counts.keys = K;
    return counts;
}

}  // namespace runs
}  // namespace ngramcache
