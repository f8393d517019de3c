// One registration for every drafter of the sequence protocol (drafter_replay.hpp), so
// that the Python layer wraps them all alike and a new drafter is one call plus its
// constructor's options:
//
//   bind_sequence_drafter<D>(m, "Name", "doc", py::init<...>() or py::init(factory), options...)
//
// Python sees one base class, CompiledDrafter, with reset(prompt), accept(tokens),
// step(n_max) -> (tokens, confidence, source): one call per decoding step, and tokens, the
// sequence as the drafter holds it (D::tokens(), a TokenBuffer), read in place: a
// read-only numpy array over the buffer's block, which it keeps alive, so that it stays
// valid and unchanged whatever the drafter does next (token_buffer.hpp); and one
// replay_drafter(drafter, tokens, n_ctx, n_draft, progress) for all of them; each drafter's class adds its constructor and
// what it has beyond the protocol. The object is a Bound<D>: an Exclusive<D>
// (exclusive.hpp) behind the base's virtual calls. Every call that releases the GIL claims
// the drafter, so a second thread calling in meanwhile gets a RuntimeError, not a data
// race; the steps release it too, because a drafter may wait for a cache's lock (the
// lookup caches) while the thread holding that lock waits for the GIL (a replay's progress
// callback).
#pragma once

#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>

#include "common.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/exclusive.hpp"
#include "ngramcache/token_buffer.hpp"

namespace ngramcache_bind {

// A read-only array over the first size() tokens of b's block, holding the block (the
// tokens it shows are never written again, token_buffer.hpp).
inline py::array_t<int32_t> shared_view(const ngramcache::TokenBuffer& b) {
    py::array_t<int32_t> out;
    if (b.empty()) {
        out = py::array_t<int32_t>(0);
    } else {
        using Block = std::shared_ptr<const token_t[]>;
        auto* block = new Block(b.share());
        py::capsule owner(block, [](void* p) { delete static_cast<Block*>(p); });
        out = py::array_t<int32_t>(static_cast<py::ssize_t>(b.size()), block->get(), owner);
    }
    py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return out;
}

class CompiledDrafter {
public:
    virtual ~CompiledDrafter() = default;
    virtual void reset(const Tokens& prompt) = 0;
    virtual void accept(const Tokens& tokens) = 0;
    // the proposal, its confidence (a match length) and its source (-1: the drafter has one)
    virtual py::tuple step(size_t n_max) = 0;
    virtual py::array_t<int32_t> tokens() = 0;
    virtual ngramcache::DrafterReplayResult replay(const Tokens& tokens, const ngramcache::ReplayOptions& opt,
                                                   const Progress& progress) = 0;
};

// A drafter with more than one source (CopyDrafter: a copy or the lookup caches) says which.
template <class D, class = void>
struct HasSource : std::false_type {};
template <class D>
struct HasSource<D, std::void_t<decltype(std::declval<const D&>().source())>> : std::true_type {};

template <class D>
class Bound final : public CompiledDrafter, public ngramcache::Exclusive<D> {
    using Claim = typename ngramcache::Exclusive<D>::Claim;

public:
    using ngramcache::Exclusive<D>::Exclusive;

    void reset(const Tokens& prompt) override {
        Claim d(*this);
        nogil([&] { d->reset(prompt.data(), len(prompt)); });
    }
    void accept(const Tokens& tokens) override {
        Claim d(*this);
        nogil([&] { d->accept(tokens.data(), len(tokens)); });
    }
    py::tuple step(size_t n_max) override {
        int confidence = 0, source = -1;
        py::array_t<int32_t> tokens;
        {
            Claim d(*this);
            // a drafter may find more than asked; only n_max are handed over
            tokens = proposal(n_max, [&](token_t* out) { return std::min(d->propose(n_max, out), n_max); });
            confidence = d->confidence();
            if constexpr (HasSource<D>::value) source = d->source();
        }
        return py::make_tuple(std::move(tokens), confidence, source);
    }
    py::array_t<int32_t> tokens() override { return shared_view(this->use().tokens()); }
    ngramcache::DrafterReplayResult replay(const Tokens& tokens, const ngramcache::ReplayOptions& opt,
                                           const Progress& progress) override {
        Claim d(*this);
        return with_progress(progress, [&](const ngramcache::ReplayProgress& cb) {
            return ngramcache::replay_drafter(*d, tokens.data(), len(tokens), opt, cb);
        });
    }
};

// The base class and replay_drafter, once, before any drafter's class.
inline void register_compiled_drafter(py::module_& m) {
    py::class_<CompiledDrafter>(m, "CompiledDrafter", "A drafter of the sequence protocol, compiled.")
        .def("reset", &CompiledDrafter::reset, "prompt"_a)
        .def("accept", &CompiledDrafter::accept, "tokens"_a)
        .def("step", &CompiledDrafter::step, "n_max"_a,
             "One step: (up to n_max proposed tokens, their confidence (a match length), their source "
             "(-1 where the drafter has one source only)).")
        .def_property_readonly("tokens", &CompiledDrafter::tokens,
                               "The sequence so far, in place: a read-only array that keeps what it shows "
                               "(later calls never change it).");
    m.def(
        "replay_drafter",
        [](CompiledDrafter& d, const Tokens& tokens, size_t n_ctx, size_t n_draft, const Progress& progress) {
            ngramcache::ReplayOptions opt;
            opt.n_ctx = n_ctx;
            opt.n_draft = n_draft;
            return d.replay(tokens, opt, progress);
        },
        "drafter"_a, "tokens"_a, "n_ctx"_a, "n_draft"_a, "progress"_a.none(true));
}

template <class D, class Init, class... Options>
py::class_<Bound<D>, CompiledDrafter> bind_sequence_drafter(py::module_& m, const char* name, const char* doc,
                                                            Init&& init, const Options&... options) {
    py::class_<Bound<D>, CompiledDrafter> c(m, name, doc);
    c.def(std::forward<Init>(init), options...);
    record_defaults(name, options...);
    return c;
}

}  // namespace ngramcache_bind
