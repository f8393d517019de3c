"""AdaptiveGate and expected_rate: how many drafted tokens to verify, learnt from what was
accepted, alone and inside a drafter."""

from __future__ import annotations

import numpy as np
import pytest

from ngramcache import AdaptiveGate, LookupDrafter
from ngramcache.decoding.gate import expected_rate


def test_gate_skips_when_verification_is_dear_and_drafts_are_poor():
    g = AdaptiveGate([1.0, 1.9, 2.8, 3.7], prior=(1, 4), priors=None)
    s = g.state(3, 2)
    assert g.choose(s, 3) == 0
    # cheap verification: even a poor draft pays
    g2 = AdaptiveGate([1.0, 1.02, 1.04, 1.06], prior=(1, 4), priors=None)
    assert g2.choose(s, 3) == 2  # p = 0.2: E = 1.2, 1.24, 1.248 over cost 1.02, 1.04, 1.06
    g3 = AdaptiveGate([1.0, 1.0, 1.0, 1.0], prior=(1, 4), priors=None)
    assert g3.choose(s, 3) == 3  # free verification: take everything
    g4 = AdaptiveGate([1.0, 1.1], prior=(1, 4), min_gain=0.1, priors=None)
    assert g4.choose(s, 1) == 0  # 1.2 / 1.1 = 1.09 does not beat plain by 10%
    assert AdaptiveGate([1.0, 1.1], prior=(1, 4), min_gain=0.0, priors=None).choose(s, 1) == 1


def test_gate_learns_and_draft_length_follows_acceptance():
    costs = [1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1, 3.4]
    g = AdaptiveGate(costs, prior=(1, 4), priors=None, risk=None)  # what is learnt alone
    s = g.state(8, 1)
    assert g.choose(s, 8) == 0
    for _ in range(50):
        g.observe(s, 8, 8)  # always entirely right
    assert g.choose(s, 8) == 8
    for _ in range(200):
        g.observe(s, 2, 3)  # right twice, then wrong
    k = g.choose(s, 8)
    assert k == 2
    for _ in range(200):
        g.observe(s, 0, 1)  # always wrong
    assert g.choose(s, 8) == 0


def test_gate_carry_forward_extends_drafts_that_have_been_right():
    costs = [1.0] + [1.2 + 0.02 * k for k in range(1, 33)]  # long batches cost little more
    plain, carry = AdaptiveGate(costs, priors=None), AdaptiveGate(costs, carry_forward=True, priors=None)
    for g in (plain, carry):
        s = g.state(8, 1, source=1)
        for _ in range(6):
            g.observe(s, 4, 4)  # proposals of 4 tokens, always right
    s = plain.state(8, 1, source=1)
    assert carry.choose(s, 32) > 16  # positions 5.. take position 4's estimate
    assert plain.choose(s, 32) < 12  # positions 5.. keep the prior (1/3)
    # where nothing has been reached both start from the prior
    fresh = AdaptiveGate(costs, carry_forward=True, priors=None)
    np.testing.assert_allclose(fresh.probabilities(s, 4), AdaptiveGate(costs, priors=None).probabilities(s, 4))
    # a position that turns out wrong holds the drafts back again
    before = carry.choose(s, 32)
    for _ in range(20):
        carry.observe(s, 2, 3)
    assert carry.probabilities(s, 3)[2] < 0.3 and carry.choose(s, 32) < before


def test_gate_states_are_separate_but_pooled():
    g = AdaptiveGate([1.0, 1.4, 1.8], shrink=4.0)
    a, b = g.state(8, 1), g.state(1, 0)
    assert a != b
    for _ in range(100):
        g.observe(a, 2, 2)
        g.observe(b, 0, 1)
    pa, pb = g.probabilities(a, 2), g.probabilities(b, 2)
    assert pa[0] > 0.9 and pb[0] < 0.1
    # an unseen state starts from the pooled estimate
    pc = g.probabilities(g.state(4, 2), 2)
    assert 0.3 < pc[0] < 0.7


def test_gate_choice_maximises_expected_rate():
    costs = [1.0, 1.1, 1.25, 1.5, 2.0]
    g = AdaptiveGate(costs, shrink=0.0, min_gain=0.0)
    s = g.state(4, 1)
    rng = np.random.default_rng(3)
    for _ in range(400):
        n = int(rng.integers(0, 5))
        g.observe(s, n, min(n + 1, 4))
    p = g.probabilities(s, 4)
    k = g.choose(s, 4)
    rates = [expected_rate(p, costs, j) for j in range(5)]
    assert k == int(np.argmax(rates))


