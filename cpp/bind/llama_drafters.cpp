// llama.cpp's ngram-simple, ngram-map-k/k4v and ngram-mod (ngramcache.drafters.llama_ngram),
// each bound twice from one registration: in llama.cpp's calling shape (sync/extend,
// begin, draft(id_last), accept(n_accepted)) and as its SequenceAdapter under the sequence
// protocol, with the same constructor options.
//
// The llama.cpp-shaped classes keep the GIL: a call takes microseconds, and one object's
// state must not be touched by two threads at once. The NgramModTable they may share is
// safe without it (relaxed atomic slots, ngram_mod.hpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "ngramcache/ngram_map.hpp"
#include "ngramcache/ngram_mod.hpp"
#include "ngramcache/ngram_simple.hpp"
#include "ngramcache/sequence_adapter.hpp"
#include "sequence_drafter.hpp"

namespace ngramcache_bind {

using namespace ngramcache;

namespace {

// What Python calls on every llama.cpp-shaped drafter, one set of methods for all; each
// drafter's class (a LlamaShaped<D>) derives from it and adds its own properties.
class LlamaShapedDrafter {
public:
    virtual ~LlamaShapedDrafter() = default;
    virtual void sync(const Tokens& prompt) = 0;
    virtual bool extend(const Tokens& tokens, size_t start) = 0;
    virtual void begin() = 0;
    virtual py::array_t<int32_t> draft(token_t id_last) = 0;
    virtual void accept(size_t n_accepted) = 0;
    virtual size_t n_tokens() const = 0;
};

template <class D>
struct LlamaShaped final : LlamaShapedDrafter {
    D drafter;

