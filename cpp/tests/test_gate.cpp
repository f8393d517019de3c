// The drafting gate (gate.hpp): its estimates worked out by hand, its choice against the
// expected rate of every length, the risk bound, the priors scaled only ever down, the
// gated drafter's bookkeeping, and the gated replay.
#include <cmath>
#include <vector>

#include "check.hpp"
#include "support.hpp"
#include "ngramcache/drafter_replay.hpp"
#include "ngramcache/gate.hpp"

using namespace ngramcache;
using Doubles = std::vector<double>;
using test::replay_options;

namespace {

const std::vector<int64_t> kBuckets = {1, 2, 4, 8};
constexpr size_t kSources = 3;
constexpr size_t kStates = kSources * 4 * kGatePrevious;

GateParams flat(std::optional<double> risk = std::nullopt, double min_gain = 0.05) {
    GateParams p;
    p.min_gain = min_gain;
    p.decay = 0.97;
    p.prior_weight = 4.0;
    p.risk = risk;
    p.flat_prior = 1.0 / 3.0;
    return p;
}

Gate flat_gate(Doubles cost, std::optional<double> risk = std::nullopt, double min_gain = 0.05) {
    return Gate(flat(risk, min_gain), std::move(cost), kBuckets, kSources, {});
}

// The expected tokens per unit of cost of verifying k drafted tokens.
double rate(const Gate& g, size_t state, size_t k) {
    double e = 1.0, run = 1.0;
    for (size_t j = 0; j < k; ++j) {
        run *= g.probability(state, j);
        e += run;
    }
    return e / g.cost()[k];
}

void train(Gate& g, size_t state, size_t n_right, size_t n_scored, int times) {
    for (int i = 0; i < times; ++i) g.observe(state, n_right, n_scored);
}

const Doubles kCpu = {1.0, 1.68, 2.02, 2.6, 3.05, 3.39, 3.92, 4.4, 5.05, 5.69, 5.97, 6.24, 6.57, 6.9, 7.23, 7.7, 8.16};

}  // namespace

TEST(states_are_numbered_by_source_length_bucket_and_previous_outcome) {
    Gate g = flat_gate({1.0, 2.0});
    CHECK_EQ(g.n_states(), kStates);
    CHECK_EQ(g.state(0, 0, 0), size_t(0));  // a confidence below the first bucket: the first bucket
    CHECK_EQ(g.state(3, 2, 0), size_t(1 * 3 + 2));
    CHECK_EQ(g.state(30, 1, 1), size_t((1 * 4 + 3) * 3 + 1));
    CHECK_THROWS_AS(g.state(1, 3, 0), std::out_of_range, "previous");
    CHECK_THROWS_AS(g.state(1, 0, 3), std::out_of_range, "source");
}

TEST(estimates_worked_out_by_hand) {
    Gate g = flat_gate({1.0, 1.5, 2.0});
    const size_t s = g.state(8, 1, 1);
    CHECK(std::abs(g.probability(s, 0) - 1.0 / 3.0) < 1e-15);  // nothing seen: the flat prior
    g.observe(s, 1, 2);  // token 1 right, token 2 wrong
    // state: hits (1, 0), trials (1, 1); pool the same. p_1 = (1 + 4 (1 + 1/3) / 2) / 5
    CHECK(std::abs(g.probability(s, 0) - (1.0 + 4.0 * (1.0 + 1.0 / 3.0) / 2.0) / 5.0) < 1e-15);
    CHECK(std::abs(g.probability(s, 1) - (0.0 + 4.0 * (0.0 + 1.0 / 3.0) / 2.0) / 5.0) < 1e-15);
    g.observe(s, 0, 1);  // decayed once, then a miss at position 1 only
    CHECK(std::abs(g.hits(s)[0] - 0.97) < 1e-15 && std::abs(g.trials(s)[0] - 1.97) < 1e-15);
    CHECK_EQ(g.trials(s)[1], 1.0);
    g.observe(s, 2, 5, 1);  // tokens 2 and 3 of a proposal scored later, both right (token 4 is past the curve)
    CHECK(std::abs(g.hits(s)[1] - 1.0) < 1e-15 && std::abs(g.trials(s)[1] - 1.97) < 1e-15);
    CHECK(g.hits(s)[2] == 1.0 && g.trials(s)[2] == 1.0);
    g.observe(s, 0, 0, 2);  // nothing scored: nothing learnt
    g.observe(s, 1, 1, 3);  // past the last position
    CHECK_EQ(g.trials(s)[2], 1.0);
    CHECK_THROWS_AS(g.observe(kStates, 1, 1), std::out_of_range, "state");
}