def test_gated_drafter_learns_while_skipping():
    # dear verification: the gate starts by skipping, but scores its declined
    # proposals against what followed, and starts drafting once they prove right
    seq = np.tile(np.arange(20, dtype=np.int32), 30)
    g = AdaptiveGate([1.0, 1.6, 2.2, 2.8, 3.4], prior=(1, 4), priors=None)
    d = LookupDrafter(n_draft=4, gate=g)
    d.reset(seq[:5])
    n = 5
    lens = []
    while n < seq.size - 5:
        p = d.propose(4)
        lens.append(p.size)
        k = 0
        while k < p.size and p[k] == seq[n + k]:
            k += 1
        d.accept(seq[n : n + k + 1])
        n += k + 1
    assert lens[0] == 0
    assert d.stats.skipped > 0
    assert lens[-1] == 4 and d.stats.acceptance > 0.9


def test_gate_bad_arguments():
    for bad in ([], [1.0, -1.0], [0.0], [[1.0]], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            AdaptiveGate(bad)
    with pytest.raises(ValueError):
        AdaptiveGate([1.0], decay=0)
    with pytest.raises(ValueError):
        AdaptiveGate([1.0], prior=(0, 1))


def test_priors_draft_a_long_copy_from_the_first_step_and_hold_back_a_short_match():
    costs = [1.0, 1.6, 2.0, 2.5, 2.9, 3.4, 3.8, 4.3, 4.9]  # a CPU's: verifying 8 tokens costs 4.9 one-token steps
    g = AdaptiveGate(costs)
    assert g.choose(g.state(30, 1, source=1), 8) >= 4  # a copy continuing a 30-token match
    assert g.choose(g.state(1, 2, source=2), 8) == 0  # a suffix match of one token
    assert g.choose(g.state(2, 0, source=1), 8) == 0  # a 2-token match after a wrong draft
    flat = AdaptiveGate(costs, priors=None)
    assert flat.choose(flat.state(30, 1, source=1), 8) == 0  # without priors: 1/3 everywhere


def test_the_priors_follow_how_this_text_is_going():
    costs = [1.0, 1.6, 2.0, 2.5, 2.9, 3.4, 3.8, 4.3, 4.9]
    g = AdaptiveGate(costs)
    long_copy = g.state(30, 1, source=1)
    before = g.probabilities(long_copy, 8)
    short = g.state(2, 2, source=1)
    for _ in range(40):
        g.observe(short, 0, 1)  # other states' drafts keep failing: this text is not copying
    after = g.probabilities(long_copy, 8)
    # the first drafted token is what has been scored: its prior is scaled down
    assert after[0] < 0.5 * before[0] and np.allclose(after[1:], before[1:])
    assert g.choose(long_copy, 8) == 0 < AdaptiveGate(costs).choose(long_copy, 8)


def test_long_copies_that_keep_hitting_do_not_raise_a_short_match_prior():
    costs = [1.0, 1.6, 2.0, 2.5, 2.9, 3.4, 3.8, 4.3, 4.9]
    g = AdaptiveGate(costs)
    long_copy, short = g.state(30, 1, source=1), g.state(2, 1, source=1)
    before = g.probabilities(short, 8)
    for _ in range(40):
        g.observe(long_copy, 8, 8)  # a text that copies far better than the priors expect
    assert np.allclose(g.probabilities(short, 8), before)
    assert g.probabilities(long_copy, 8)[0] > before[0]  # the long copies' own estimate rose


def test_prior_table_is_complete_and_within_zero_and_one():
    from ngramcache.decoding import gate_priors

    means = gate_priors.prior_means(40)
    g = AdaptiveGate([1.0, 2.0])
    assert len(means) == len(g._hits)
    assert all(0.0 < m < 1.0 for row in means for m in row)
    assert set(gate_priors.TABLE) == {(s, b, p) for s in range(AdaptiveGate.N_SOURCES)
                                      for b in range(len(AdaptiveGate._LEN_BUCKETS)) for p in range(3)}


def test_priors_must_be_known():
    with pytest.raises(ValueError, match="priors"):
        AdaptiveGate([1.0, 2.0], priors="optimistic")


# -- the curve checked against the run's own verification times ------------------------

STALE = [1.0, 1.5, 2.0, 2.5, 3.0]  # a stored curve flatter than the machine now


def test_verify_times_scale_the_curves_extra_cost_by_what_batches_really_take():
    from ngramcache.decoding.gate import VerifyTimes

    vt = VerifyTimes(decay=1.0, weight=8.0, min_plain=3)
    vt.observe(5, 6.0, 3.0)  # no unit yet: a batch alone says nothing, and is not kept
    assert vt.scale == 1.0 and vt.plain_seconds is None
    vt.observe(1, 1.0, 1.0)
    vt.observe(1, 50.0, 1.0)  # one slow step among the first does not set the unit: their median does
    vt.observe(1, 1.0, 1.0)
    assert vt.plain_seconds == pytest.approx(1.0) and vt.scale == 1.0
    vt.observe(5, 6.0, 3.0)
    # one batch of 5 that took 6 units where the curve says 3: extra 5 seen against 2,
    # shrunk with 8 units of the curve's own: (5 + 8) / (2 + 8)
    assert vt.scale == pytest.approx(1.3)
    for _ in range(200):
        vt.observe(5, 6.0, 3.0)
    # (the scale moves in steps of over 1 %, so that gates rescale their curves rarely)
    assert vt.scale == pytest.approx((201 * 5 + 8) / (201 * 2 + 8), rel=0.01)
    # cheaper than the curve says: the scale falls below 1
    cheap = VerifyTimes(decay=1.0, weight=8.0, min_plain=3)
    for _ in range(3):
        cheap.observe(1, 1.0, 1.0)
    for _ in range(50):
        cheap.observe(5, 2.0, 3.0)
    assert 0.5 < cheap.scale < 0.6


def test_a_hiccup_counts_as_at_most_twice_the_expected_time():
    from ngramcache.decoding.gate import VerifyTimes

    vt = VerifyTimes(decay=1.0, min_plain=3)
    for _ in range(3):
        vt.observe(1, 1.0, 1.0)
    vt.observe(1, 1000.0, 1.0)  # the process was descheduled for a while
    assert vt.plain_seconds == pytest.approx(5.0 / 4)
    vt.observe(17, 1e6, 8.0)  # a long batch hit by the same: counts as twice its expected time
    # 2 x 8 steps of 1.25 s: an extra 15 steps against the curve's 7, with 16 of the curve's own
    assert vt.scale == pytest.approx((15 + 16) / (7 + 16))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        vt.observe(1, bad, 1.0)  # not a time: ignored
    assert vt.plain_seconds == pytest.approx(5.0 / 4)


def test_after_a_bad_stretch_plain_steps_bring_the_scale_back():
    from ngramcache.decoding.gate import VerifyTimes

    vt = VerifyTimes()
    for _ in range(5):
        vt.observe(1, 1.0, 1.0)
    for _ in range(10):
        vt.observe(9, 8.0, 4.0)  # batches twice as dear as the curve says
    high = vt.scale
    assert high > 1.5
    for _ in range(200):  # the gate stopped drafting: only plain steps now
        vt.observe(1, 1.0, 1.0)
    assert vt.scale < 1.05


def test_a_gate_on_a_stale_curve_drafts_less_once_batches_turn_out_dearer():
    g = AdaptiveGate(STALE, prior=(19, 1), priors=None, risk=None)
    s = g.state(8, 1)
    assert g.choose(s, 4) == 4  # p = 0.95: E(4) = 4.52 over 3.0 on the stored curve
    for _ in range(5):
        g.observe_verify(1, 0.010)
    for _ in range(60):
        g.observe_verify(5, 0.045)  # 4.5 steps, not 3.0: the extra cost is 1.75 times the curve's
    assert g.verify_times.scale > 1.5
    assert g.effective_costs[4] > 4.0
    assert g.choose(s, 4) < 4
    # the curve as given, not checked
    fixed = AdaptiveGate(STALE, prior=(19, 1), priors=None, verify_times=False, risk=None)
    for _ in range(30):
        fixed.observe_verify(5, 0.045)
    assert fixed.verify_times is None and fixed.choose(s, 4) == 4
    assert fixed.effective_costs.tolist() == fixed.costs.tolist()
    with pytest.raises(TypeError, match="verify_times"):
        AdaptiveGate(STALE, verify_times="yes")


def test_gates_can_share_one_machines_verification_times():
    from ngramcache.decoding.gate import VerifyTimes

    vt = VerifyTimes()
    a, b = AdaptiveGate(STALE, verify_times=vt), AdaptiveGate(STALE, verify_times=vt)
    for _ in range(5):
        a.observe_verify(1, 0.010)
    for _ in range(10):
        a.observe_verify(5, 0.045)
    assert b.verify_times is vt and b.effective_costs[4] == a.effective_costs[4] > 3.0
    a.observe_verify(40, 1.0)  # beyond the curve: not used
    assert vt.scale == pytest.approx(a.verify_times.scale)


def test_drafts_that_lost_time_raise_the_margin_until_won_back_or_forgotten():
    costs = [1.0, 1.5, 2.0, 2.5, 3.0]
    g = AdaptiveGate(costs, prior=(9, 1), priors=None, verify_times=False)  # p = 0.9
    s = g.state(8, 1)
    assert g.choose(s, 4) == 3  # E(3) = 3.44 over 2.5: 1.38, past the 5 % margin
    for _ in range(3):
        g.settled(4, 0)  # three drafts of 4, all wrong: 3 x (1 - 3.0) steps lost
    assert g.profit == pytest.approx(-2.0 * (1 + 0.99 + 0.99 ** 2))
    assert g.choose(s, 4) == 3  # 1.38 still beats the largest margin, 1.2
    g2 = AdaptiveGate(costs, prior=(3, 1), priors=None, verify_times=False)  # p = 0.75
    assert g2.choose(s, 2) == 1  # E(1) = 1.75 over 1.5: 1.17
    g2.settled(2, 0)  # lost 1 step: the margin is 0.05 + 1 / 2.5, at most 0.2
    assert g2.choose(s, 2) == 0
    for _ in range(200):
        g2.settled(0, 0)  # plain steps: the deficit decays
    assert g2.choose(s, 2) == 1
    g2.settled(2, 0)
    assert g2.choose(s, 2) == 0
    g2.settled(2, 2)
    g2.settled(2, 2)  # won back: 1 + 2 - 2.0 each
    assert g2.profit > 0 and g2.choose(s, 2) == 1
    for bad in (dict(loss_scale=0), dict(loss_decay=0), dict(loss_decay=1.5), dict(max_margin=-0.1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AdaptiveGate(costs, **bad)


def test_a_drafter_reports_each_settled_draft_to_its_gate():
    from ngramcache import CopyDrafter

    gate = AdaptiveGate([1.0, 1.5, 2.0, 2.5, 3.0], verify_times=False)
    seen = []
    gate.settled = lambda k, n: seen.append((k, n))
    d = CopyDrafter(n_draft=4, gate=gate)
    d.reset(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], dtype=np.int32))
    draft = d.propose(4)
    assert draft.tolist() == [4, 5, 6, 7]  # a real draft, so the report below is of one
    d.accept(np.array([4, 5, 9], dtype=np.int32))  # two drafted tokens kept, then the model's own
    assert seen == [(draft.size, min(2, draft.size))]
    d.propose(0)
    d.accept(np.array([1], dtype=np.int32))
    assert seen[-1] == (0, 0)  # a plain step is reported too: the deficit decays with steps


def test_a_draft_risks_little_at_first_and_more_as_drafts_are_kept_whole():
    costs = [1.0, 1.68, 2.02, 2.6, 3.05, 3.39, 3.92, 4.4, 5.05, 5.69, 5.97, 6.24, 6.57, 6.9, 7.23, 7.7, 8.16]
    g = AdaptiveGate(costs, prior=(99, 1), priors=None, verify_times=False)  # p = 0.99
    s = g.state(8, 1)
    # a first draft may lose at most 2 one-token steps: cost(k + 1) - 1 <= 2, so k <= 3
    assert g.choose(s, 16) == 3
    g.settled(3, 3)  # kept whole: 4 steps may be risked
    assert g.choose(s, 16) == 7  # cost(8) = 4.4
    best = AdaptiveGate(costs, prior=(99, 1), priors=None, risk=None).choose(s, 16)
    assert best == 14  # the best length on this curve, bound or not
    g.settled(7, 7)
    assert g.choose(s, 16) == best
    g.settled(14, 0)  # its first token wrong: back to 4
    assert g.choose(s, 16) == 7
    g.settled(7, 3)  # partly kept: unchanged
    assert g.choose(s, 16) == 7
    g.settled(7, 0)
    g.settled(3, 0)
    assert g.choose(s, 16) == 3  # never below the first bound
    # where a batch costs little more than one token (transformers on a CPU, a GPU) the bound
    # does not bind
    flat = [1.0] + [1.6 + 0.03 * k for k in range(32)]
    assert AdaptiveGate(flat, prior=(99, 1), priors=None).choose(s, 32) == 32
    with pytest.raises(ValueError, match="risk"):
        AdaptiveGate(costs, risk=0)