    template <class... A>
    explicit LlamaShaped(A&&... a) : drafter(std::forward<A>(a)...) {}
    void sync(const Tokens& prompt) override { drafter.sync(prompt.data(), len(prompt)); }
    bool extend(const Tokens& tokens, size_t start) override {
        return extend_history(drafter, tokens.data(), len(tokens), start);
    }
    void begin() override { drafter.begin(); }
    py::array_t<int32_t> draft(token_t id_last) override {
        std::vector<token_t> out;
        drafter.draft(id_last, out);
        return as_array(out);
    }
    void accept(size_t n_accepted) override { drafter.accept(n_accepted); }
    size_t n_tokens() const override { return drafter.history().size(); }
};

void register_llama_shaped_drafter(py::module_& m) {
    py::class_<LlamaShapedDrafter>(m, "LlamaShapedDrafter",
                                   "A drafter in llama.cpp's calling shape, over a history it keeps.")
        .def("sync", &LlamaShapedDrafter::sync, "prompt"_a,
             "The history becomes the prompt (one comparison with the copy, then the new tail).")
        .def("extend", &LlamaShapedDrafter::extend, "tokens"_a, "start"_a,
             "Append tokens[len(history)-start:] if tokens[:len(history)-start] repeat the history's "
             "tail from `start`; False (nothing changed) otherwise.")
        .def("begin", &LlamaShapedDrafter::begin, "llama.cpp's begin() with the history as the prompt.")
        .def("draft", &LlamaShapedDrafter::draft, "id_last"_a, "llama.cpp's draft() with the history as the prompt.")
        .def("accept", &LlamaShapedDrafter::accept, "n_accepted"_a)
        .def_property_readonly("n_tokens", &LlamaShapedDrafter::n_tokens);
}

// D as `name` and SequenceAdapter<D> as `sequence_name`, both made from Args (`options`
// names them); returns D's class for what it has beyond the shared calls.
template <class D, class... Args, class... Options>
py::class_<LlamaShaped<D>, LlamaShapedDrafter> bind_llama_shaped(py::module_& m, const char* name, const char* doc,
                                                                 const char* sequence_name, const char* sequence_doc,
                                                                 const Options&... options) {
    py::class_<LlamaShaped<D>, LlamaShapedDrafter> c(m, name, doc);
    c.def(py::init([](Args... a) { return new LlamaShaped<D>(as_given(std::move(a))...); }), options...);
    record_defaults(name, options...);
    using Sequence = Bound<SequenceAdapter<D>>;
    bind_sequence_drafter<SequenceAdapter<D>>(
        m, sequence_name, sequence_doc, py::init([](Args... a) { return new Sequence(as_given(std::move(a))...); }),
        options...);
    return c;
}

void register_mod_table(py::module_& m) {
    const py::arg_v size = "size"_a = NgramModTable::kDefaultSize;
    record_defaults("NgramModTable", size);
    py::class_<NgramModTable, std::shared_ptr<NgramModTable>>(m, "NgramModTable",
                                                              "ngram-mod's hash table, shareable by drafters and threads.")
        .def(py::init<size_t>(), size)
        .def("entries",
             [](const NgramModTable& t) {
                 py::array_t<int32_t> out(static_cast<py::ssize_t>(t.size()));
                 int32_t* p = out.mutable_data();
                 nogil([&] { t.export_entries(p); });
                 return out;
             })
        .def(
            "set_entries",
            [](NgramModTable& t, const Tokens& a) {
                if (len(a) != t.size())
                    throw InputError("expected " + std::to_string(t.size()) + " slots, got " + std::to_string(len(a)));
                nogil([&] { t.import_entries(a.data()); });
            },
            "entries"_a)
        .def_property_readonly("size", &NgramModTable::size)
        .def_property_readonly("nbytes", &NgramModTable::nbytes)
        .def_property_readonly("used", &NgramModTable::used)
        .def_property_readonly("resets", &NgramModTable::resets)
        .def(
            "get", [](const NgramModTable& t, const Tokens& ngram) { return t.get(ngram.data(), len(ngram)); },
            "ngram"_a)
        .def("reset", &NgramModTable::reset, py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void register_llama_drafters(py::module_& m) {
    register_mod_table(m);
    register_llama_shaped_drafter(m);
    bind_llama_shaped<NgramSimple, size_t, size_t>(m, "NgramSimple", "llama.cpp's ngram-simple drafter.",
                                                   "NgramSimpleSequence", "ngram-simple over the sequence protocol.",
                                                   "size_n"_a = NgramSimple::Defaults::size_n,
                                                   "size_m"_a = NgramSimple::Defaults::size_m);
    bind_llama_shaped<NgramMap, size_t, size_t, size_t, bool>(
        m, "NgramMap", "llama.cpp's ngram-map-k (k4v=False) and ngram-map-k4v drafters.", "NgramMapSequence",
        "ngram-map-k/k4v over the sequence protocol.", "size_n"_a = NgramMap::Defaults::size_n,
        "size_m"_a = NgramMap::Defaults::size_m, "min_hits"_a = NgramMap::Defaults::min_hits,
        "k4v"_a = NgramMap::Defaults::k4v)
        .def_property_readonly("n_keys", [](const LlamaShaped<NgramMap>& d) { return d.drafter.keys().size(); });
    bind_llama_shaped<NgramMod, MaybeShared<NgramModTable>, size_t, size_t, size_t>(
        m, "NgramMod", "llama.cpp's ngram-mod drafter.", "NgramModSequence", "ngram-mod over the sequence protocol.",
        "table"_a.none(true), "n_match"_a = NgramMod::Defaults::n_match, "n_min"_a = NgramMod::Defaults::n_min,
        "n_max"_a = NgramMod::Defaults::n_max)
        .def_property_readonly("table", [](const LlamaShaped<NgramMod>& d) { return d.drafter.table(); })
        .def_property_readonly("n_low", [](const LlamaShaped<NgramMod>& d) { return d.drafter.n_low(); })
        .def_property_readonly("i_last", [](const LlamaShaped<NgramMod>& d) { return d.drafter.i_last(); });
}

}  // namespace ngramcache_bind
