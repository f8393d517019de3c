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
    const PyCache* static_cache = nullptr;
    if (!static_obj.is_none()) {
        if (!py::isinstance<PyCache>(static_obj))
            throw py::type_error("static must be an NgramCache or None");
        static_cache = static_obj.cast<const PyCache*>();
    }
    std::vector<token_t> out(static_cast<size_t>(n_draft));
    size_t n = 0;
    {
        py::gil_scoped_release release;
        std::shared_lock l1(context.mutex);
        std::shared_lock<std::shared_mutex> l2, l3;
        if (dynamic && dynamic != &context) l2 = std::shared_lock(dynamic->mutex);
        if (static_cache && static_cache != &context && static_cache != dynamic)
            l3 = std::shared_lock(static_cache->mutex);
        if (static_cache)
            n = draft_with(tokens, out.size(), ngram_min, ngram_max, context, dynamic,
                           CacheAsStatic{&static_cache->cache}, out.data());
        else
            n = draft_with(tokens, out.size(), ngram_min, ngram_max, context, dynamic, NoStatic{},
                           out.data());
    }
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

// Calls f(static) with the static source `obj` stands for: None, an NgramCache (a loaded
// lookup.bin) or a StaticTable.
template <class F>
void with_static(const py::object& obj, F&& f) {
    if (obj.is_none()) {
        f(NoStatic{}, static_cast<const PyCache*>(nullptr));
    } else if (py::isinstance<PyCache>(obj)) {
        const PyCache* pc = obj.cast<const PyCache*>();
        f(CacheAsStatic{&pc->cache}, pc);
    } else {
        throw py::type_error("static must be an NgramCache, a StaticTable or None, got " +
                             std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
}

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
    with_static(static_obj, [&](const auto& st, const PyCache* static_cache) {
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
            py::set_error(PyExc_OSError, e.what());
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
}