TEST(the_choice_is_the_best_expected_rate_beyond_min_gain) {
    const size_t s = 5;
    CHECK_EQ(flat_gate({1.0, 1.9, 2.8, 3.7}).choose(s, 3), size_t(0));  // p = 1/3 against 1.9x a step
    for (const Doubles& c : {Doubles{1.0, 1.02, 1.04, 1.06}, Doubles{1.0, 1.0, 1.0, 1.0}, Doubles{1.0, 1.3, 1.5, 1.6}}) {
        Gate g = flat_gate(c, std::nullopt, 0.0);
        size_t best = 0;
        for (size_t k = 1; k <= 3; ++k)
            if (rate(g, s, k) > rate(g, s, best)) best = k;
        CHECK_EQ(g.choose(s, 3), best);
        CHECK(g.choose(s, 2) <= 2 && g.choose(s, 0) == 0);
    }
    CHECK_EQ(flat_gate({1.0, 1.25}, std::nullopt, 0.1).choose(s, 1), size_t(0));  // 1.333 / 1.25 < 1.1
    CHECK_EQ(flat_gate({1.0, 1.25}, std::nullopt, 0.0).choose(s, 1), size_t(1));
}

TEST(the_draft_length_follows_acceptance) {
    Gate g = flat_gate({1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1, 3.4});
    const size_t s = g.state(8, 1, 1);
    CHECK_EQ(g.choose(s, 8), size_t(0));
    train(g, s, 8, 8, 50);
    CHECK_EQ(g.choose(s, 8), size_t(8));
    train(g, s, 2, 3, 200);
    CHECK_EQ(g.choose(s, 8), size_t(2));
    train(g, s, 0, 1, 200);
    CHECK_EQ(g.choose(s, 8), size_t(0));
}

TEST(risk_doubles_when_kept_whole_and_halves_to_its_start_when_the_first_token_is_wrong) {
    Gate g = flat_gate(kCpu, 2.0);
    const size_t s = g.state(8, 1, 1);
    train(g, s, 16, 16, 200);
    CHECK_EQ(g.choose(s, 16), size_t(3));  // cost(4) - 1 = 1.6 <= 2 < cost(5) - 1
    g.settled(3, 3);
    CHECK_EQ(*g.risk(), 4.0);
    CHECK_EQ(g.choose(s, 16), size_t(7));
    g.settled(7, 7);
    g.settled(15, 15);
    CHECK_EQ(*g.risk(), kCpu.back());  // never beyond the longest batch's cost
    CHECK_EQ(g.choose(s, 16), size_t(16));
    g.settled(16, 0);
    CHECK_EQ(*g.risk(), kCpu.back() / 2.0);
    for (int i = 0; i < 6; ++i) g.settled(3, 0);
    CHECK_EQ(*g.risk(), 2.0);
    g.settled(3, 1);  // partly kept: unchanged
    g.settled(0, 0);  // no draft
    g.settled(17, 17);  // longer than the curve: not a draft this gate chose
    CHECK_EQ(*g.risk(), 2.0);
    CHECK(!flat_gate(kCpu).risk());
}

