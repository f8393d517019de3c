// Fuzz target: NGST static table images (cpp/include/ngramcache/static_table.hpp and
// ngst_format.hpp), opened as StaticTable::open and from_image open them.
//
// Every input is tried twice: as it is, and "repaired": its header check and section
// checksums recomputed, so that mutations reach the structural checks of verify() and
// the lookups instead of stopping at a checksum.
//
// Properties: opening either succeeds or throws FormatError; lookups, drafting and the
// array export of an opened (unverified) table stay inside the image; verify() either
// passes or throws FormatError; a table that passes verify() exports a lookup.bin that
// loads, with the header's pair count and total.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngst_format.hpp"
#include "ngramcache/static_table.hpp"

using namespace ngramcache;

namespace {

// Queries drawn from the table's own keys (the first and last record) and from the input.
std::vector<token_t> queries(const StaticTable& t, const uint8_t* data, size_t size) {
    std::vector<token_t> q;
    const int n = t.ngram_size();
    for (uint64_t i : {uint64_t(0), t.n_keys() - 1}) {
        if (i >= t.n_keys()) continue;
        for (int j = 0; j < n; ++j) q.push_back(ngst::loadi32(t.key_ptr(t.record(i)) + 4 * j));
    }
    for (token_t x : fuzz::tokens_from(data + size / 2, size - size / 2, 64, 8)) q.push_back(x);
    return q;
}

void use(const StaticTable& t, const uint8_t* data, size_t size) {
    const int n = t.ngram_size();
    const std::vector<token_t> q = queries(t, data, size);
    for (size_t i = 0; i + n <= q.size(); ++i) {
        const StaticTable::Ref r = t.find(q.data() + i, size_t(n));
        if (r == nullptr) continue;
        int64_t seen = 0;
        t.for_each_entry(r, [&](token_t tok, int64_t c) { seen += t.count(r, tok) == c; });
        token_t best;
        t.best(r, best);
    }
    if (n == 2 && q.size() >= 2) {
        static const NgramCache empty;
        token_t out[8];
        const size_t got = draft(q.data(), q.size(), 8, 1, 4, empty, nullptr, t, out);
        fuzz::require(got <= 8, "draft returned more tokens than asked for");
    }
    // Arrays sized from the header, as the Python binding sizes them.
    const uint64_t k = t.n_keys(), m = t.n_entries();
    if (k <= (1u << 16) && m <= (1u << 16)) {
        std::vector<int32_t> keys(k * n + 1), toks(m + 1), cnts(m + 1), btok(k + 1);
        std::vector<int64_t> offs(k + 1), bcnt(k + 1), sums(k + 1);
        t.export_arrays(keys.data(), offs.data(), toks.data(), cnts.data(), btok.data(), bcnt.data(), sums.data());
        fuzz::require(offs[k] >= 0 && uint64_t(offs[k]) <= m, "export wrote past the header's entry count");
    }
}

void check(const uint8_t* img, size_t size, const uint8_t* data, size_t dsize) {
    const StaticTable t = StaticTable::from_image(img, size, "fuzz input");
    use(t, data, dsize);
    bool verified = false;
    try {
        t.verify();
        verified = true;
    } catch (const FormatError&) {
    }
    if (!verified) return;
    const std::vector<char> lookup = t.to_lookup_verified();
    NgramCache back;
    load_lookup(back, lookup.data(), lookup.size(), "exported lookup.bin");
    fuzz::require(back.size() == t.n_keys() && back.n_entries() == t.n_entries(),
                  "a verified table exports another number of keys or pairs");
    int64_t total = 0;
    for (size_t i = 0; i < back.size(); ++i) total += back.part_at(i).sum();
    fuzz::require(uint64_t(total) == t.total(), "a verified table exports another total");
}

void try_open(const uint8_t* img, size_t size, const uint8_t* data, size_t dsize) {
    try {
        check(img, size, data, dsize);
    } catch (const FormatError&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try_open(data, size, data, size);
    if (size < ngst::kHeaderSize || size > (1u << 20)) return 0;
    std::vector<uint8_t> fixed(data, data + size);
    ngst::put32(fixed.data() + 36, ngst::header_check(fixed.data()));
    try {
        ngst::rewrite_checksums(fixed.data(), fixed.size(), "repaired input");
    } catch (const FormatError&) {
        return 0;  // the header itself does not describe a table of this size
    }
    try_open(fixed.data(), fixed.size(), data, size);
    return 0;
}
