// One registration for every drafter of the sequence protocol (drafter_replay.hpp), so
// that the Python layer wraps them all alike and a new drafter is one call plus its
// constructor's options:
//
//   bind_sequence_drafter<D>(m, "Name", "doc", py::init<...>() or py::init(factory), options...)
//
// binds reset(prompt), accept(tokens), propose(n_max), the confidence property and D's
// overload of replay_drafter(drafter, tokens, n_ctx, n_draft, progress), on an
// Exclusive<D> (exclusive.hpp). Every call that releases the GIL claims the drafter, so a
// second thread calling in meanwhile gets a RuntimeError, not a data race; the steps
// release it too, because a drafter may wait for a cache's lock (the lookup caches) while
// the thread holding that lock waits for the GIL (a replay's progress callback).
#pragma once

#include <algorithm>
#include <utility>

#include "common.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/exclusive.hpp"

namespace ngramcache_bind {

template <class D, class Init, class... Options>
py::class_<ngramcache::Exclusive<D>> bind_sequence_drafter(py::module_& m, const char* name, const char* doc,
                                                           Init&& init, const Options&... options) {
    using E = ngramcache::Exclusive<D>;
    using Claim = typename E::Claim;
    // reset and accept take tokens alike: the drafter claimed, the GIL released
    const auto tokens_step = [](void (D::*step)(const token_t*, size_t)) {
        return [step](E& e, const Tokens& t) {
            Claim d(e);
            nogil([&] { ((*d).*step)(t.data(), len(t)); });
        };
    };
    py::class_<E> c(m, name, doc);
    c.def(std::forward<Init>(init), options...)
        .def("reset", tokens_step(&D::reset), "prompt"_a)
        .def("accept", tokens_step(&D::accept), "tokens"_a)
        .def(
            "propose",
            [](E& e, size_t n_max) {
                Claim d(e);
                // a drafter may find more than asked; only n_max are handed over
                return proposal(n_max, [&](token_t* out) { return std::min(d->propose(n_max, out), n_max); });
            },
            "n_max"_a)
        .def_property_readonly(
            "confidence", [](E& e) { return e.use().confidence(); },
            "The last proposal's confidence (a match length), for the adaptive gate.");
    m.def(
        "replay_drafter",
        [](E& e, const Tokens& tokens, size_t n_ctx, size_t n_draft, const Progress& progress) {
            Claim d(e);
            ngramcache::ReplayOptions opt;
            opt.n_ctx = n_ctx;
            opt.n_draft = n_draft;
            return with_progress(progress, [&](const ngramcache::ReplayProgress& cb) {
                return ngramcache::replay_drafter(*d, tokens.data(), len(tokens), opt, cb);
            });
        },
        "drafter"_a, "tokens"_a, "n_ctx"_a, "n_draft"_a, "progress"_a.none(true));
    return c;
}

}  // namespace ngramcache_bind