TEST(table_priors_scale_only_ever_down_and_never_reach_certainty) {
    std::vector<Doubles> means(kStates, Doubles(3, 0.5));
    const size_t good = 30, poor = 2;
    means[good] = {1.0, 0.9, 0.9};
    Gate g(flat(), {1.0, 1.2, 1.4}, kBuckets, kSources, means);
    CHECK_EQ(g.probability(good, 0), kMaxPrior);
    CHECK_EQ(g.probability(good, 1), 0.9);
    // other states' drafts keep failing: the text is not copying, every prior falls
    train(g, poor, 0, 1, 40);
    CHECK(g.probability(good, 0) < 0.5 && g.probability(good, 1) == 0.9);
    // a text that copies better than the priors expect does not raise another state's prior
    Gate h(flat(), {1.0, 1.2, 1.4}, kBuckets, kSources, means);
    train(h, good, 3, 3, 40);
    CHECK_EQ(h.probability(poor, 0), 0.5);
    CHECK_EQ(h.probability(poor, 2), 0.5);
    CHECK_THROWS_AS(Gate(flat(), {1.0, 2.0}, kBuckets, kSources, means), InputError, "positions");
    CHECK_THROWS_AS(Gate(flat(), {1.0, 2.0}, kBuckets, kSources, std::vector<Doubles>(3, Doubles(2))), InputError,
                    "states");
}

TEST(the_curve_is_checked_and_replaced_whole) {
    CHECK_THROWS_AS(flat_gate({}), InputError, "one token");
    CHECK_THROWS_AS(flat_gate({1.0, -1.0}), InputError, "positive");
    CHECK_THROWS_AS(flat_gate({1.0, NAN}), InputError, "positive");
    GateParams bad = flat();
    bad.decay = 0.0;
    CHECK_THROWS_AS(Gate(bad, {1.0}, kBuckets, kSources, {}), InputError, "decay");
    Gate g = flat_gate({1.0, 1.0, 1.0}, std::nullopt, 0.0);
    const size_t s = 0;
    CHECK_EQ(g.choose(s, 2), size_t(2));
    g.set_cost({1.0, 5.0, 9.0});
    CHECK_EQ(g.choose(s, 2), size_t(0));
    CHECK_THROWS_AS(g.set_cost({1.0, 2.0}), InputError, "3 batch sizes");
}

TEST(gated_steps_score_declined_proposals_and_draft_once_they_prove_right) {
    // the text repeats 1 2 3 4; a drafter proposes the true next three tokens every step
    std::vector<token_t> seq;
    for (int i = 0; i < 400; ++i) seq.push_back(1 + i % 4);
    Gate g = flat_gate({1.0, 1.6, 2.2, 2.8}, 2.0);
    GatedSteps steps(g, 1);
    steps.reset(1);
    size_t n = 1, first_draft = 0, n_steps = 0;
    std::vector<size_t> lengths;
    while (n + 4 < seq.size()) {
        const size_t k = steps.propose(seq.data() + n, 3, 8, -1);
        lengths.push_back(k);
        if (k > 0 && first_draft == 0) first_draft = n_steps + 1;
        ++n_steps;
        steps.accept(seq.data(), k + 1);  // all k right, then the model's own token
        n += k + 1;
    }
    CHECK_EQ(lengths.front(), size_t(0));  // dear at first: declined
    CHECK(first_draft > 1);                // ... but scored, so that it drafts later
    CHECK_EQ(lengths.back(), size_t(3));
    CHECK_EQ(steps.offered, static_cast<int64_t>(n_steps));
    CHECK_EQ(steps.declined, static_cast<int64_t>(first_draft - 1));
    // a proposal whose first token is wrong: its state's previous outcome becomes "wrong"
    const std::vector<token_t> wrong = {9, 9, 9};
    const size_t before = g.state(8, 0, 1);
    const double p_before = g.probability(before, 0);
    steps.propose(wrong.data(), 3, 8, -1);
    steps.accept(seq.data(), 1);
    steps.propose(wrong.data(), 3, 8, -1);  // made in the state after a wrong first token
    steps.accept(seq.data(), 1);
    CHECK(g.probability(before, 0) < p_before);
}

