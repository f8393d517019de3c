// The only file that knows about Python: argument conversion, the GIL, locks and errors.
// Token arrays arrive as C-contiguous int32 (the Python layer converts and validates
// once), so the core reads them in place.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "ngramcache/cache.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngram.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/static_table.hpp"

namespace py = pybind11;
using namespace ngramcache;

using Tokens = py::array_t<int32_t, py::array::c_style>;

namespace {

// A cache plus the lock that makes Python-level sharing safe: any number of concurrent
// readers (draft, get, save), writers (update, merge, clear, load) exclusive.
struct PyCache {
    NgramCache cache;
    mutable std::shared_mutex mutex;
};

std::vector<token_t> ngram_arg(const Tokens& ngram) {
    if (ngram.ndim() != 1 || ngram.size() < 1 || ngram.size() > kNgramMax)
        throw InputError("an n-gram is 1 to 4 token ids, got " + std::to_string(ngram.size()));
    return std::vector<token_t>(ngram.data(), ngram.data() + ngram.size());
}

py::dict part_to_dict(const Part* part) {
    py::dict d;
    if (part != nullptr)
        for (const Entry& e : *part) d[py::int_(e.token)] = py::int_(e.count);
    return d;
}

Ngram key_of(const std::vector<token_t>& v) { return Ngram(v.data(), static_cast<int>(v.size())); }

// (keys[N,4], offsets[N+1], tokens[M], counts[M]): the whole cache in insertion and
// first-seen order, for canonical comparison and reporting without a Python loop per entry.
py::tuple cache_arrays(const PyCache& self) {
    std::shared_lock lock(self.mutex);
    const NgramCache& c = self.cache;
    size_t m = 0;
    for (size_t i = 0; i < c.size(); ++i) m += c.part_at(i).size();
    py::array_t<int32_t> keys({static_cast<py::ssize_t>(c.size()), py::ssize_t(4)});
    py::array_t<int64_t> offsets(static_cast<py::ssize_t>(c.size() + 1));
    py::array_t<int32_t> toks(static_cast<py::ssize_t>(m));
    py::array_t<int32_t> cnts(static_cast<py::ssize_t>(m));
    int32_t* kp = keys.mutable_data();
    int64_t* op = offsets.mutable_data();
    int32_t* tp = toks.mutable_data();
    int32_t* cp = cnts.mutable_data();
    size_t j = 0;
    op[0] = 0;
    for (size_t i = 0; i < c.size(); ++i) {
        std::memcpy(kp + 4 * i, c.key_at(i).t, 16);
        for (const Entry& e : c.part_at(i)) {
            tp[j] = e.token;
            cp[j] = e.count;
            ++j;
        }
        op[i + 1] = static_cast<int64_t>(j);
    }
    return py::make_tuple(keys, offsets, toks, cnts);
}

// ---- static table (issue 4) ------------------------------------------------------------
// A StaticTable is immutable, so it needs no lock: drafting, lookups, save and verify can
// run from any number of threads. Python objects are built by the _static_* factories,
// which return a _StaticPending that the StaticTable constructor adopts (so subclasses
// defined in Python get instances of their own class).

struct PyStatic {
    StaticTable t;
};
struct StaticPending {
    StaticTable t;
};

const char* source_name(ngst::Source s) {
    switch (s) {
        case ngst::Source::tokens: return "tokens";
        case ngst::Source::lookup: return "lookup.bin";
        case ngst::Source::cache: return "NgramCache";
    }
    return "?";
}

py::dict header_dict(const ngst::Header& h, const ngst::Layout& L) {
    auto sec = [](uint64_t off, uint64_t size) { return py::make_tuple(off, size); };
    py::dict d;
    d["magic"] = "NGST";
    d["version"] = h.version;
    d["byte_order"] = "little";
    d["ngram_size"] = h.ngram_size;
    d["source"] = source_name(h.source);
    d["n_keys"] = h.n_keys;
    d["n_entries"] = h.n_entries;
    d["n_stored"] = h.n_stored;
    d["total"] = h.total;
    d["bucket_bits"] = h.bucket_bits;
    d["n_buckets"] = L.n_buckets;
    d["record_size"] = L.stride;
    d["file_size"] = L.file_size;
    py::dict sections;
    sections["header"] = sec(0, ngst::kHeaderSize);
    sections["index"] = sec(L.index_off, L.index_size);
    sections["records"] = sec(L.records_off, L.records_size);
    sections["entries"] = sec(L.entries_off, L.entries_size);
    d["sections"] = sections;
    py::dict ck;
    ck["header"] = h.ck_header;
    ck["index"] = h.ck_index;
    ck["records"] = h.ck_records;
    ck["entries"] = h.ck_entries;
    d["checksums"] = ck;
    return d;
}

// The record of `ngram` or nullptr; the n-gram must have the table's size.
StaticTable::Ref static_find(const StaticTable& t, const Tokens& ngram) {
    const std::vector<token_t> v = ngram_arg(ngram);
    if (static_cast<int>(v.size()) != t.ngram_size())
        throw InputError("ngram: this table holds " + std::to_string(t.ngram_size()) + "-grams, got " +
                         std::to_string(v.size()) + " token ids");
    return t.find(v.data());
}

// (keys[K,n], offsets[K+1], tokens[M], counts[M], best_token[K], best_count[K], sum[K]) in
// table order, continuations by ascending token; copies, flagged read-only.
py::tuple static_arrays(const PyStatic& self) {
    const StaticTable& t = self.t;
    const auto K = static_cast<py::ssize_t>(t.n_keys());
    const auto M = static_cast<py::ssize_t>(t.n_entries());
    const int n = t.ngram_size();
    py::array_t<int32_t> keys({K, py::ssize_t(n)}), toks(M), cnts(M), btok(K);
    py::array_t<int64_t> offsets(K + 1), bcnt(K), sums(K);
    int32_t *kp = keys.mutable_data(), *tp = toks.mutable_data(), *cp = cnts.mutable_data(),
            *bt = btok.mutable_data();
    int64_t *op = offsets.mutable_data(), *bc = bcnt.mutable_data(), *sp = sums.mutable_data();
    {
        py::gil_scoped_release release;
        int64_t j = 0;
        op[0] = 0;
        for (py::ssize_t i = 0; i < K; ++i) {
            const StaticTable::Ref r = t.record(static_cast<uint64_t>(i));
            std::memcpy(kp + i * n, t.key_ptr(r), 4 * size_t(n));
            t.for_each_entry(r, [&](token_t tok, int64_t c) {
                if (j < M) {  // a damaged (unverified) table may hold more than its header says
                    tp[j] = tok;
                    cp[j] = static_cast<int32_t>(c);
                    ++j;
                }
            });
            op[i + 1] = j;
            bt[i] = t.best_token(r);
            bc[i] = t.best_count(r);
            sp[i] = t.sum(r);
        }
    }
    py::tuple out = py::make_tuple(keys, offsets, toks, cnts, btok, bcnt, sums);
    for (auto a : out) a.attr("flags").attr("writeable") = false;
    return out;
}

void register_static(py::module_& m) {
    py::class_<StaticPending>(m, "_StaticPending", "A built or opened table waiting for StaticTable().");

    m.def("_static_build", [](const Tokens& tokens, int ngram_size) {
        py::gil_scoped_release release;
        return StaticPending{StaticTable::build(tokens.data(), static_cast<size_t>(tokens.size()), ngram_size)};
    });
    m.def("_static_open", [](const std::string& path) {
        py::gil_scoped_release release;
        return StaticPending{StaticTable::open(path)};
    });
    m.def("_static_from_llama", [](const std::string& path, int ngram_size) {
        if (ngram_size != 0) StaticTable::check_n(ngram_size);
        py::gil_scoped_release release;
        return StaticPending{StaticTable::from_lookup_file(path, ngram_size)};
    });
    m.def("_static_from_bytes", [](const py::bytes& data, const std::string& name) {
        const std::string_view v = data;
        py::gil_scoped_release release;
        return StaticPending{StaticTable::from_image(v.data(), v.size(), name)};
    });
    m.def("_static_from_cache", [](const PyCache& cache, int ngram_size) {
        StaticTable::check_n(ngram_size);
        py::gil_scoped_release release;
        std::shared_lock l(cache.mutex);
        return StaticPending{StaticTable::from_cache(cache.cache, ngram_size)};
    });
    m.def("_static_header", [](const py::bytes& head, uint64_t file_size, const std::string& name) {
        std::string buf = head;
        buf.resize(ngst::kHeaderSize, '\0');  // a short file fails on its size before any read
        const ngst::Header h = ngst::decode_header(reinterpret_cast<const uint8_t*>(buf.data()), file_size, name);
        return header_dict(h, ngst::layout_of(h.ngram_size, h.bucket_bits, h.n_keys, h.n_stored));
    });

    m.def("_static_rechecksum", [](const py::bytes& image) {
        std::string buf = image;
        ngst::rewrite_checksums(reinterpret_cast<uint8_t*>(buf.data()), buf.size(), "<bytes>");
        return py::bytes(buf);
    });

    py::class_<PyStatic>(m, "StaticTable", "Immutable n-gram table (NGST file), opened in O(1) with mmap.")
        .def(py::init([](const StaticPending& p) { return PyStatic{p.t}; }))
        .def("__len__", [](const PyStatic& s) { return s.t.n_keys(); })
        .def("__contains__",
             [](const PyStatic& s, const Tokens& ngram) { return static_find(s.t, ngram) != nullptr; })
        .def_property_readonly("ngram_size", [](const PyStatic& s) { return s.t.ngram_size(); })
        .def_property_readonly("total", [](const PyStatic& s) { return s.t.total(); })
        .def_property_readonly("n_keys", [](const PyStatic& s) { return s.t.n_keys(); })
        .def_property_readonly("n_entries", [](const PyStatic& s) { return s.t.n_entries(); })
        .def_property_readonly("nbytes", [](const PyStatic& s) { return s.t.nbytes(); })
        .def_property_readonly("mapped", [](const PyStatic& s) { return s.t.mapped(); })
        .def_property_readonly("_name", [](const PyStatic& s) { return s.t.name(); })
        .def("_get",
             [](const PyStatic& s, const Tokens& ngram) {
                 py::dict d;
                 if (const StaticTable::Ref r = static_find(s.t, ngram))
                     s.t.for_each_entry(r, [&](token_t tok, int64_t c) { d[py::int_(tok)] = py::int_(c); });
                 return d;
             })
        .def("_best",
             [](const PyStatic& s, const Tokens& ngram) -> py::object {
                 const StaticTable::Ref r = static_find(s.t, ngram);
                 if (r == nullptr) return py::none();
                 return py::make_tuple(s.t.best_token(r), s.t.best_count(r), s.t.sum(r));
             })
        .def("_header", [](const PyStatic& s) { return header_dict(s.t.header(), s.t.layout()); })
        .def("_arrays", &static_arrays)
        .def("_save",
             [](const PyStatic& s, const std::string& path) {
                 py::gil_scoped_release release;
                 s.t.save(path);
             })
        .def("_verify",
             [](const PyStatic& s) {
                 py::gil_scoped_release release;
                 s.t.verify();
             })
        .def("_to_bytes",
             [](const PyStatic& s) {
                 return py::bytes(reinterpret_cast<const char*>(s.t.data()), s.t.nbytes());
             })
        .def("_to_llama_bytes",
             [](const PyStatic& s) {
                 std::vector<char> img;
                 {
                     py::gil_scoped_release release;
                     s.t.verify();  // an export must not spread damage: it is O(size) anyway
                     img = s.t.to_lookup();
                 }
                 return py::bytes(img.data(), img.size());
             })
        .def("_to_llama",
             [](const PyStatic& s, const std::string& path) {
                 py::gil_scoped_release release;
                 s.t.verify();
                 const std::vector<char> img = s.t.to_lookup();
                 write_file_atomic(path, img.data(), img.size());
             })
        .def("_into_cache",
             [](const PyStatic& s, PyCache& dst) {
                 // Through the lookup.bin image: its pair order (best token last) is what
                 // keeps the tie rule in the cache's first-seen order.
                 py::gil_scoped_release release;
                 s.t.verify();
                 const std::vector<char> img = s.t.to_lookup();
                 NgramCache fresh;
                 load_lookup(fresh, img.data(), img.size(), s.t.name());
                 std::unique_lock l(dst.mutex);
                 dst.cache.swap(fresh);
             });
}

// Calls f(static_source, cache_to_lock) for what `obj` stands for: None, an NgramCache
// (llama.cpp's loaded lookup.bin) or a 2-gram StaticTable (no lock: it is immutable).
template <class F>
void visit_static(const py::object& obj, F&& f) {
    if (obj.is_none()) {
        f(NoStatic{}, static_cast<const PyCache*>(nullptr));
    } else if (py::isinstance<PyCache>(obj)) {
        const PyCache* pc = obj.cast<const PyCache*>();
        f(CacheAsStatic{&pc->cache}, pc);
    } else if (py::isinstance<PyStatic>(obj)) {
        const StaticTable& t = obj.cast<const PyStatic&>().t;
        if (t.ngram_size() != kNgramStatic)
            throw InputError("static: drafting needs a table of 2-grams (llama.cpp's LLAMA_NGRAM_STATIC), this one holds " +
                             std::to_string(t.ngram_size()) + "-grams");
        f(t, static_cast<const PyCache*>(nullptr));
    } else {
        throw py::type_error("static must be an NgramCache, a StaticTable or None, got " +
                             std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
}
// ---- end static table (issue 4) --------------------------------------------------------

template <class Static>
size_t draft_with(const Tokens& tokens, size_t n_draft, int ngram_min, int ngram_max,
                  const PyCache& context, const PyCache* dynamic, const Static& st, token_t* out) {
    return draft(tokens.data(), static_cast<size_t>(tokens.size()), n_draft, ngram_min, ngram_max,
                 context.cache, dynamic ? &dynamic->cache : nullptr, st, out);
}

py::array_t<int32_t> draft_py(const Tokens& tokens, long long n_draft, const PyCache& context,
                              const PyCache* dynamic, py::object static_obj, int ngram_min,
                              int ngram_max) {
    if (n_draft < 0) throw InputError("n_draft must be >= 0, got " + std::to_string(n_draft));
    NgramCache::check_sizes(ngram_min, ngram_max);
    std::vector<token_t> out(static_cast<size_t>(n_draft));
    size_t n = 0;
    visit_static(static_obj, [&](const auto& st, const PyCache* static_cache) {
        py::gil_scoped_release release;
        std::shared_lock l1(context.mutex);
        std::shared_lock<std::shared_mutex> l2, l3;
        if (dynamic && dynamic != &context) l2 = std::shared_lock(dynamic->mutex);
        if (static_cache && static_cache != &context && static_cache != dynamic)
            l3 = std::shared_lock(static_cache->mutex);
        n = draft_with(tokens, out.size(), ngram_min, ngram_max, context, dynamic, st, out.data());
    });
    py::array_t<int32_t> result(static_cast<py::ssize_t>(n));
    if (n) std::memcpy(result.mutable_data(), out.data(), n * sizeof(int32_t));
    return result;
}

}  // namespace

// ---- stats / replay (issue 3) ------------------------------------------------------------
namespace replay_binding {

// Thrown from the progress callback when a Python error is pending (the callback raised,
// or Ctrl-C arrived); caught while the GIL is released and turned back into that error.
struct PythonErrorPending {};

py::dict result_dict(const ReplayResult& r) {
    auto vec = [](const std::vector<int64_t>& v) { return py::cast(v); };
    auto arr = [](const int64_t* p, size_t n) { return py::cast(std::vector<int64_t>(p, p + n)); };
    py::dict d;
    d["n_input"] = r.n_input;
    d["n_ctx"] = r.n_ctx;
    d["n_draft"] = r.n_draft;
    d["n_chunks"] = r.n_chunks;
    d["n_steps"] = r.n_steps;
    d["n_drafted"] = r.n_drafted;
    d["n_accept"] = r.n_accept;
    d["t_draft_ns"] = r.t_draft_ns;
    d["t_replay_ns"] = r.t_replay_ns;
    d["drafted_by_source"] = arr(r.drafted_by_source, kNumSources);
    d["accepted_by_source"] = arr(r.accepted_by_source, kNumSources);
    d["drafted_by_ngram"] = arr(r.drafted_by_ngram, kNgramMax);
    d["accepted_by_ngram"] = arr(r.accepted_by_ngram, kNgramMax);
    d["draft_length_hist"] = vec(r.draft_length_hist);
    d["accept_length_hist"] = vec(r.accept_length_hist);
    d["drafted_by_position"] = vec(r.drafted_by_position);
    d["accepted_by_position"] = vec(r.accepted_by_position);
    d["overlap_positions"] = r.overlap_positions;
    d["overlap_text"] = r.overlap_text;
    d["overlap_static"] = r.overlap_static;
    d["overlap_dynamic"] = r.overlap_dynamic;
    d["overlap_any"] = r.overlap_any;
    return d;
}

// The replay runs without the GIL. The dynamic cache it merges into is a private copy
// unless update_dynamic, in which case the caller's cache is locked for writing throughout.
py::dict replay_py(const Tokens& tokens, long long n_ctx, long long n_draft, py::object static_obj,
                   PyCache* dynamic, bool update_dynamic, py::object progress) {
    if (n_ctx < 2) throw InputError("n_ctx must be >= 2, got " + std::to_string(n_ctx));
    if (n_draft < 0) throw InputError("n_draft must be >= 0, got " + std::to_string(n_draft));
    if (update_dynamic && dynamic == nullptr)
        throw InputError("update_dynamic=True needs a dynamic cache");
    ReplayOptions opt;
    opt.n_ctx = static_cast<size_t>(n_ctx);
    opt.n_draft = static_cast<size_t>(n_draft);
    const bool has_progress = !progress.is_none();
    ReplayProgress cb = [&](int64_t done, int64_t total) {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw PythonErrorPending{};
        if (!has_progress) return;
        try {
            progress(done, total);
        } catch (py::error_already_set& e) {
            e.restore();
            throw PythonErrorPending{};
        }
    };
    ReplayResult result;
    bool python_error = false;
    visit_static(static_obj, [&](const auto& st, const PyCache* static_cache) {
        if (update_dynamic && static_cache == dynamic)
            throw InputError("the dynamic cache to update cannot also be the static cache");
        py::gil_scoped_release release;
        try {
            std::shared_lock<std::shared_mutex> ls;
            if (static_cache) ls = std::shared_lock(static_cache->mutex);
            if (update_dynamic) {
                std::unique_lock<std::shared_mutex> lw(dynamic->mutex, std::defer_lock);
                if (static_cache) {
                    // Both locks in one go, so that no other lock order can deadlock with us.
                    ls.unlock();
                    std::lock(lw, ls);
                } else {
                    lw.lock();
                }
                NgramCache& dyn = dynamic->cache;
                result = replay(tokens.data(), static_cast<size_t>(tokens.size()), opt, dyn, st, cb);
            } else {
                NgramCache dyn;
                if (dynamic) {
                    std::shared_lock<std::shared_mutex> lr;
                    if (dynamic != static_cache) lr = std::shared_lock(dynamic->mutex);
                    dyn.merge(dynamic->cache);  // into an empty cache: an order-keeping copy
                }
                result = replay(tokens.data(), static_cast<size_t>(tokens.size()), opt, dyn, st, cb);
            }
        } catch (const PythonErrorPending&) {
            python_error = true;
        }
    });
    if (python_error) throw py::error_already_set();
    return result_dict(result);
}

void register_replay(py::module_& m) {
    m.def("_replay", &replay_py, py::arg("tokens"), py::arg("n_ctx"), py::arg("n_draft"),
          py::arg("static").none(true), py::arg("dynamic").none(true),
          py::arg("update_dynamic") = false, py::arg("progress").none(true) = py::none());
}

}  // namespace replay_binding
// ---- end stats / replay (issue 3) --------------------------------------------------------

PYBIND11_MODULE(_core, m) {
    m.doc() = "ngramcache's compiled core (use the ngramcache package, not this module).";

    py::register_exception<FormatError>(m, "CacheFormatError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const InputError& e) {
            py::set_error(PyExc_ValueError, e.what());
        } catch (const FileNotFound& e) {
            py::set_error(PyExc_FileNotFoundError, e.what());
        } catch (const std::system_error& e) {
            // OSError(errno, msg) picks the matching subclass (IsADirectoryError, ...).
            py::object err = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.code().value(), e.what());
            PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
        }
    });

    py::class_<PyCache>(m, "NgramCache", "Mutable n-gram cache (llama.cpp's context/dynamic cache).")
        .def(py::init<>())
        .def("__len__", [](const PyCache& s) {
            std::shared_lock l(s.mutex);
            return s.cache.size();
        })
        .def("_update",
             [](PyCache& s, const Tokens& tokens, int ngram_min, int ngram_max, size_t nnew) {
                 NgramCache::check_sizes(ngram_min, ngram_max);
                 py::gil_scoped_release release;
                 std::unique_lock l(s.mutex);
                 s.cache.update(tokens.data(), static_cast<size_t>(tokens.size()), ngram_min,
                                ngram_max, nnew);
             })
        .def("_get",
             [](const PyCache& s, const Tokens& ngram) {
                 const std::vector<token_t> v = ngram_arg(ngram);
                 std::shared_lock l(s.mutex);
                 return part_to_dict(s.cache.find(key_of(v)));
             })
        .def("_merge",
             [](PyCache& s, const PyCache& other) {
                 py::gil_scoped_release release;
                 if (&s == &other) {
                     std::unique_lock l(s.mutex);
                     s.cache.merge(s.cache);
                     return;
                 }
                 // Lock in address order so that a.merge(b) and b.merge(a) cannot deadlock.
                 std::unique_lock<std::shared_mutex> lw(s.mutex, std::defer_lock);
                 std::shared_lock<std::shared_mutex> lr(other.mutex, std::defer_lock);
                 if (&s < &other) {
                     lw.lock();
                     lr.lock();
                 } else {
                     lr.lock();
                     lw.lock();
                 }
                 s.cache.merge(other.cache);
             })
        .def("_save",
             [](const PyCache& s, const std::string& path) {
                 py::gil_scoped_release release;
                 std::vector<char> img;
                 {
                     std::shared_lock l(s.mutex);
                     img = serialize_lookup(s.cache);
                 }
                 write_file_atomic(path, img.data(), img.size());
             })
        .def("_load_into",
             [](PyCache& s, const std::string& path) {
                 py::gil_scoped_release release;
                 const std::vector<char> buf = read_file(path);
                 NgramCache fresh;
                 load_lookup(fresh, buf.data(), buf.size(), path);
                 std::unique_lock l(s.mutex);
                 s.cache.swap(fresh);
             })
        .def("_load_bytes",
             [](PyCache& s, const py::bytes& data, const std::string& name) {
                 const std::string buf = data;
                 py::gil_scoped_release release;
                 NgramCache fresh;
                 load_lookup(fresh, buf.data(), buf.size(), name);
                 std::unique_lock l(s.mutex);
                 s.cache.swap(fresh);
             })
        .def("_to_bytes",
             [](const PyCache& s) {
                 std::vector<char> img;
                 {
                     py::gil_scoped_release release;
                     std::shared_lock l(s.mutex);
                     img = serialize_lookup(s.cache);
                 }
                 return py::bytes(img.data(), img.size());
             })
        .def("_arrays", &cache_arrays)
        .def("_clear",
             [](PyCache& s) {
                 std::unique_lock l(s.mutex);
                 s.cache.clear();
             })
        .def_property_readonly("nbytes", [](const PyCache& s) {
            std::shared_lock l(s.mutex);
            return s.cache.memory_bytes();
        });

    m.def("_draft", &draft_py, py::arg("tokens"), py::arg("n_draft"), py::arg("context"),
          py::arg("dynamic").none(true), py::arg("static").none(true), py::arg("ngram_min"),
          py::arg("ngram_max"));

    replay_binding::register_replay(m);  // stats (issue 3)
    register_static(m);                  // static table (issue 4)
}
