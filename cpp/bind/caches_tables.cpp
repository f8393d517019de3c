// NgramCache (llama.cpp's context/dynamic cache, locked for sharing), StaticTable (an NGST
// file, immutable, so any number of threads may use one at once) and draft().
#include <string>
#include <string_view>

#include "common.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngst_format.hpp"
#include "ngramcache/shared_cache.hpp"
#include "ngramcache/static_table.hpp"

namespace ngramcache_bind {

using namespace ngramcache;

StaticSource static_source(const StaticArg& obj) {
    if (obj.is_none()) return {};
    if (py::isinstance<SharedCache>(obj)) return {obj.cast<const SharedCache*>(), nullptr};
    if (py::isinstance<StaticTable>(obj)) return {nullptr, obj.cast<const StaticTable*>()};
    throw py::type_error("static must be a _core.NgramCache, a _core.StaticTable or None");
}

namespace {

// Every lock is taken without the GIL: a replay holding a cache's lock takes the GIL back
// for its progress callback, and waiting for the lock with the GIL held would leave both
// waiting forever.
template <class R>
auto locked_read(R (NgramCache::*get)() const) {
    return [get](const SharedCache& s) { return nogil([&] { return s.read([&](const NgramCache& c) { return (c.*get)(); }); }); };
}

pyt::Dict<py::str, py::object> description_dict(const ngst::Description& d) {
    const ngst::Header& h = d.header;
    py::dict sections, checksums;
    for (const auto& s : d.sections) {
        sections[s.name] = py::make_tuple(s.offset, s.size);
        checksums[s.name] = s.checksum;
    }
    return pyt::Dict<py::str, py::object>(py::dict(
        "magic"_a = d.magic, "version"_a = h.version, "byte_order"_a = d.byte_order,
                    "ngram_size"_a = h.ngram_size, "source"_a = ngst::source_name(h.source), "n_keys"_a = h.n_keys,
                    "n_entries"_a = h.n_entries, "n_stored"_a = h.n_stored, "total"_a = h.total,
                    "bucket_bits"_a = h.bucket_bits, "n_buckets"_a = d.layout.n_buckets,
                    "record_size"_a = d.layout.stride, "file_size"_a = d.layout.file_size, "sections"_a = sections,
                    "checksums"_a = checksums));
}

// Copies of the flat arrays; the table's flagged read-only (the table itself is immutable).
auto cache_arrays(const SharedCache& s) {
    const CacheArrays a = nogil([&] { return export_shared(s); });
    return py::make_tuple(as_array(a.keys, kNgramMax), as_array(a.offsets), as_array(a.tokens), as_array(a.counts));
}

auto static_arrays(const StaticTable& t) {
    const auto k = static_cast<py::ssize_t>(t.n_keys()), m = static_cast<py::ssize_t>(t.n_entries());
    py::array_t<int32_t> keys({k, py::ssize_t(t.ngram_size())}), toks(m), cnts(m), btok(k);
    py::array_t<int64_t> offsets(k + 1), bcnt(k), sums(k);
    int32_t *kp = keys.mutable_data(), *tp = toks.mutable_data(), *cp = cnts.mutable_data(), *bt = btok.mutable_data();
    int64_t *op = offsets.mutable_data(), *bc = bcnt.mutable_data(), *sp = sums.mutable_data();
    nogil([&] { t.export_arrays(kp, op, tp, cp, bt, bc, sp); });
    auto out = py::make_tuple(keys, offsets, toks, cnts, btok, bcnt, sums);
    for (auto a : out) a.attr("flags").attr("writeable") = false;
    return out;
}

void register_cache(py::module_& m) {
    py::class_<SharedCache>(m, "NgramCache", "Mutable n-gram cache (llama.cpp's context/dynamic cache).")
        .def(py::init<>())
        .def("__len__", locked_read(&NgramCache::size))
        .def_property_readonly("nbytes", locked_read(&NgramCache::memory_bytes))
        .def_property("max_bytes", locked_read(&NgramCache::max_bytes),
                      [](SharedCache& s, size_t bytes) {
                          nogil([&] { s.write([&](NgramCache& c) { c.set_max_bytes(bytes); }); });
                      })
        .def_property_readonly("evicted", locked_read(&NgramCache::evicted))
        .def_property_readonly("estimated_bytes", locked_read(&NgramCache::estimated_bytes))
        .def(
            "update",
            [](SharedCache& s, const Tokens& tokens, int ngram_min, int ngram_max, size_t nnew) {
                py::gil_scoped_release release;
                s.write([&](NgramCache& c) { c.update(tokens.data(), len(tokens), ngram_min, ngram_max, nnew); });
            },
            "tokens"_a, "ngram_min"_a, "ngram_max"_a, "nnew"_a)
        .def(
            "get",
            [](const SharedCache& s, const Tokens& ngram) {
                const Ngram key = Ngram::checked(ngram.data(), len(ngram));
                const std::vector<Entry> entries = nogil([&] { return entries_of(s, key); });
                pyt::Dict<py::int_, py::int_> d;
                for (const Entry& e : entries) d[py::int_(e.token)] = py::int_(e.count);
                return d;
            },
            "ngram"_a)
        .def("merge", &merge_shared, "other"_a, py::call_guard<py::gil_scoped_release>())
        .def("clear", [](SharedCache& s) { nogil([&] { s.write([](NgramCache& c) { c.clear(); }); }); })
        .def("arrays", &cache_arrays)
        .def("to_bytes", [](const SharedCache& s) { return as_bytes(nogil([&] { return s.read(serialize_lookup); })); })
        .def("save", &save_shared, "path"_a, py::call_guard<py::gil_scoped_release>())
        .def_static(
            "load",
            [](const std::string& path) {
                NgramCache fresh;
                nogil([&] { load_lookup_file(fresh, path); });
                return new_cache(fresh);
            },
            "path"_a, py::return_value_policy::take_ownership)
        .def_static(
            "from_bytes",
            [](const py::bytes& data, const std::string& name) {
                const std::string_view v = data;
                NgramCache fresh;
                nogil([&] { load_lookup(fresh, v.data(), v.size(), name); });
                return new_cache(fresh);
            },
            "data"_a, "name"_a, py::return_value_policy::take_ownership);
}

void register_static(py::module_& m) {
    py::class_<StaticTable>(m, "StaticTable", "Immutable n-gram table (NGST file), opened in O(1) with mmap.")
        .def_static("build",
                    [](const Tokens& tokens, int ngram_size) {
                        py::gil_scoped_release release;
                        return StaticTable::build(tokens.data(), len(tokens), ngram_size);
                    },
                    "tokens"_a, "ngram_size"_a)
        .def_static("open", &StaticTable::open, "path"_a, py::call_guard<py::gil_scoped_release>())
        .def_static("from_lookup_file", &StaticTable::from_lookup_file, "path"_a, "ngram_size"_a,
                    py::call_guard<py::gil_scoped_release>())
        .def_static("from_image",
                    [](const py::bytes& data, const std::string& name) {
                        const std::string_view v = data;
                        py::gil_scoped_release release;
                        return StaticTable::from_image(v.data(), v.size(), name);
                    },
                    "data"_a, "name"_a)
        .def_static("from_cache", &table_from_shared, "cache"_a, "ngram_size"_a,
                    py::call_guard<py::gil_scoped_release>())
        .def("__len__", &StaticTable::n_keys)
        .def_property_readonly("ngram_size", &StaticTable::ngram_size)
        .def_property_readonly("total", &StaticTable::total)
        .def_property_readonly("n_keys", &StaticTable::n_keys)
        .def_property_readonly("n_entries", &StaticTable::n_entries)
        .def_property_readonly("nbytes", &StaticTable::nbytes)
        .def_property_readonly("mapped", &StaticTable::mapped)
        .def_property_readonly("name", &StaticTable::name)
        .def(
            "__contains__",
            [](const StaticTable& t, const Tokens& ngram) { return t.find(ngram.data(), len(ngram)) != nullptr; },
            "ngram"_a)
        .def(
            "get",
            [](const StaticTable& t, const Tokens& ngram) {
                pyt::Dict<py::int_, py::int_> d;
                if (const StaticTable::Ref r = t.find(ngram.data(), len(ngram)))
                    t.for_each_entry(r, [&](token_t tok, int64_t c) { d[py::int_(tok)] = py::int_(c); });
                return d;
            },
            "ngram"_a)
        .def(
            "best",
            [](const StaticTable& t, const Tokens& ngram) {
                using Best = pyt::Tuple<py::int_, py::int_, py::int_>;  // token, its count, the key's sum
                const StaticTable::Ref r = t.find(ngram.data(), len(ngram));
                if (r == nullptr) return pyt::Optional<Best>(py::none());
                return pyt::Optional<Best>(py::make_tuple(t.best_token(r), t.best_count(r), t.sum(r)));
            },
            "ngram"_a)
        .def("header", [](const StaticTable& t) { return description_dict(ngst::describe(t.header())); })
        .def("arrays", &static_arrays)
        .def("to_bytes",
             [](const StaticTable& t) { return py::bytes(reinterpret_cast<const char*>(t.data()), t.nbytes()); })
        .def("save", &StaticTable::save, "path"_a, py::call_guard<py::gil_scoped_release>())
        .def("verify", &StaticTable::verify, py::call_guard<py::gil_scoped_release>())
        .def("save_lookup", &StaticTable::save_lookup, "path"_a, py::call_guard<py::gil_scoped_release>())
        .def("to_lookup_bytes",
             [](const StaticTable& t) { return as_bytes(nogil([&] { return t.to_lookup_verified(); })); })
        .def(
            "to_cache",
            [](const StaticTable& t) {
                NgramCache fresh;
                nogil([&] { t.to_cache(fresh); });
                return new_cache(fresh);
            },
            py::return_value_policy::take_ownership);

    m.def(
        "read_header",
        [](const py::bytes& head, uint64_t file_size, const std::string& name) {
            const std::string_view v = head;
            return description_dict(ngst::describe(
                ngst::decode_header_prefix(reinterpret_cast<const uint8_t*>(v.data()), v.size(), file_size, name)));
        },
        "head"_a, "file_size"_a, "name"_a);
    // For tests: an image with damage that the checksums do not catch.
    m.def(
        "_static_rechecksum",
        [](const py::bytes& image) {
            std::string buf = image;
            ngst::rewrite_checksums(reinterpret_cast<uint8_t*>(buf.data()), buf.size(), "<bytes>");
            return py::bytes(buf);
        },
        "image"_a);
}

}  // namespace

void register_caches_tables(py::module_& m) {
    register_cache(m);
    register_static(m);
    m.def(
        "draft",
        [](const Tokens& tokens, size_t n_draft, const SharedCache& context, const Maybe<const SharedCache>& dynamic,
           const StaticArg& static_obj, int ngram_min, int ngram_max) {
            const StaticSource st = static_source(static_obj);
            return proposal(n_draft, [&](token_t* out) {
                return draft_shared(tokens.data(), len(tokens), n_draft, ngram_min, ngram_max, context, pointer(dynamic),
                                    st, out);
            });
        },
        "tokens"_a, "n_draft"_a, "context"_a, "dynamic"_a.none(true), "static"_a.none(true), "ngram_min"_a,
        "ngram_max"_a);
}

}  // namespace ngramcache_bind
