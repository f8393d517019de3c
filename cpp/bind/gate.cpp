// The drafting gate's policy (gate.hpp), driven by ngramcache.decoding.gate.Gate, and the
// gated replay of a compiled drafter. The gate's calls keep the GIL: each is a few dozen
// numbers, less than a release would cost.
#include <optional>
#include <vector>

#include "common.hpp"
#include "ngramcache/gate.hpp"
#include "sequence_drafter.hpp"

namespace ngramcache_bind {

using namespace ngramcache;

void register_gate(py::module_& m) {
    py::class_<Gate>(m, "Gate", "The drafting gate's policy: per-state estimates, the choice, the risk bound.")
        .def(py::init([](std::vector<double> cost, std::vector<int64_t> length_buckets, size_t n_sources,
                         const std::vector<std::vector<double>>& means, double min_gain, double decay,
                         double prior_weight, std::optional<double> risk, double flat_prior) {
                 GateParams p;
                 p.min_gain = min_gain;
                 p.decay = decay;
                 p.prior_weight = prior_weight;
                 p.risk = risk;
                 p.flat_prior = flat_prior;
                 return new Gate(p, std::move(cost), std::move(length_buckets), n_sources, means);
             }),
             "cost"_a, "length_buckets"_a, "n_sources"_a, "means"_a, "min_gain"_a, "decay"_a, "prior_weight"_a,
             "risk"_a.none(true), "flat_prior"_a)
        .def("set_cost", &Gate::set_cost, "cost"_a, "A new curve of as many batch sizes.")
        .def("state", &Gate::state, "confidence"_a, "previous"_a, "source"_a)
        .def(
            "probabilities",
            [](const Gate& g, size_t state, size_t n) {
                std::vector<double> p(n);
                for (size_t j = 0; j < n; ++j) p[j] = g.probability(state, j);
                return as_array(p);
            },
            "state"_a, "n"_a)
        .def("choose", &Gate::choose, "state"_a, "available"_a)
        .def("settled", &Gate::settled, "k"_a, "n_accepted"_a)
        .def("observe", &Gate::observe, "state"_a, "n_right"_a, "n_scored"_a, "start"_a)
        .def(
            "tallies",
            [](const Gate& g, size_t state) {
                return py::make_tuple(as_array(g.hits(state)), as_array(g.trials(state)));
            },
            "state"_a, "The decayed hits and trials of a state per draft position.")
        .def_property_readonly("cost", &Gate::cost)
        .def_property_readonly("risk", &Gate::risk)
        .def_property_readonly("max_len", &Gate::max_len)
        .def_property_readonly("n_states", &Gate::n_states);

    m.def(
        "replay_gated_drafter",
        [](CompiledDrafter& d, const Tokens& tokens, size_t n_ctx, size_t n_draft, size_t n_prompt, Gate& gate,
           size_t default_source, const Progress& progress) {
            GatedSteps steps(gate, default_source);
            ReplayOptions opt;
            opt.n_ctx = n_ctx;
            opt.n_draft = n_draft;
            opt.n_prompt = n_prompt;
            opt.gate = &steps;
            pyt::Tuple<DrafterReplayResult, py::int_, py::int_> out =
                py::make_tuple(d.replay(tokens, opt, progress), steps.offered, steps.declined);
            return out;
        },
        "drafter"_a, "tokens"_a, "n_ctx"_a, "n_draft"_a, "n_prompt"_a, "gate"_a, "default_source"_a, "progress"_a.none(true),
        "replay_drafter with the gate deciding how many of each proposal are verified: (counts, proposals "
        "offered, proposals declined). The gate goes on learning; no other thread may use it meanwhile.");
}

}  // namespace ngramcache_bind
