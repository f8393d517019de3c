// The only file that knows about Python: it converts arguments, releases the GIL while
// the core works and maps the core's errors to Python exceptions. The Python layer has
// validated every argument (ngramcache._validate) and passes token arrays as C-contiguous
// int32, which the core reads in place. Locking is the core's (shared_cache.hpp).
#include <pybind11/numpy.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "ngramcache/copy_drafter.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/prompt_lookup.hpp"
#include "ngramcache/lookup_drafter.hpp"
#include "ngramcache/lookup_file.hpp"
#include "ngramcache/ngram_map.hpp"
#include "ngramcache/ngram_mod.hpp"
#include "ngramcache/ngram_simple.hpp"
#include "ngramcache/sequence_adapter.hpp"
#include "ngramcache/sorted_runs.hpp"
#include "ngramcache/shared_cache.hpp"  // caches, drafting and replay under their locks
#include "ngramcache/static_table.hpp"
#include "ngramcache/suffix.hpp"

namespace py = pybind11;
using namespace py::literals;
using namespace ngramcache;

using Tokens = py::array_t<int32_t, py::array::c_style>;

namespace {

// Thrown from the progress callback when a Python error is pending (the callback raised,
// or Ctrl-C arrived); caught after the core has unwound and turned back into that error.
struct PythonErrorPending {};

size_t len(const Tokens& a) { return static_cast<size_t>(a.size()); }

// f() with the GIL released; what it returns becomes a Python object once the GIL is back.
template <class F>
auto nogil(F&& f) {
    py::gil_scoped_release release;
    return f();
}

py::bytes as_bytes(const std::vector<char>& v) { return py::bytes(v.data(), v.size()); }

// A core cache built without any lock, handed to Python as a new object.
SharedCache* new_cache(NgramCache& fresh) {
    auto* s = new SharedCache();
    s->unlocked().swap(fresh);
    return s;
}

StaticSource static_source(const py::object& obj) {
    if (obj.is_none()) return {};
    if (py::isinstance<SharedCache>(obj)) return {obj.cast<const SharedCache*>(), nullptr};
    if (py::isinstance<StaticTable>(obj)) return {nullptr, obj.cast<const StaticTable*>()};
    throw py::type_error("static must be a _core.NgramCache, a _core.StaticTable or None");
}

py::dict header_dict(const ngst::Header& h, const ngst::Layout& L) {
    auto sec = [](uint64_t off, uint64_t size) { return py::make_tuple(off, size); };
    return py::dict("magic"_a = "NGST", "version"_a = h.version, "byte_order"_a = "little",
                    "ngram_size"_a = h.ngram_size, "source"_a = ngst::source_name(h.source),
                    "n_keys"_a = h.n_keys, "n_entries"_a = h.n_entries, "n_stored"_a = h.n_stored,
                    "total"_a = h.total, "bucket_bits"_a = h.bucket_bits, "n_buckets"_a = L.n_buckets,
                    "record_size"_a = L.stride, "file_size"_a = L.file_size,
                    "sections"_a = py::dict("header"_a = sec(0, ngst::kHeaderSize),
                                            "index"_a = sec(L.index_off, L.index_size),
                                            "records"_a = sec(L.records_off, L.records_size),
                                            "entries"_a = sec(L.entries_off, L.entries_size)),
                    "checksums"_a = py::dict("header"_a = h.ck_header, "index"_a = h.ck_index,
                                             "records"_a = h.ck_records, "entries"_a = h.ck_entries));
}

// Exported under the lock without the GIL (see register_cache), then copied into arrays.
py::tuple cache_arrays(const SharedCache& s) {
    std::vector<int32_t> keys, toks, cnts;
    std::vector<int64_t> offsets;
    nogil([&] {
        s.read([&](const NgramCache& c) {
            keys.resize(c.size() * kNgramMax);
            offsets.resize(c.size() + 1);
            toks.resize(c.n_entries());
            cnts.resize(c.n_entries());
            c.export_arrays(keys.data(), offsets.data(), toks.data(), cnts.data());
        });
    });
    const auto n = static_cast<py::ssize_t>(offsets.size() - 1), m = static_cast<py::ssize_t>(toks.size());
    py::array_t<int32_t> k({n, py::ssize_t(kNgramMax)}), t(m), c(m);
    py::array_t<int64_t> o(n + 1);
    auto copy = [](auto& arr, const auto& v) {
        if (!v.empty()) std::memcpy(arr.mutable_data(), v.data(), v.size() * sizeof(v[0]));
    };
    copy(k, keys);
    copy(o, offsets);
    copy(t, toks);
    copy(c, cnts);
    return py::make_tuple(k, o, t, c);
}

// Copies, flagged read-only (the table itself is immutable).
py::tuple static_arrays(const StaticTable& t) {
    const auto k = static_cast<py::ssize_t>(t.n_keys()), m = static_cast<py::ssize_t>(t.n_entries());
    py::array_t<int32_t> keys({k, py::ssize_t(t.ngram_size())}), toks(m), cnts(m), btok(k);
    py::array_t<int64_t> offsets(k + 1), bcnt(k), sums(k);
    int32_t *kp = keys.mutable_data(), *tp = toks.mutable_data(), *cp = cnts.mutable_data(), *bt = btok.mutable_data();
    int64_t *op = offsets.mutable_data(), *bc = bcnt.mutable_data(), *sp = sums.mutable_data();
    nogil([&] { t.export_arrays(kp, op, tp, cp, bt, bc, sp); });
    py::tuple out = py::make_tuple(keys, offsets, toks, cnts, btok, bcnt, sums);
    for (auto a : out) a.attr("flags").attr("writeable") = false;
    return out;
}

py::array_t<int32_t> draft_py(const Tokens& tokens, size_t n_draft, const SharedCache& context,
                              const SharedCache* dynamic, const py::object& static_obj, int ngram_min,
                              int ngram_max) {
    const StaticSource st = static_source(static_obj);
    token_t small[64];  // a drafting step's usual size needs no allocation
    std::vector<token_t> big(n_draft > 64 ? n_draft : 0);
    token_t* out = n_draft > 64 ? big.data() : small;
    const size_t n = nogil([&] {
        return draft_shared(tokens.data(), len(tokens), n_draft, ngram_min, ngram_max, context, dynamic, st, out);
    });
    py::array_t<int32_t> result(static_cast<py::ssize_t>(n));
    if (n) std::memcpy(result.mutable_data(), out, n * sizeof(int32_t));
    return result;
}

// A replay's progress callback: it takes the GIL back to call Python and to let Ctrl-C
// stop the replay (the error is restored once the core has unwound).
ReplayProgress progress_callback(const py::object& progress) {
    return [&progress](int64_t done, int64_t total) {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) throw PythonErrorPending{};
        if (progress.is_none()) return;
        try {
            progress(done, total);
        } catch (py::error_already_set& e) {
            e.restore();
            throw PythonErrorPending{};
        }
    };
}

