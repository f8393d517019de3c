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
}