namespace {

// Proposes the next `k` tokens of a known text (the truth), except at every `every`-th step.
struct Prophet {
    const std::vector<token_t>* text;
    size_t k = 3, every = 5, n = 0, steps = 0;
    void reset(const token_t*, size_t m) { n = m; }
    void accept(const token_t*, size_t m) { n += m; }
    size_t propose(size_t n_max, token_t* out) {
        const size_t len = std::min(k, n_max);
        const bool wrong = ++steps % every == 0;
        for (size_t i = 0; i < len; ++i) out[i] = wrong ? -5 : (*text)[std::min(n + i, text->size() - 1)];
        return len;
    }
};

}  // namespace

TEST(the_gated_replay_counts_what_the_gate_let_through) {
    std::vector<token_t> text;
    for (int i = 0; i < 301; ++i) text.push_back(i % 7);
    // every draft free: the gate keeps every proposal whole, as the ungated replay
    Prophet a{&text}, b{&text};
    ReplayOptions opt = replay_options(100, 3);
    const auto plain = replay_drafter(a, text.data(), text.size(), opt);
    Gate cheap = flat_gate({1.0, 1.0, 1.0, 1.0}, std::nullopt, 0.0);
    GatedSteps steps(cheap, 1);
    opt.gate = &steps;
    const auto free = replay_drafter(b, text.data(), text.size(), opt);
    CHECK_EQ(free.n_drafted, plain.n_drafted);
    CHECK_EQ(free.n_accept, plain.n_accept);
    CHECK_EQ(free.draft_length_hist, plain.draft_length_hist);
    CHECK_EQ(steps.offered, plain.n_steps);
    CHECK_EQ(steps.declined, int64_t(0));
    // every draft dear: nothing verified, every proposal offered and declined
    Prophet c{&text};
    Gate dear = flat_gate({1.0, 50.0, 60.0, 70.0});
    GatedSteps none(dear, 1);
    opt.gate = &none;
    const auto declined = replay_drafter(c, text.data(), text.size(), opt);
    CHECK_EQ(declined.n_drafted, int64_t(0));
    CHECK_EQ(declined.draft_length_hist[0], declined.n_steps);
    CHECK_EQ(none.offered, declined.n_steps);
    CHECK_EQ(none.declined, declined.n_steps);
    // ... and it learnt from them: copy proposals of a long match, right four times in five
    const size_t s = dear.state(3, 1, 1);
    CHECK(dear.probability(s, 0) > 0.6);
}

TEST(each_chunk_may_start_from_a_prompt) {
    std::vector<token_t> text;
    for (int i = 0; i < 64; ++i) text.push_back(i % 7);  // each chunk starts alike: the drafter reads `text` from 0
    Prophet d{&text};
    d.every = 1000;
    Gate g = flat_gate({1.0, 1.0, 1.0, 1.0}, std::nullopt, 0.0);
    GatedSteps steps(g, 1);
    ReplayOptions opt = replay_options(21, 3);
    opt.n_prompt = 12;
    opt.gate = &steps;
    const auto r = replay_drafter(d, text.data(), text.size(), opt);
    // three chunks of 21 tokens, each with 9 tokens after its prompt: steps of 3 + 1, 3 + 1,
    // then the chunk's last token, drafted
    CHECK_EQ(r.n_chunks, int64_t(3));
    CHECK_EQ(r.n_steps, int64_t(3 * 3));
    CHECK_EQ(r.n_accept, int64_t(3 * 7));
    opt.n_prompt = 21;
    CHECK_THROWS_AS(replay_drafter(d, text.data(), text.size(), opt), InputError, "n_prompt");
    opt.n_prompt = 0;
    CHECK_THROWS_AS(replay_drafter(d, text.data(), text.size(), opt), InputError, "n_prompt");
}

CHECK_MAIN()