// The replay runs without the GIL; the progress callback takes it back to call Python
// and to let Ctrl-C stop the replay.
ReplayResult replay_py(const Tokens& tokens, size_t n_ctx, size_t n_draft, const py::object& static_obj,
                       SharedCache* dynamic, bool update_dynamic, const py::object& progress, bool llama_oob,
                       const std::optional<Tokens>& oob_reads) {
    ReplayOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_draft = n_draft;
    opt.llama_oob = llama_oob;
    if (oob_reads) {  // rows of (S[-2], S[-1], S[-1] once grown, S[-1] before 3), checked by the caller
        const Tokens& a = *oob_reads;
        if (a.ndim() != 2 || a.shape(1) != 4) throw std::invalid_argument("oob_reads must have shape (n_chunks, 4)");
        const int32_t* v = a.data();
        opt.oob_reads.resize(static_cast<size_t>(a.shape(0)));
        for (auto& r : opt.oob_reads) {
            r.before2[0] = v[0], r.before2[1] = v[1], r.before2_grown = v[2], r.before3 = v[3];
            v += 4;
        }
    }
    const StaticSource st = static_source(static_obj);
    const ReplayProgress cb = progress_callback(progress);
    try {
        py::gil_scoped_release release;
        return replay_shared(tokens.data(), len(tokens), opt, st, dynamic, update_dynamic, cb);
    } catch (const PythonErrorPending&) {
        throw py::error_already_set();
    }
}

void register_errors(py::module_& m) {
    py::register_exception<FormatError>(m, "CacheFormatError", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const InputError& e) {
            py::set_error(PyExc_ValueError, e.what());
        } catch (const PathError& e) {
            // OSError(errno, message, path) picks the subclass and sets .filename (decoded
            // as os.fsdecode would, so that a name that is not UTF-8 survives).
            py::object path = py::reinterpret_steal<py::object>(
                PyUnicode_DecodeFSDefaultAndSize(e.path().data(), static_cast<Py_ssize_t>(e.path().size())));
            py::object err = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.err(), e.message(), path);
            PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
        } catch (const FileNotFound& e) {
            py::set_error(PyExc_FileNotFoundError, e.what());
        } catch (const std::system_error& e) {
            // OSError(errno, msg) picks the matching subclass (IsADirectoryError, ...).
            py::object err = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.code().value(), e.what());
            PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
        }
    });
}

