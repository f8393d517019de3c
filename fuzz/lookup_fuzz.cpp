// Fuzz target: llama.cpp lookup.bin images, as NgramCache loads them and as a static
// table imports them (cpp/include/ngramcache/lookup_file.hpp, ngst_build.hpp).
//
// Properties: loading either succeeds or throws FormatError; an image that loads
// serialises to one that loads back to the same counts; drafting from the loaded cache
// (as context, dynamic and static cache) stays in bounds; importing the image as a static
// table either throws FormatError or InputError or gives a table that passes verify() and
// exports the counts it was given; doubling the counts either works or throws
// std::overflow_error.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;

namespace {

bool same_counts(const NgramCache& a, const NgramCache& b) {
    if (a.size() != b.size() || a.n_entries() != b.n_entries()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        const Part& pa = a.part_at(i);
        const Part* pb = b.find(a.key_at(i));
        if (pb == nullptr || pb->size() != pa.size() || pb->sum() != pa.sum()) return false;
        for (const Entry& e : pa)
            if (pb->count_of(e.token) != e.count) return false;
    }
    return true;
}

// The keys of size n of `c`, with their counts: what a static table imported from c's
// image must hold.
void keys_of_size(const NgramCache& c, int n, NgramCache& out) {
    for (size_t i = 0; i < c.size(); ++i) {
        const Ngram& k = c.key_at(i);
        int len = 0;
        while (len < kNgramMax && k.t[len] >= 0) ++len;
        if (len != n) continue;
        Part& p = out.get_or_insert(k);
        for (const Entry& e : c.part_at(i)) p.add_new(e.token, e.count);
    }
}

// Drafts after a sequence drawn from the cache's first key, so that lookups hit.
void draft_from(const NgramCache& c, const uint8_t* data, size_t size) {
    std::vector<token_t> inp;
    if (c.size() > 0) {
        const Ngram& k = c.key_at(0);
        for (int i = 0; i < kNgramMax && k.t[i] >= 0; ++i) inp.push_back(k.t[i]);
    }
    for (token_t t : fuzz::tokens_from(data, size, 64, 6)) inp.push_back(t);
    token_t out[8];
    const size_t n = draft(inp.data(), inp.size(), 8, 1, 4, c, &c, CacheAsStatic{&c}, out);
    fuzz::require(n <= 8, "draft returned more tokens than asked for");
    for (size_t i = 0; i < n; ++i) fuzz::require(out[i] >= 0, "drafted a negative token id");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* bytes = reinterpret_cast<const char*>(data);
    NgramCache cache;
    bool loaded = false;
    try {
        load_lookup(cache, bytes, size, "fuzz input");
        loaded = true;
    } catch (const FormatError&) {
    }

    if (loaded) {
        const std::vector<char> img = serialize_lookup(cache);
        NgramCache again;
        load_lookup(again, img.data(), img.size(), "re-serialised image");
        fuzz::require(same_counts(cache, again), "counts changed through serialise and load");
        draft_from(cache, data, size);
        try {
            again.merge(cache);
            again.merge(again);
        } catch (const std::overflow_error&) {
        }
    }

    try {
        const StaticTable t = StaticTable::from_lookup(bytes, size, "fuzz input", 0);
        fuzz::require(loaded, "a static table imported an image that NgramCache rejects");
        t.verify();
        NgramCache back;
        t.to_cache(back);
        NgramCache expected;
        keys_of_size(cache, t.ngram_size(), expected);
        fuzz::require(same_counts(back, expected),
                      "the imported static table holds other counts than the image");
        if (t.ngram_size() == 2) {
            const std::vector<token_t> inp = fuzz::tokens_from(data, size, 64, 6);
            token_t out[8];
            static const NgramCache empty;
            const size_t n = draft(inp.data(), inp.size(), 8, 1, 4, empty, nullptr, t, out);
            fuzz::require(n <= 8, "draft returned more tokens than asked for");
        }
    } catch (const FormatError&) {
    } catch (const InputError&) {
    }
    return 0;
}
