// What every file of the binding shares: the token array type, the conversions between
// the core's buffers and Python objects, running the core without the GIL, and the
// progress callback of the long calls. The Python layer has validated every argument
// (ngramcache._validate) and passes token arrays as C-contiguous int32, which the core
// reads in place. The core decides everything else, locking included (shared_cache.hpp).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "ngramcache/ngram.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/shared_cache.hpp"

namespace ngramcache_bind {

namespace py = pybind11;
using namespace py::literals;
using ngramcache::token_t;

using Tokens = py::array_t<int32_t, py::array::c_style>;

// Types that only shape the signatures pybind11 writes, from which the stub _core.pyi is
// generated: `T | None` where None is accepted, the items of dicts, lists and tuples.
namespace pyt = py::typing;

// An object argument that may be None (which arrives as nullptr).
template <class T>
using Maybe = std::optional<std::reference_wrapper<T>>;
template <class T>
T* pointer(const Maybe<T>& m) {
    return m ? &m->get() : nullptr;
}

// A shared object argument (a table, a store) that may be None.
template <class T>
using MaybeShared = std::optional<std::shared_ptr<T>>;

// A constructor argument as the core takes it: a MaybeShared as its shared_ptr, the rest as given.
template <class T>
T&& as_given(T&& v) {
    return std::forward<T>(v);
}
template <class T>
std::shared_ptr<T> as_given(MaybeShared<T>&& v) {
    return v ? std::move(*v) : nullptr;
}

// `static`: None, a cache or a table (static_source checks which).
using StaticArg = pyt::Optional<pyt::Union<ngramcache::SharedCache, ngramcache::StaticTable>>;
// `progress`: None or progress(done, total).
using Progress = pyt::Optional<pyt::Callable<void(int64_t, int64_t)>>;

inline size_t len(const Tokens& a) { return static_cast<size_t>(a.size()); }

// f() with the GIL released; what it returns becomes a Python object once the GIL is back.
template <class F>
auto nogil(F&& f) {
    py::gil_scoped_release release;
    return f();
}

inline py::bytes as_bytes(const std::vector<char>& v) { return py::bytes(v.data(), v.size()); }

// A copy of v as a new array: one-dimensional, or of rows of `cols` values.
template <class T>
py::array_t<T> as_array(const std::vector<T>& v, py::ssize_t cols = 0) {
    const auto n = static_cast<py::ssize_t>(v.size());
    py::array_t<T> a = cols > 0 ? py::array_t<T>({n / cols, cols}) : py::array_t<T>(n);
    if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
    return a;
}

// The tokens fill(out) writes (at most n; it returns how many), run without the GIL, as a
// new array: a drafting step's usual size goes through the stack, not the heap.
template <class Fill>
py::array_t<int32_t> proposal(size_t n, Fill&& fill) {
    token_t small[64];
    std::vector<token_t> big(n > 64 ? n : 0);
    token_t* out = n > 64 ? big.data() : small;
    const size_t got = nogil([&] { return fill(out); });
    py::array_t<int32_t> result(static_cast<py::ssize_t>(got));
    if (got) std::memcpy(result.mutable_data(), out, got * sizeof(int32_t));
    return result;
}

// A core cache built without any lock, handed to Python as a new object.
inline ngramcache::SharedCache* new_cache(ngramcache::NgramCache& fresh) {
    auto* s = new ngramcache::SharedCache();
    s->unlocked().swap(fresh);
    return s;
}

// `static` as the core sees it (a TypeError for anything but None, a cache or a table).
ngramcache::StaticSource static_source(const StaticArg& obj);

// Runs f(progress callback) without the GIL. The callback takes the GIL back to call
// `progress` (None: no call) and to let Ctrl-C stop the run; an exception either raises
// is restored once the core has unwound.
template <class F>
auto with_progress(const py::object& progress, F&& f) {
    struct PythonErrorPending {};
    const ngramcache::ReplayProgress cb = [&progress](int64_t done, int64_t total) {
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
    try {
        py::gil_scoped_release release;
        return f(cb);
    } catch (const PythonErrorPending&) {
        throw py::error_already_set();
    }
}

// Every bound constructor's keyword defaults, by class name: _core.defaults() returns them,
// and the tests compare them with the package's declarations. record_defaults(name,
// options...) keeps those of the keywords (py::arg_v) among a constructor's `options`, so that
// a keyword's default is written once, in the binding line, from the core's own constant.
py::dict& keyword_defaults();

template <class... Options>
void record_defaults(const char* name, const Options&... options) {
    py::dict defaults;
    auto keep = [&defaults](const auto& option) {
        if constexpr (std::is_same_v<std::decay_t<decltype(option)>, py::arg_v>) defaults[option.name] = option.value;
    };
    (keep(options), ...);
    keyword_defaults()[name] = defaults;
}

// One per file of the binding, called in this order (a class is registered before the
// signatures that name it).
void register_caches_tables(py::module_& m);
void register_runs_files(py::module_& m);
void register_drafters(py::module_& m);
void register_llama_drafters(py::module_& m);
void register_defaults(py::module_& m);

}  // namespace ngramcache_bind
