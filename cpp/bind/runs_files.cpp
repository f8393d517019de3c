// Files and replays: AtomicFile (the one way Python saves a file), replay() (llama.cpp's
// lookup-stats loop in the core), and the sorted runs a sharded build writes and merges.
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "ngramcache/atomic_file.hpp"
#include "ngramcache/draft.hpp"
#include "ngramcache/replay.hpp"
#include "ngramcache/shared_cache.hpp"
#include "ngramcache/sorted_runs.hpp"

namespace ngramcache_bind {

using namespace ngramcache;

namespace {

// files.atomic_open writes to `fd` and commits or aborts.
void register_atomic_file(py::module_& m) {
    py::class_<AtomicFile>(m, "AtomicFile", "One atomic save of one file (see atomic_file.hpp).")
        .def(py::init<const std::string&, bool>(), "path"_a, "named_temp"_a = false,
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("fd", &AtomicFile::fd)
        .def_property_readonly("target", [](const AtomicFile& f) { return py::bytes(f.target()); })
        .def_property_readonly("temp_name", [](const AtomicFile& f) { return py::bytes(f.temp_name()); })
        .def("commit", &AtomicFile::commit, py::call_guard<py::gil_scoped_release>())
        .def("abort", &AtomicFile::abort);
    // A command's Ctrl-C: no save renames its file after stop_saves() returns (atomic_file.hpp).
    m.def("stop_saves", &stop_saves, py::call_guard<py::gil_scoped_release>());
    m.def("resume_saves", &resume_saves);
}

ReplayResult replay_py(const Tokens& tokens, size_t n_ctx, size_t n_draft, const StaticArg& static_obj,
                       const Maybe<SharedCache>& dynamic, bool update_dynamic, const Progress& progress,
                       bool llama_oob, const std::optional<Tokens>& oob_reads) {
    ReplayOptions opt;
    opt.n_ctx = n_ctx;
    opt.n_draft = n_draft;
    opt.llama_oob = llama_oob;
    if (oob_reads) {
        const Tokens& a = *oob_reads;
        if (a.ndim() != 2 || a.shape(1) != 4) throw InputError("oob_reads must have shape (n_chunks, 4)");
        opt.oob_reads = oob_reads_from_rows(a.data(), static_cast<size_t>(a.shape(0)));
    }
    const StaticSource st = static_source(static_obj);
    return with_progress(progress, [&](const ReplayProgress& cb) {
        return replay_shared(tokens.data(), len(tokens), opt, st, pointer(dynamic), update_dynamic, cb);
    });
}

void register_replay(py::module_& m) {
    // Registered once, before the two results that derive from it (replay_drafter()'s in drafters.cpp).
    py::class_<ReplayCounts> counts(m, "ReplayCounts", "What every replay loop counts.");
    using Count = std::pair<const char*, int64_t ReplayCounts::*>;
    using Counts = std::pair<const char*, std::vector<int64_t> ReplayCounts::*>;
    for (const auto& [name, member] : std::initializer_list<Count>{
             {"n_input", &ReplayCounts::n_input}, {"n_ctx", &ReplayCounts::n_ctx},
             {"n_draft", &ReplayCounts::n_draft}, {"n_chunks", &ReplayCounts::n_chunks},
             {"n_steps", &ReplayCounts::n_steps}, {"n_drafted", &ReplayCounts::n_drafted},
             {"n_accept", &ReplayCounts::n_accept}, {"t_draft_ns", &ReplayCounts::t_draft_ns},
             {"t_replay_ns", &ReplayCounts::t_replay_ns}})
        counts.def_readonly(name, member);
    for (const auto& [name, member] : std::initializer_list<Counts>{
             {"draft_length_hist", &ReplayCounts::draft_length_hist},
             {"accept_length_hist", &ReplayCounts::accept_length_hist},
             {"drafted_by_position", &ReplayCounts::drafted_by_position},
             {"accepted_by_position", &ReplayCounts::accepted_by_position}})
        counts.def_readonly(name, member);

    py::class_<ReplayResult, ReplayCounts> r(m, "ReplayResult", "What replay() counted (see ngramcache.ReplayStats).");
    r.def_readonly("overlap_positions", &ReplayResult::overlap_positions)
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

// ngramcache.corpus.sharded: runs written per shard, merged into one file.
void register_sorted_runs(py::module_& m) {
    m.def(
        "run_from_tokens",
        [](const std::vector<std::tuple<Tokens, uint64_t, size_t, uint64_t>>& stretches, int ngram_size) {
            std::vector<runs::TokenStretch> s;
            for (const auto& [tokens, rank, first_target, first_position] : stretches)
                s.push_back(runs::TokenStretch{tokens.data(), len(tokens), rank, first_target, first_position});
            const std::vector<uint8_t> run = nogil([&] { return runs::run_from_tokens(s, ngram_size); });
            return py::bytes(reinterpret_cast<const char*>(run.data()), run.size());
        },
        "stretches"_a, "ngram_size"_a);
    m.def("save_run_from_cache", &runs::save_cache_run, "cache"_a, "rank"_a, "llama_order"_a, "path"_a,
          py::call_guard<py::gil_scoped_release>());
    auto counts = [](const runs::MergeCounts& c) { return py::make_tuple(c.keys, c.entries, c.total); };
    m.def(
        "merge_runs_ngst",
        [counts](const std::vector<std::string>& paths, const std::string& out, int ngram_size, bool from_tokens,
                 size_t block_entries) {
            return counts(nogil([&] { return runs::merge_to_ngst_file(paths, out, ngram_size, from_tokens, block_entries); }));
        },
        "paths"_a, "out"_a, "ngram_size"_a, "from_tokens"_a, "block_entries"_a);
    m.def(
        "merge_runs_lookup",
        [counts](const std::vector<std::string>& paths, const std::string& out, const std::string& spool,
                 size_t block_entries) {
            return counts(nogil([&] { return runs::merge_to_lookup(paths, out, spool, block_entries); }));
        },
        "paths"_a, "out"_a, "spool"_a, "block_entries"_a);
}

}  // namespace

void register_runs_files(py::module_& m) {
    register_atomic_file(m);
    register_replay(m);
    register_sorted_runs(m);
}

}  // namespace ngramcache_bind
