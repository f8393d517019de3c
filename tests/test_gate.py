"""The gate (ngramcache.decoding.gate): how many drafted tokens to verify, learnt from what was
accepted; its settings; the gated drafter in front of any drafter; and the layers (a drafter
is a leaf: nothing under drafters/ imports decoding/)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from ngramcache import CopyDrafter, LookupDrafter
from ngramcache.decoding.costs import LearnedCosts
from ngramcache.decoding.gate import (Gate, GatedDrafter, GateSettings, Priors, expected_rate, gated_drafter,
                                      why_no_drafts)
from ngramcache.decoding.priors import N_STATES, acceptance_means
from ngramcache.drafters.base import Proposal, Source

FLAT = GateSettings(priors=Priors.FLAT, risk=None)
CPU = [1.0, 1.68, 2.02, 2.6, 3.05, 3.39, 3.92, 4.4, 5.05, 5.69, 5.97, 6.24, 6.57, 6.9, 7.23, 7.7, 8.16]


def train(g: Gate, state: int, n_right: int, n_scored: int, times: int) -> None:
    for _ in range(times):
        g.observe(state, n_right, n_scored)


def test_gate_skips_when_verification_is_dear_and_drafts_are_poor():
    s = Gate.state(3, 2, Source.LOOKUP)
    assert Gate([1.0, 1.9, 2.8, 3.7], FLAT).choose(s, 3) == 0  # p = 1/3 against 1.9x a step
    for costs in ([1.0, 1.02, 1.04, 1.06], [1.0, 1.0, 1.0, 1.0], [1.0, 1.3, 1.5, 1.6]):
        g = Gate(costs, GateSettings(priors=Priors.FLAT, risk=None, min_gain=0.0))
        p = g.probabilities(s, 3)
        rates = [expected_rate(p, costs, k) for k in range(4)]
        assert g.choose(s, 3) == int(np.argmax(rates))  # the best expected rate
    # a draft that does not beat plain by min_gain is not sent
    assert Gate([1.0, 1.25], GateSettings(priors=Priors.FLAT, min_gain=0.1)).choose(s, 1) == 0
    assert Gate([1.0, 1.25], GateSettings(priors=Priors.FLAT, min_gain=0.0)).choose(s, 1) == 1


def test_gate_learns_and_draft_length_follows_acceptance():
    costs = [1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1, 3.4]
    g = Gate(costs, FLAT)
    s = g.state(8, 1, Source.COPY)
    assert g.choose(s, 8) == 0
    train(g, s, 8, 8, 50)  # always entirely right
    assert g.choose(s, 8) == 8
    train(g, s, 2, 3, 200)  # right twice, then wrong
    assert g.choose(s, 8) == 2
    train(g, s, 0, 1, 200)  # always wrong
    assert g.choose(s, 8) == 0


def test_gate_states_are_separate_but_pooled():
    g = Gate([1.0, 1.4, 1.8], FLAT)
    a, b = g.state(8, 1, Source.COPY), g.state(1, 0, Source.COPY)
    assert a != b
    for _ in range(100):
        g.observe(a, 2, 2)
        g.observe(b, 0, 1)
    assert g.probabilities(a, 2)[0] > 0.9 and g.probabilities(b, 2)[0] < 0.1
    assert 0.3 < g.probabilities(g.state(4, 2, Source.COPY), 2)[0] < 0.7  # an unseen state: the pool


def test_priors_draft_a_long_copy_from_the_first_step_and_hold_back_a_short_match():
    costs = [1.0, 1.6, 2.0, 2.5, 2.9, 3.4, 3.8, 4.3, 4.9]
    g = Gate(costs, GateSettings(risk=None))
    assert g.choose(g.state(30, 1, Source.COPY), 8) >= 4  # a copy continuing a 30-token match
    assert g.choose(g.state(1, 2, Source.SUFFIX), 8) == 0  # a suffix match of one token
    assert g.choose(g.state(2, 0, Source.COPY), 8) == 0  # a 2-token match after a wrong draft
    flat = Gate(costs, FLAT)
    assert flat.choose(flat.state(30, 1, Source.COPY), 8) == 0  # without the table: 1/3 everywhere


def test_the_priors_follow_how_this_text_is_going():
    costs = [1.0, 1.6, 2.0, 2.5, 2.9, 3.4, 3.8, 4.3, 4.9]
    g = Gate(costs, GateSettings(risk=None))
    long_copy, short = g.state(30, 1, Source.COPY), g.state(2, 2, Source.COPY)
    before = g.probabilities(long_copy, 8)
    train(g, short, 0, 1, 40)  # other states' drafts keep failing: this text is not copying
    after = g.probabilities(long_copy, 8)
    assert after[0] < 0.5 * before[0] and np.allclose(after[1:], before[1:])
    assert g.choose(long_copy, 8) == 0 < Gate(costs, GateSettings(risk=None)).choose(long_copy, 8)
    # a text that copies better than the priors expect does not raise another state's prior
    g2 = Gate(costs)
    before = g2.probabilities(short, 8)
    train(g2, long_copy, 8, 8, 40)
    assert np.allclose(g2.probabilities(short, 8), before)


def test_the_prior_table_covers_every_state_within_zero_and_one():
    means = acceptance_means(40)
    assert len(means) == N_STATES == len(Source) * 4 * 3
    assert all(0.0 < m < 1.0 for row in means for m in row)
    # a longer match is never given a lower prior than a shorter one
    for src in Source:
        for prev in range(3):
            rows = [means[Gate.state(lo, prev, src)] for lo in (1, 2, 4, 8)]
            assert all(a[j] <= b[j] for a, b in zip(rows, rows[1:]) for j in range(40))


def test_settings_are_checked_and_frozen():
    for bad, word in ((dict(min_gain=-0.1), "min_gain"), (dict(decay=0), "decay"), (dict(decay=1.5), "decay"),
                      (dict(prior_weight=0), "prior_weight"), (dict(risk=0), "risk"),
                      (dict(cost_window=2), "cost_window"), (dict(spike=1.0), "spike")):
        with pytest.raises(ValueError, match=word):
            GateSettings(**bad)
    with pytest.raises(TypeError, match="Priors"):
        GateSettings(priors="table")
    s = GateSettings()
    with pytest.raises(AttributeError):
        s.min_gain = 0.2
    assert len(s.__dataclass_fields__) <= 8
    for bad in ([], [1.0, -1.0], [0.0], [[1.0]], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            Gate(bad)
    with pytest.raises(TypeError, match="GateSettings"):
        Gate([1.0, 2.0], {"min_gain": 0.1})


def test_a_draft_risks_little_at_first_and_more_as_drafts_are_kept_whole():
    g = Gate(CPU, GateSettings(priors=Priors.FLAT, learn_costs=False))
    s = g.state(8, 1, Source.COPY)
    train(g, s, 16, 16, 200)  # drafts in this state are nearly always right
    # a first draft may lose at most 2 one-token steps: cost(k + 1) - 1 <= 2, so k <= 3
    assert g.choose(s, 16) == 3
    g.settled(3, 3)  # kept whole: 4 steps may be risked
    assert g.choose(s, 16) == 7  # cost(8) = 4.4
    best = Gate(CPU, GateSettings(priors=Priors.FLAT, learn_costs=False, risk=None))
    train(best, s, 16, 16, 200)
    g.settled(7, 7)
    g.settled(15, 15)
    assert g.choose(s, 16) == best.choose(s, 16) == 16
    g.settled(16, 0)  # its first token wrong: the bound halves
    assert g.choose(s, 16) < 16
    for _ in range(6):
        g.settled(3, 0)
    assert g.choose(s, 16) == 3  # never below the first bound
    g.settled(3, 1)  # partly kept: unchanged
    assert g.choose(s, 16) == 3
    # where a batch costs little more than one token the bound does not bind
    flat = [1.0] + [1.6 + 0.03 * k for k in range(32)]
    f = Gate(flat, GateSettings(priors=Priors.FLAT))
    train(f, s, 32, 32, 200)
    assert f.choose(s, 32) == 32


def test_the_gate_decides_on_the_curve_it_learns():
    # a prior curve far flatter than this machine: the gate drafts at first, then the
    # verification times teach it that batches are dear, and it stops
    costs = LearnedCosts([1.0, 1.05, 1.1, 1.15, 1.2], window=64)
    g = Gate(costs, GateSettings(priors=Priors.FLAT, risk=None))
    s = g.state(8, 1, Source.COPY)
    train(g, s, 2, 3, 300)  # two right, then wrong: p = (1, 1, 0)
    assert g.choose(s, 4) == 2
    for _ in range(10):
        g.verified(1, 0.010)
        g.verified(3, 0.040)  # a batch of 3 costs 4 one-token steps here
    assert g.curve()[2] > 3.0
    assert g.choose(s, 4) == 0
    # the curve as given: the same times change nothing
    fixed = Gate([1.0, 1.05, 1.1, 1.15, 1.2], GateSettings(priors=Priors.FLAT, risk=None, learn_costs=False))
    train(fixed, s, 2, 3, 300)
    for _ in range(10):
        fixed.verified(1, 0.010)
        fixed.verified(3, 0.040)
    assert fixed.choose(s, 4) == 2


def walk(d, seq, start, n_draft):
    """Drive a drafter over ``seq`` as a loop would: (draft lengths, tokens drafted)."""
    d.reset(seq[:start])
    n, lens = start, []
    while n < seq.size - n_draft - 1:
        p = d.propose(n_draft)
        lens.append(int(p.size))
        k = 0
        while k < p.size and p[k] == seq[n + k]:
            k += 1
        d.verified(k + 1, 0.01 * (1 + k))
        d.accept(seq[n : n + k + 1])
        n += k + 1
    return lens


def test_a_gated_drafter_learns_while_it_declines():
    # dear verification: the gate starts by declining, but scores its declined proposals
    # against what followed, and drafts once they prove right
    seq = np.tile(np.arange(20, dtype=np.int32), 30)
    d = GatedDrafter(LookupDrafter(n_draft=4), Gate([1.0, 1.6, 2.2, 2.8, 3.4], GateSettings(priors=Priors.FLAT,
                                                                                             learn_costs=False)))
    lens = walk(d, seq, 5, 4)
    assert lens[0] == 0 and d.stats.skipped > 0 and d.declined == d.stats.skipped
    assert lens[-1] == 4 and d.stats.acceptance > 0.9
    assert d.why_no_drafts() is None  # it drafted


def test_a_gated_drafter_says_why_it_drafted_nothing():
    seq = np.tile(np.arange(20, dtype=np.int32), 3)
    never = GatedDrafter(CopyDrafter(n_draft=4), Gate([1.0, 50.0, 60.0, 70.0, 80.0], GateSettings(learn_costs=False)))
    walk(never, seq, 25, 4)
    assert never.stats.drafted == 0 and never.offered > 0
    why = never.why_no_drafts()
    assert why.startswith("nothing was drafted: the gate declined all") and "50.00x" in why
    assert why_no_drafts(never) == why
    fresh = GatedDrafter(CopyDrafter(n_draft=4), Gate([1.0, 1.1, 1.2, 1.3, 1.4]))
    walk(fresh, np.arange(100, dtype=np.int32), 5, 4)  # nothing repeats: nothing to propose
    assert fresh.offered == 0 and "nothing to propose" in fresh.why_no_drafts()
    assert why_no_drafts(None) is None


def test_a_gated_drafter_reports_each_settled_draft_to_its_gate():
    gate = Gate([1.0, 1.5, 2.0, 2.5, 3.0], GateSettings(risk=None))
    seen = []
    gate.settled = lambda k, n: seen.append((k, n))
    d = GatedDrafter(CopyDrafter(n_draft=4), gate)
    d.reset(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], dtype=np.int32))
    draft = d.propose(4)
    assert draft.tolist() == [4, 5, 6, 7]  # a real draft, so the report below is of one
    d.accept(np.array([4, 5, 9], dtype=np.int32))  # two drafted tokens kept, then the model's own
    assert seen == [(4, 2)] and d.stats.accepted == 2 and d.stats.drafted == 4


def test_one_call_per_step_gives_the_proposal_its_confidence_and_its_source():
    d = CopyDrafter(n_draft=4)
    d.reset(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], dtype=np.int32))
    p = d.proposal(4)
    assert isinstance(p, Proposal) and p.tokens.tolist() == [4, 5, 6, 7]
    assert p.source is Source.COPY and p.confidence == 3
    assert d.stats.drafted == 0  # proposal() counts nothing; propose() does
    assert LookupDrafter(n_draft=4).proposal(4).source is Source.LOOKUP


def test_a_gated_drafter_wraps_a_drafter_of_the_bare_protocol():
    class Repeat:  # proposes the last token, n times; no proposal(): a lookup of its length
        def __init__(self):
            from ngramcache.drafters.base import DraftStats

            self.stats, self.last, self.n_draft = DraftStats(), 0, 4

        def reset(self, prompt):
            self.last = int(prompt[-1])

        def propose(self, n):
            return np.full(n, self.last, dtype=np.int32)

        def accept(self, tokens):
            self.last = int(tokens[-1])

    d = GatedDrafter(Repeat(), Gate([1.0, 1.0, 1.0, 1.0, 1.0], FLAT))
    walk(d, np.full(60, 7, dtype=np.int32), 3, 4)
    assert d.stats.drafted > 0 and d.stats.acceptance == 1.0
    with pytest.raises(TypeError, match="Drafter"):
        GatedDrafter(object(), Gate([1.0, 2.0]))
    with pytest.raises(TypeError, match="Gate"):
        GatedDrafter(CopyDrafter(), object())


def test_gated_drafter_builds_the_named_drafter_behind_a_gate():
    d = gated_drafter([1.0, 1.5, 2.0], "lookup", 8)
    assert isinstance(d, GatedDrafter) and isinstance(d.drafter, LookupDrafter) and d.n_draft == 8
    assert d.gate.max_len == 8  # the costs extended to n_draft + 1
    again = gated_drafter([1.0, 1.5, 2.0], "copy", 8, gate=d.gate)
    assert again.gate is d.gate  # an earlier turn's gate goes on
    assert isinstance(gated_drafter(None, "copy", 8), CopyDrafter)  # no costs: no gate
    with pytest.raises(ValueError):
        gated_drafter([1.0, 2.0], "no-such-drafter", 4)


def test_nothing_under_drafters_imports_decoding():
    # a drafter is a leaf: the gate in decoding/ wraps drafters, never the other way round
    root = pathlib.Path(__import__("ngramcache").__file__).parent / "drafters"
    crossing = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            crossing += [f"{path.name}: {n}" for n in names if n.startswith("ngramcache.decoding")]
    assert not crossing