// The one way Python saves a file: files.atomic_open writes to `fd` and commits or aborts.
void register_atomic_file(py::module_& m) {
    py::class_<AtomicFile>(m, "AtomicFile", "One atomic save of one file (see atomic_file.hpp).")
        .def(py::init<const std::string&, bool>(), "path"_a, "named_temp"_a = false,
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("fd", &AtomicFile::fd)
        .def_property_readonly("target", [](const AtomicFile& f) { return py::bytes(f.target()); })
        .def_property_readonly("temp_name", [](const AtomicFile& f) { return py::bytes(f.temp_name()); })
        .def("commit", &AtomicFile::commit, py::call_guard<py::gil_scoped_release>())
        .def("abort", &AtomicFile::abort);
}

void register_cache(py::module_& m) {
    py::class_<SharedCache>(m, "NgramCache", "Mutable n-gram cache (llama.cpp's context/dynamic cache).")
        .def(py::init<>())
        // Every lock is taken without the GIL: a replay holding this cache's lock takes the
        // GIL back for its progress callback, and waiting for the lock with the GIL held
        // would leave both waiting forever.
        .def("__len__", [](const SharedCache& s) {
            return nogil([&] { return s.read([](const NgramCache& c) { return c.size(); }); });
        })
        .def_property_readonly("nbytes", [](const SharedCache& s) {
            return nogil([&] { return s.read([](const NgramCache& c) { return c.memory_bytes(); }); });
        })
        .def_property(
            "max_bytes",
            [](const SharedCache& s) {
                return nogil([&] { return s.read([](const NgramCache& c) { return c.max_bytes(); }); });
            },
            [](SharedCache& s, size_t bytes) {
                nogil([&] { s.write([&](NgramCache& c) { c.set_max_bytes(bytes); }); });
            })
        .def_property_readonly("evicted", [](const SharedCache& s) {
            return nogil([&] { return s.read([](const NgramCache& c) { return c.evicted(); }); });
        })
        .def_property_readonly("estimated_bytes", [](const SharedCache& s) {
            return nogil([&] { return s.read([](const NgramCache& c) { return c.estimated_bytes(); }); });
        })
        .def("update",
             [](SharedCache& s, const Tokens& tokens, int ngram_min, int ngram_max, size_t nnew) {
                 py::gil_scoped_release release;
                 s.write([&](NgramCache& c) { c.update(tokens.data(), len(tokens), ngram_min, ngram_max, nnew); });
             })
        .def("get",
             [](const SharedCache& s, const Tokens& ngram) {
                 const Ngram key = Ngram::checked(ngram.data(), len(ngram));
                 std::vector<Entry> entries;
                 nogil([&] {
                     s.read([&](const NgramCache& c) {
                         if (const Part* part = c.find(key)) entries.assign(part->begin(), part->end());
                     });
                 });
                 py::dict d;
                 for (const Entry& e : entries) d[py::int_(e.token)] = py::int_(e.count);
                 return d;
             })
        .def("merge",
             [](SharedCache& s, const SharedCache& other) {
                 py::gil_scoped_release release;
                 merge_shared(s, other);
             })
        .def("clear", [](SharedCache& s) { nogil([&] { s.write([](NgramCache& c) { c.clear(); }); }); })
        .def("arrays", &cache_arrays)
        .def("to_bytes", [](const SharedCache& s) { return as_bytes(nogil([&] { return s.read(serialize_lookup); })); })
        .def("save",
             [](const SharedCache& s, const std::string& path) {
                 py::gil_scoped_release release;
                 const std::vector<char> img = s.read(serialize_lookup);
                 write_file_atomic(path, img.data(), img.size());
             })
        .def_static(
            "load",
            [](const std::string& path) {
                NgramCache fresh;
                nogil([&] { load_lookup_file(fresh, path); });
                return new_cache(fresh);
            },
            py::return_value_policy::take_ownership)
        .def_static(
            "from_bytes",
            [](const py::bytes& data, const std::string& name) {
                const std::string_view v = data;
                NgramCache fresh;
                nogil([&] { load_lookup(fresh, v.data(), v.size(), name); });
                return new_cache(fresh);
            },
            py::return_value_policy::take_ownership);
}

void register_static(py::module_& m) {
    // Immutable, so no lock: any number of threads may use a table at once.
    py::class_<StaticTable>(m, "StaticTable", "Immutable n-gram table (NGST file), opened in O(1) with mmap.")
        .def_static("build",
                    [](const Tokens& tokens, int ngram_size) {
                        py::gil_scoped_release release;
                        return StaticTable::build(tokens.data(), len(tokens), ngram_size);
                    })
        .def_static("open",
                    [](const std::string& path) {
                        py::gil_scoped_release release;
                        return StaticTable::open(path);
                    })
        .def_static("from_lookup_file",
                    [](const std::string& path, int ngram_size) {
                        py::gil_scoped_release release;
                        return StaticTable::from_lookup_file(path, ngram_size);
                    })
        .def_static("from_image",
                    [](const py::bytes& data, const std::string& name) {
                        const std::string_view v = data;
                        py::gil_scoped_release release;
                        return StaticTable::from_image(v.data(), v.size(), name);
                    })
        .def_static("from_cache",
                    [](const SharedCache& cache, int ngram_size) {
                        py::gil_scoped_release release;
                        return cache.read([&](const NgramCache& c) { return StaticTable::from_cache(c, ngram_size); });
                    })
        .def("__len__", &StaticTable::n_keys)
        .def_property_readonly("ngram_size", &StaticTable::ngram_size)
        .def_property_readonly("total", &StaticTable::total)
        .def_property_readonly("n_keys", &StaticTable::n_keys)
        .def_property_readonly("n_entries", &StaticTable::n_entries)
        .def_property_readonly("nbytes", &StaticTable::nbytes)
        .def_property_readonly("mapped", &StaticTable::mapped)
        .def_property_readonly("name", &StaticTable::name)
        .def("__contains__",
             [](const StaticTable& t, const Tokens& ngram) { return t.find(ngram.data(), len(ngram)) != nullptr; })
        .def("get",
             [](const StaticTable& t, const Tokens& ngram) {
                 py::dict d;
                 if (const StaticTable::Ref r = t.find(ngram.data(), len(ngram)))
                     t.for_each_entry(r, [&](token_t tok, int64_t c) { d[py::int_(tok)] = py::int_(c); });
                 return d;
             })
        .def("best",
             [](const StaticTable& t, const Tokens& ngram) -> py::object {
                 const StaticTable::Ref r = t.find(ngram.data(), len(ngram));
                 if (r == nullptr) return py::none();
                 return py::make_tuple(t.best_token(r), t.best_count(r), t.sum(r));
             })
        .def("header", [](const StaticTable& t) { return header_dict(t.header(), t.layout()); })
        .def("arrays", &static_arrays)
        .def("to_bytes",
             [](const StaticTable& t) { return py::bytes(reinterpret_cast<const char*>(t.data()), t.nbytes()); })
        .def("save", &StaticTable::save, py::call_guard<py::gil_scoped_release>())
        .def("verify", &StaticTable::verify, py::call_guard<py::gil_scoped_release>())
        .def("save_lookup", &StaticTable::save_lookup, py::call_guard<py::gil_scoped_release>())
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

    m.def("read_header", [](const py::bytes& head, uint64_t file_size, const std::string& name) {
        std::string buf = head;
        buf.resize(ngst::kHeaderSize, '\0');  // a short file fails on its size before any read
        const ngst::Header h = ngst::decode_header(reinterpret_cast<const uint8_t*>(buf.data()), file_size, name);
        return header_dict(h, ngst::layout_of(h.ngram_size, h.bucket_bits, h.n_keys, h.n_stored));
    });
    m.def("_static_rechecksum", [](const py::bytes& image) {  // for tests: damage that passes the checksums
        std::string buf = image;
        ngst::rewrite_checksums(reinterpret_cast<uint8_t*>(buf.data()), buf.size(), "<bytes>");
        return py::bytes(buf);
    });
}

void register_replay(py::module_& m) {
    py::class_<ReplayResult> r(m, "ReplayResult", "What replay() counted (see ngramcache.ReplayStats).");
    r.def_readonly("n_input", &ReplayResult::n_input).def_readonly("n_ctx", &ReplayResult::n_ctx)
        .def_readonly("n_draft", &ReplayResult::n_draft).def_readonly("n_chunks", &ReplayResult::n_chunks)
        .def_readonly("n_steps", &ReplayResult::n_steps).def_readonly("n_drafted", &ReplayResult::n_drafted)
        .def_readonly("n_accept", &ReplayResult::n_accept).def_readonly("t_draft_ns", &ReplayResult::t_draft_ns)
        .def_readonly("t_replay_ns", &ReplayResult::t_replay_ns)
        .def_readonly("draft_length_hist", &ReplayResult::draft_length_hist)
        .def_readonly("accept_length_hist", &ReplayResult::accept_length_hist)
        .def_readonly("drafted_by_position", &ReplayResult::drafted_by_position)
        .def_readonly("accepted_by_position", &ReplayResult::accepted_by_position)
        .def_readonly("overlap_positions", &ReplayResult::overlap_positions)
        .def_readonly("overlap_text", &ReplayResult::overlap_text)
        .def_readonly("overlap_static", &ReplayResult::overlap_static)
        .def_readonly("overlap_dynamic", &ReplayResult::overlap_dynamic)
        .def_readonly("overlap_any", &ReplayResult::overlap_any);
    // The fixed-size counters, as lists like the others.
    auto fixed = [&r](const char* name, auto member) {
        r.def_property_readonly(name, [member](const ReplayResult& x) {
            const auto& a = x.*member;
            return std::vector<int64_t>(std::begin(a), std::end(a));
        });
    };
    fixed("drafted_by_source", &ReplayResult::drafted_by_source);
    fixed("accepted_by_source", &ReplayResult::accepted_by_source);
    fixed("drafted_by_ngram", &ReplayResult::drafted_by_ngram);
    fixed("accepted_by_ngram", &ReplayResult::accepted_by_ngram);

    m.def("replay", &replay_py, "tokens"_a, "n_ctx"_a, "n_draft"_a, "static"_a.none(true), "dynamic"_a.none(true),
          "update_dynamic"_a, "progress"_a.none(true), "llama_oob"_a = true, "oob_reads"_a = py::none());
}

// ---------------------------------------------------------------------------------
// Drafters of the sequence protocol (drafter_replay.hpp): every one gets the same Python
// face, so the Python layer wraps them all alike. The per-step calls keep the GIL (they
// take microseconds, and a drafter's own state must not be touched by two threads at
// once); replay_drafter releases it for the whole loop and marks the drafter busy, so a
// call from another thread meanwhile is a RuntimeError rather than a data race.

template <class D>
struct Bound {
    template <class... A>
    explicit Bound(A&&... a) : d(std::forward<A>(a)...) {}
    D d;
    std::atomic<bool> busy{false};

    // For calls that keep the GIL and do not touch a lock: refused during a replay.
    D& use() {
        if (busy.load(std::memory_order_acquire))
            throw std::runtime_error("this drafter is in use by another thread");
        return d;
    }

    // Exclusive use for a call that releases the GIL (a step, or a whole replay).
    struct Claim {
        explicit Claim(Bound& b) : f(b.busy) {
            bool expected = false;
            if (!f.compare_exchange_strong(expected, true, std::memory_order_acq_rel))
                throw std::runtime_error("this drafter is in use by another thread");
        }
        ~Claim() { f.store(false, std::memory_order_release); }
        Claim(const Claim&) = delete;
        Claim& operator=(const Claim&) = delete;
        std::atomic<bool>& f;
    };
};

// A step releases the GIL: a drafter may wait for a cache's lock (the copy drafter's
// caches), and a thread holding that lock may be waiting for the GIL (a replay's progress).
template <class D>
py::class_<Bound<D>> bind_sequence_drafter(py::module_& m, const char* name, const char* doc) {
    using B = Bound<D>;
    py::class_<B> c(m, name, doc);
    c.def("reset", [](B& b, const Tokens& t) {
            typename B::Claim claim(b);
            nogil([&] { b.d.reset(t.data(), len(t)); });
        }, "prompt"_a)
        .def("accept", [](B& b, const Tokens& t) {
            typename B::Claim claim(b);
            nogil([&] { b.d.accept(t.data(), len(t)); });
        }, "tokens"_a)
        .def("propose", [](B& b, size_t n_max) {
            typename B::Claim claim(b);
            token_t small[64];
            std::vector<token_t> big(n_max > 64 ? n_max : 0);
            token_t* out = n_max > 64 ? big.data() : small;
            const size_t n = nogil([&] { return std::min(b.d.propose(n_max, out), n_max); });
            py::array_t<int32_t> result(static_cast<py::ssize_t>(n));
            if (n) std::memcpy(result.mutable_data(), out, n * sizeof(int32_t));
            return result;
        }, "n_max"_a)
        .def_property_readonly("confidence", [](B& b) { return b.use().confidence(); },
                               "The last proposal's confidence (a match length), for the adaptive gate.");
    m.def("replay_drafter", [](B& b, const Tokens& tokens, size_t n_ctx, size_t n_draft, const py::object& progress) {
        typename B::Claim claim(b);
        ReplayOptions opt;
        opt.n_ctx = n_ctx;
        opt.n_draft = n_draft;
        const ReplayProgress cb = progress_callback(progress);
        try {
            py::gil_scoped_release release;
            return replay_drafter(b.d, tokens.data(), len(tokens), opt, cb);
        } catch (const PythonErrorPending&) {
            throw py::error_already_set();
        }
    }, "drafter"_a, "tokens"_a, "n_ctx"_a, "n_draft"_a, "progress"_a.none(true));
    return c;
}

void register_drafter_replay(py::module_& m) {
    py::class_<DrafterReplayResult> r(m, "DrafterReplayResult", "What replay_drafter() counted.");
    r.def_readonly("n_input", &DrafterReplayResult::n_input).def_readonly("n_ctx", &DrafterReplayResult::n_ctx)
        .def_readonly("n_draft", &DrafterReplayResult::n_draft).def_readonly("n_chunks", &DrafterReplayResult::n_chunks)
        .def_readonly("n_steps", &DrafterReplayResult::n_steps)
        .def_readonly("n_drafted", &DrafterReplayResult::n_drafted)
        .def_readonly("n_accept", &DrafterReplayResult::n_accept)
        .def_readonly("t_draft_ns", &DrafterReplayResult::t_draft_ns)
        .def_readonly("t_replay_ns", &DrafterReplayResult::t_replay_ns)
        .def_readonly("draft_length_hist", &DrafterReplayResult::draft_length_hist)
        .def_readonly("accept_length_hist", &DrafterReplayResult::accept_length_hist)
        .def_readonly("drafted_by_position", &DrafterReplayResult::drafted_by_position)
        .def_readonly("accepted_by_position", &DrafterReplayResult::accepted_by_position);
}

// Each drafter's binding: its constructor and anything beyond the protocol.
void register_sequence_drafters(py::module_& m) {
    register_drafter_replay(m);
    // (drafters are registered here)
    {
        // llama.cpp's ngram-simple, ngram-map-k/k4v and ngram-mod (ngramcache.speculative).
        // The llama.cpp-shaped classes keep the GIL: a call takes microseconds, and one
        // object's state must not be touched by two threads at once; the NgramModTable they
        // may share is safe without it (relaxed atomic slots, ngram_mod.hpp).
        auto llama_shaped = [](auto& c) {
            using D = typename std::decay_t<decltype(c)>::type;
            c.def("sync", [](D& d, const Tokens& t) { d.sync(t.data(), len(t)); }, "prompt"_a,
                  "The history becomes the prompt (one comparison with the copy, then the new tail).")
                .def("extend", [](D& d, const Tokens& t, size_t start) {
                    // t = prompt[start:]; the prompt's first `start` tokens are the caller's word
                    const auto& h = d.history();
                    if (start > h.size() || start + len(t) < h.size()) return false;
                    const size_t overlap = h.size() - start;
                    if (overlap && std::memcmp(h.data() + start, t.data(), overlap * sizeof(token_t)) != 0)
                        return false;
                    d.append(t.data() + overlap, len(t) - overlap);
                    return true;
                }, "tokens"_a, "start"_a,
                     "Append tokens[len(history)-start:] if tokens[:len(history)-start] repeat the history's "
                     "tail from `start`; False (nothing changed) otherwise.")
                .def("begin", [](D& d) { d.begin(); }, "llama.cpp's begin() with the history as the prompt.")
                .def("draft", [](D& d, token_t id_last) {
                    std::vector<token_t> out;
                    d.draft(id_last, out);
                    return py::array_t<int32_t>(static_cast<py::ssize_t>(out.size()), out.data());
                }, "id_last"_a, "llama.cpp's draft() with the history as the prompt.")
                .def("accept", [](D& d, size_t n) { d.accept(n); }, "n_accepted"_a)
                .def_property_readonly("n_tokens", [](const D& d) { return d.history().size(); });
        };
        py::class_<NgramSimple> simple(m, "NgramSimple", "llama.cpp's ngram-simple drafter.");
        simple.def(py::init<size_t, size_t>(), "size_n"_a = 12, "size_m"_a = 48);
        llama_shaped(simple);
        py::class_<NgramMap> map(m, "NgramMap", "llama.cpp's ngram-map-k (k4v=False) and ngram-map-k4v drafters.");
        map.def(py::init<size_t, size_t, size_t, bool>(), "size_n"_a = 12, "size_m"_a = 48, "min_hits"_a = 1,
                "k4v"_a = false)
            .def_property_readonly("n_keys", [](const NgramMap& d) { return d.keys().size(); });
        llama_shaped(map);
        py::class_<NgramModTable, std::shared_ptr<NgramModTable>>(m, "NgramModTable",
                                                                  "ngram-mod's hash table, shareable by drafters and threads.")
            .def(py::init<size_t>(), "size"_a = NgramModTable::kDefaultSize)
            .def("entries", [](const NgramModTable& t) {
                py::array_t<int32_t> out(static_cast<py::ssize_t>(t.size()));
                int32_t* p = out.mutable_data();
                nogil([&] { t.export_entries(p); });
                return out;
            })
            .def("set_entries", [](NgramModTable& t, const Tokens& a) {
                if (len(a) != t.size())
                    throw InputError("expected " + std::to_string(t.size()) + " slots, got " + std::to_string(len(a)));
                nogil([&] { t.import_entries(a.data()); });
            }, "entries"_a)
            .def_property_readonly("size", &NgramModTable::size)
            .def_property_readonly("nbytes", &NgramModTable::nbytes)
            .def_property_readonly("used", &NgramModTable::used)
            .def_property_readonly("resets", &NgramModTable::resets)
            .def("get", [](const NgramModTable& t, const Tokens& ngram) { return t.get(ngram.data(), len(ngram)); },
                 "ngram"_a)
            .def("reset", [](NgramModTable& t) {
                py::gil_scoped_release release;
                t.reset();
            });
        py::class_<NgramMod> mod(m, "NgramMod", "llama.cpp's ngram-mod drafter.");
        mod.def(py::init([](std::shared_ptr<NgramModTable> t, size_t n_match, size_t n_min, size_t n_max) {
                    return new NgramMod(std::move(t), n_match, n_min, n_max);
                }),
                "table"_a.none(true), "n_match"_a = 24, "n_min"_a = 48, "n_max"_a = 64)
            .def_property_readonly("table", [](const NgramMod& d) { return d.table(); })
            .def_property_readonly("n_low", &NgramMod::n_low)
            .def_property_readonly("i_last", &NgramMod::i_last);
        llama_shaped(mod);
        using SimpleSeq = SequenceAdapter<NgramSimple>;
        using MapSeq = SequenceAdapter<NgramMap>;
        using ModSeq = SequenceAdapter<NgramMod>;
        bind_sequence_drafter<SimpleSeq>(m, "NgramSimpleSequence", "ngram-simple over the sequence protocol.")
            .def(py::init([](size_t n, size_t mm) { return new Bound<SimpleSeq>(n, mm); }), "size_n"_a = 12,
                 "size_m"_a = 48);
        bind_sequence_drafter<MapSeq>(m, "NgramMapSequence", "ngram-map-k/k4v over the sequence protocol.")
            .def(py::init([](size_t n, size_t mm, size_t hits, bool k4v) { return new Bound<MapSeq>(n, mm, hits, k4v); }),
                 "size_n"_a = 12, "size_m"_a = 48, "min_hits"_a = 1, "k4v"_a = false);
        bind_sequence_drafter<ModSeq>(m, "NgramModSequence", "ngram-mod over the sequence protocol.")
            .def(py::init([](std::shared_ptr<NgramModTable> t, size_t n_match, size_t n_min, size_t n_max) {
                     return new Bound<ModSeq>(std::move(t), n_match, n_min, n_max);
                 }),
                 "table"_a.none(true), "n_match"_a = 24, "n_min"_a = 48, "n_max"_a = 64);
    }
    {
        using B = Bound<CopyDrafter>;
        bind_sequence_drafter<CopyDrafter>(m, "CopyDrafter",
                                           "Copies of earlier spans of the sequence, else llama.cpp's lookup.")
            .def(py::init([](SharedCache* context, const SharedCache* dynamic, const py::object& static_obj,
                             int ngram_min, int ngram_max, size_t min_match, size_t max_match, size_t max_candidates) {
                     CopyOptions o;
                     o.ngram_min = ngram_min;
                     o.ngram_max = ngram_max;
                     o.min_match = min_match;
                     o.max_match = max_match;
                     o.max_candidates = max_candidates;
                     return new B(o, dynamic, static_source(static_obj), context);
                 }),
                 "context"_a.none(true), "dynamic"_a.none(true), "static"_a.none(true), "ngram_min"_a = 1,
                 "ngram_max"_a = 4, "min_match"_a = 2, "max_match"_a = 32, "max_candidates"_a = 8,
                 // the caches are read (and the context written) through pointers
                 py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::keep_alive<1, 4>())
            .def_property_readonly("source", [](B& b) { return b.use().source(); },
                                   "Where the last proposal came from: 1 a copy, 0 the lookup caches.")
            .def("set_dynamic", [](B& b, const SharedCache* dynamic) { b.use().set_dynamic(dynamic); },
                 "dynamic"_a.none(true), py::keep_alive<1, 2>())
            .def("index", [](B& b) {
                const CopyDrafter& d = b.use();
                const auto& seq = d.tokens();
                const size_t m = d.options().min_match;
                py::dict out;
                d.for_each_indexed([&](size_t pos) {
                    py::tuple key(m);
                    for (size_t i = 0; i < m; ++i) key[i] = py::int_(seq[pos + 1 - m + i]);
                    if (!out.contains(key)) out[key] = py::list();
                    out[key].cast<py::list>().append(pos);
                });
                return out;
            }, "Every indexed position by its min_match-gram, oldest first (for tests).");
    }
    bind_sequence_drafter<LookupDrafter>(m, "LookupDrafter",
                                         "llama.cpp's lookup: the context cache, then dynamic, then static.")
        .def(py::init([](SharedCache* context, const SharedCache* dynamic, const py::object& static_obj,
                         int ngram_min, int ngram_max) {
                 return new Bound<LookupDrafter>(ngram_min, ngram_max, dynamic, static_source(static_obj), context);
             }),
             "context"_a.none(true), "dynamic"_a.none(true), "static"_a.none(true), "ngram_min"_a = 1,
             "ngram_max"_a = 4, py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::keep_alive<1, 4>())
        .def("set_dynamic", [](Bound<LookupDrafter>& b, const SharedCache* dynamic) { b.use().set_dynamic(dynamic); },
             "dynamic"_a.none(true), py::keep_alive<1, 2>());
    bind_sequence_drafter<PromptLookupDrafter>(m, "PromptLookupDrafter",
                                               "Plain prompt lookup (Hugging Face, llama-cpp-python, vLLM).")
        .def(py::init([](int max_ngram, int min_ngram, bool recent) {
                 return new Bound<PromptLookupDrafter>(
                     max_ngram, min_ngram, recent ? PromptLookupDrafter::Match::recent : PromptLookupDrafter::Match::first);
             }),
             "max_ngram"_a = 3, "min_ngram"_a = 1, "recent"_a = false);
    // Shared by drafters (shared_ptr): adds and evictions take its lock exclusively,
    // proposals share it; the GIL is released around adds, which cost O(max_depth) a token.
    py::class_<SuffixStore, std::shared_ptr<SuffixStore>>(m, "SuffixStore",
                                                          "Earlier requests' tokens for SuffixDrafter.")
        .def(py::init<size_t, size_t>(), "max_tokens"_a = 1000000, "max_depth"_a = 64)
        .def("add", [](SuffixStore& s, const Tokens& t) {
            py::gil_scoped_release release;
            s.add(t.data(), len(t));
        }, "tokens"_a)
        .def("clear", [](SuffixStore& s) {
            py::gil_scoped_release release;
            s.clear();
        })
        .def("requests", [](const SuffixStore& s) {
            const auto reqs = nogil([&] { return s.requests(); });
            py::list out;
            for (const auto& r : reqs) {
                py::array_t<int32_t> a(static_cast<py::ssize_t>(r.size()));
                if (!r.empty()) std::memcpy(a.mutable_data(), r.data(), r.size() * sizeof(int32_t));
                out.append(a);
            }
            return out;
        })
        .def_property_readonly("n_tokens", &SuffixStore::n_tokens)
        .def_property_readonly("n_requests", &SuffixStore::n_requests)
        .def_property_readonly("n_nodes", &SuffixStore::n_nodes)
        .def_property_readonly("nbytes", &SuffixStore::memory_bytes)
        .def_property_readonly("max_tokens", &SuffixStore::max_tokens)
        .def_property_readonly("max_depth", &SuffixStore::max_depth);
    bind_sequence_drafter<SuffixDrafter>(m, "SuffixDrafter",
                                         "Most frequent continuation of the longest suffix match (SuffixDecoding).")
        .def(py::init([](size_t max_depth, double alpha, double min_prob, std::shared_ptr<SuffixStore> store) {
                 return new Bound<SuffixDrafter>(max_depth, alpha, min_prob, std::move(store));
             }),
             "max_depth"_a, "alpha"_a, "min_prob"_a, "store"_a.none(true))
        .def("finish", [](Bound<SuffixDrafter>& b) { b.use().finish(); })
        .def_property_readonly("n_nodes", [](Bound<SuffixDrafter>& b) { return b.use().n_nodes(); })
        .def_property_readonly("nbytes", [](Bound<SuffixDrafter>& b) { return b.use().memory_bytes(); });
}

// -- sorted runs and their streaming merge (ngramcache.sharded) ------------------------

void register_sorted_runs(py::module_& m) {
    using runs::TokenStretch;
    auto run_bytes = [](const std::vector<uint8_t>& v) {
        return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
    };
    m.def("run_from_tokens",
          [run_bytes](const std::vector<std::tuple<Tokens, uint64_t, size_t, uint64_t>>& stretches, int ngram_size) {
              std::vector<TokenStretch> s;
              for (const auto& [tokens, rank, first_target, first_position] : stretches)
                  s.push_back(TokenStretch{tokens.data(), len(tokens), rank, first_target, first_position});
              return run_bytes(nogil([&] { return runs::run_from_tokens(s, ngram_size); }));
          },
          "stretches"_a, "ngram_size"_a);
    m.def("save_run_from_cache",
          [](const SharedCache& cache, uint64_t rank, bool llama_order, const std::string& path) {
              nogil([&] {
                  std::vector<runs::RunEntry> entries =
                      cache.read([&](const NgramCache& c) { return runs::cache_entries(c, rank, llama_order); });
                  runs::save_run(entries, path);
                  return 0;
              });
          },
          "cache"_a, "rank"_a, "llama_order"_a, "path"_a);
    m.def("merge_runs_ngst",
          [](const std::vector<std::string>& paths, const std::string& out, int ngram_size, bool from_tokens,
             size_t block_entries) {
              runs::MergeCounts c;
              nogil([&] {
                  const ngst::Image img = runs::merge_to_ngst(
                      paths, ngram_size, from_tokens ? ngst::Source::tokens : ngst::Source::cache,
                      from_tokens ? runs::BestRule::tokens : runs::BestRule::cache, block_entries, c);
                  write_file_atomic(out, img.bytes.get(), img.size);
                  return 0;
              });
              return py::make_tuple(c.keys, c.entries, c.total);
          },
          "paths"_a, "out"_a, "ngram_size"_a, "from_tokens"_a, "block_entries"_a);
    m.def("merge_runs_lookup",
          [](const std::vector<std::string>& paths, const std::string& out, const std::string& spool,
             size_t block_entries) {
              const runs::MergeCounts c = nogil([&] { return runs::merge_to_lookup(paths, out, spool, block_entries); });
              return py::make_tuple(c.keys, c.entries, c.total);
          },
          "paths"_a, "out"_a, "spool"_a, "block_entries"_a);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "ngramcache's compiled core (use the ngramcache package, not this module).";
    register_errors(m);
    register_atomic_file(m);
    register_cache(m);
    register_static(m);
    register_replay(m);
    register_sequence_drafters(m);
    register_sorted_runs(m);
    m.def("draft", &draft_py, "tokens"_a, "n_draft"_a, "context"_a, "dynamic"_a.none(true), "static"_a.none(true),
          "ngram_min"_a, "ngram_max"_a);
}
