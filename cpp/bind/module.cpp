// The compiled module: the core's errors as Python exceptions, then each subject's file.
#include <exception>
#include <system_error>

#include "common.hpp"
#include "ngramcache/file_io.hpp"  // PathError, FileNotFound
#include "ngramcache/ngram.hpp"
#include "ngramcache/ngram_simple.hpp"  // kSpecSizeMax
#include "ngramcache/prompt_lookup.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/suffix_trie.hpp"  // kSuffixMaxDepth

namespace ngramcache_bind {
namespace {

void register_errors(py::module_& m) {
    using namespace ngramcache;
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

}  // namespace

void register_gate(py::module_& m);  // gate.cpp

py::dict& keyword_defaults() {
    // never destroyed: it may outlive the interpreter's finalisation
    static py::dict* all = new py::dict();
    return *all;
}

void register_defaults(py::module_& m) {
    m.def(
        "defaults",
        [] {
            pyt::Dict<py::str, pyt::Dict<py::str, py::object>> out;
            for (auto item : keyword_defaults())
                out[item.first] = item.second.attr("copy")();  // callers get copies, not the record
            return out;
        },
        "Each class's constructor keywords that have a default, with it: {class name: {keyword: default}}.");
    m.def(
        "limits",
        [] {
            using namespace ngramcache;
            return py::dict("max_replay_draft"_a = kMaxReplayDraft, "ngram_max"_a = kNgramMax,
                            "spec_size_max"_a = kSpecSizeMax,
                            "prompt_lookup_max_ngram"_a = PromptLookupDrafter::kMaxNgram,
                            "suffix_max_depth"_a = kSuffixMaxDepth);
        },
        "The core's bounds that the package declares too: {name: value}.");
}
}  // namespace ngramcache_bind

PYBIND11_MODULE(_core, m) {
    using namespace ngramcache_bind;
    m.doc() = "ngramcache's compiled core (use the ngramcache package, not this module).";
    register_errors(m);
    register_caches_tables(m);
    register_runs_files(m);
    register_drafters(m);
    register_llama_drafters(m);
    register_gate(m);
    register_defaults(m);
}
