// The drafters of ngramcache's own (the lookup and copy drafters over llama.cpp's caches,
// plain prompt lookup, the suffix drafter and its store), all of the sequence protocol.
#include <memory>
#include <utility>

#include "common.hpp"
#include "ngramcache/copy_drafter.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/lookup_drafter.hpp"
#include "ngramcache/prompt_lookup.hpp"
#include "ngramcache/suffix.hpp"
#include "sequence_drafter.hpp"

namespace ngramcache_bind {

using namespace ngramcache;

namespace {

void register_drafter_replay_result(py::module_& m) {
    py::class_<DrafterReplayResult, ReplayCounts>(m, "DrafterReplayResult", "What replay_drafter() counted.");
}

// The lookup caches (context, dynamic, static) are held through pointers, so each Python
// object stays alive as long as the drafter holds it (keep_alive), whoever else lets go.
template <class D>
void def_set_dynamic(py::class_<Bound<D>, CompiledDrafter>& c) {
    c.def(
        "set_dynamic",
        [](Bound<D>& e, const Maybe<const SharedCache>& dynamic) { e.use().set_dynamic(pointer(dynamic)); },
        "dynamic"_a.none(true), py::keep_alive<1, 2>());
}

void register_lookup_drafters(py::module_& m) {
    auto lookup = bind_sequence_drafter<LookupDrafter>(
        m, "LookupDrafter", "llama.cpp's lookup: the context cache, then dynamic, then static.",
        py::init([](const Maybe<SharedCache>& context, const Maybe<const SharedCache>& dynamic,
                    const StaticArg& static_obj, int ngram_min, int ngram_max) {
            return new Bound<LookupDrafter>(ngram_min, ngram_max, pointer(dynamic), static_source(static_obj),
                                                pointer(context));
        }),
        "context"_a.none(true), "dynamic"_a.none(true), "static"_a.none(true),
        "ngram_min"_a = LookupDrafter::Defaults::ngram_min, "ngram_max"_a = LookupDrafter::Defaults::ngram_max,
        py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::keep_alive<1, 4>());
    def_set_dynamic(lookup);

    using Copy = Bound<CopyDrafter>;
    auto copy = bind_sequence_drafter<CopyDrafter>(
        m, "CopyDrafter", "Copies of earlier spans of the sequence, else llama.cpp's lookup.",
        py::init([](const Maybe<SharedCache>& context, const Maybe<const SharedCache>& dynamic,
                    const StaticArg& static_obj, int ngram_min, int ngram_max, size_t min_match, size_t max_match,
                    size_t max_candidates) {
            CopyOptions o;
            o.ngram_min = ngram_min;
            o.ngram_max = ngram_max;
            o.min_match = min_match;
            o.max_match = max_match;
            o.max_candidates = max_candidates;
            return new Copy(o, pointer(dynamic), static_source(static_obj), pointer(context));
        }),
        "context"_a.none(true), "dynamic"_a.none(true), "static"_a.none(true), "ngram_min"_a = CopyOptions{}.ngram_min,
        "ngram_max"_a = CopyOptions{}.ngram_max, "min_match"_a = CopyOptions{}.min_match,
        "max_match"_a = CopyOptions{}.max_match, "max_candidates"_a = CopyOptions{}.max_candidates,
        py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::keep_alive<1, 4>());
    def_set_dynamic(copy);
    copy.def(
            "index",
            [](Copy& e) {
                pyt::Dict<pyt::Tuple<py::int_, py::ellipsis>, pyt::List<py::int_>> out;
                for (const CopyDrafter::IndexedGram& g : e.use().indexed_grams())
                    out[py::tuple(py::cast(g.gram))] = py::cast(g.positions);
                return out;
            },
            "Every indexed position by its min_match-gram, oldest first (for tests).");
}

void register_suffix(py::module_& m) {
    // Shared by drafters (shared_ptr): adds and evictions take its lock exclusively,
    // proposals share it; the GIL is released around adds, which cost O(max_depth) a token.
    const py::arg_v max_tokens = "max_tokens"_a = SuffixStore::Defaults::max_tokens;
    const py::arg_v max_depth = "max_depth"_a = SuffixStore::Defaults::max_depth;
    record_defaults("SuffixStore", max_tokens, max_depth);
    py::class_<SuffixStore, std::shared_ptr<SuffixStore>>(m, "SuffixStore", "Earlier requests' tokens for SuffixDrafter.")
        .def(py::init<size_t, size_t>(), max_tokens, max_depth)
        .def(
            "add",
            [](SuffixStore& s, const Tokens& t) {
                py::gil_scoped_release release;
                s.add(t.data(), len(t));
            },
            "tokens"_a)
        .def("clear", &SuffixStore::clear, py::call_guard<py::gil_scoped_release>())
        .def("requests",
             [](const SuffixStore& s) {
                 const auto reqs = nogil([&] { return s.requests(); });
                 pyt::List<py::array_t<int32_t>> out;
                 for (const auto& r : reqs) out.append(as_array(r));
                 return out;
             })
        .def_property_readonly("n_tokens", &SuffixStore::n_tokens)
        .def_property_readonly("n_requests", &SuffixStore::n_requests)
        .def_property_readonly("n_nodes", &SuffixStore::n_nodes)
        .def_property_readonly("nbytes", &SuffixStore::memory_bytes)
        .def_property_readonly("max_tokens", &SuffixStore::max_tokens)
        .def_property_readonly("max_depth", &SuffixStore::max_depth);

    using Suffix = Bound<SuffixDrafter>;
    bind_sequence_drafter<SuffixDrafter>(m, "SuffixDrafter",
                                         "Most frequent continuation of the longest suffix match (SuffixDecoding).",
                                         py::init([](size_t max_depth, double alpha, double min_prob,
                                                     MaybeShared<SuffixStore> store) {
                                             return new Suffix(max_depth, alpha, min_prob, as_given(std::move(store)));
                                         }),
                                         "max_depth"_a = SuffixDrafter::Defaults::max_depth,
                                         "alpha"_a = SuffixDrafter::Defaults::alpha,
                                         "min_prob"_a = SuffixDrafter::Defaults::min_prob,
                                         "store"_a.none(true) = py::none())
        .def("finish", [](Suffix& e) { e.use().finish(); })
        .def_property_readonly("n_nodes", [](Suffix& e) { return e.use().n_nodes(); })
        .def_property_readonly("nbytes", [](Suffix& e) { return e.use().memory_bytes(); });
}

}  // namespace

void register_drafters(py::module_& m) {
    register_drafter_replay_result(m);
    register_compiled_drafter(m);
    register_lookup_drafters(m);
    bind_sequence_drafter<PromptLookupDrafter>(
        m, "PromptLookupDrafter", "Plain prompt lookup (Hugging Face, llama-cpp-python, vLLM).",
        py::init([](int max_ngram, int min_ngram, bool recent) {
            using Match = PromptLookupDrafter::Match;
            return new Bound<PromptLookupDrafter>(max_ngram, min_ngram, recent ? Match::recent : Match::first);
        }),
        "max_ngram"_a = PromptLookupDrafter::Defaults::max_ngram,
        "min_ngram"_a = PromptLookupDrafter::Defaults::min_ngram, "recent"_a = PromptLookupDrafter::Defaults::recent);
    register_suffix(m);
}

}  // namespace ngramcache_bind
