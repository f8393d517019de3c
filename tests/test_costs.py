"""Verification costs (ngramcache.decoding.costs): the curve learnt while decoding (a prior at
once, medians per batch size with a spike filter, kept per key and saved atomically), the
explicit calibration over a timing hook, and the store keyed by backend, model, build and
threads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ngramcache.decoding import costs as C
from ngramcache.decoding.costs import CostKey, LearnedCosts, calibrate, learned_costs
from ngramcache.decoding.priors import cost_prior
from support import FakeModel


class Clock:
    """A time_batch hook whose k-batch takes ``base + k * step`` seconds, except the
    timings listed in ``spikes`` (call index -> seconds): a busy machine's stolen time."""

    def __init__(self, base=1.0, step=0.25, spikes=None):
        self.base, self.step, self.spikes = base, step, dict(spikes or {})
        self.calls: list[int] = []

    def __call__(self, k):
        i = len(self.calls)
        self.calls.append(k)
        return self.spikes.get(i, self.base + k * self.step)


def test_batch_sizes_and_the_non_decreasing_curve():
    assert C.batch_sizes(1) == [1]
    assert C.batch_sizes(5) == [1, 2, 3, 4, 5]
    g = C.batch_sizes(33)
    assert g[:8] == list(range(1, 9)) and g[-1] == 33 and g == sorted(set(g)) and len(g) < 20
    assert C.non_decreasing([1, 2, 3]) == [1, 2, 3]
    assert C.non_decreasing([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]  # one slow timing is averaged away
    assert C.non_decreasing([1, 5, 2, 2, 2, 6]) == [1, 2.75, 2.75, 2.75, 2.75, 6]


def test_calibrate_interleaves_rounds_and_interpolates_between_timed_sizes():
    clock = Clock()
    cal = calibrate(clock, 12, repeats=3, progress=False)
    sizes = C.batch_sizes(12)
    assert cal.sizes == sizes and cal.rounds == 3 and cal.spread == 0.0
    assert clock.calls == sizes * 4  # a warm-up round, then three, each over every size in turn
    assert cal.costs == pytest.approx([1.0 + k * 0.25 for k in range(1, 13)])  # linear: interpolation is exact


def test_one_spike_does_not_move_the_median():
    n = len(C.batch_sizes(6))
    clock = Clock(spikes={n + 2: 50.0})  # first measured round, third size
    cal = calibrate(clock, 6, repeats=5, progress=False)
    assert cal.costs == pytest.approx([1.0 + k * 0.25 for k in range(1, 7)])
    assert cal.rounds == 5 and cal.spread == 0.0


def test_calibrate_bad_arguments():
    with pytest.raises(ValueError, match="max_batch"):
        calibrate(Clock(), 0)
    with pytest.raises(ValueError, match="repeats"):
        calibrate(Clock(), 4, repeats=0)
    with pytest.raises(ValueError, match=r"time_batch\(1\) returned -1"):
        calibrate(lambda k: -1.0, 4, progress=False)


def test_backend_timer_times_a_batch_and_leaves_the_cache_empty():
    fm = FakeModel(n_batch=16)
    with C.backend_timer(fm, 5, n_context=40) as time_batch:
        assert len(fm.kv) == 40
        assert time_batch(5) > 0 and len(fm.kv) == 40 and fm.decodes[-1] == 5
    assert fm.kv == []
    with C.backend_timer(FakeModel(n_ctx=20), 5, n_context=512) as time_batch:  # the context is what fits
        time_batch(5)
    with pytest.raises(ValueError, match="max_batch"):
        with C.backend_timer(fm, 17):
            pass


def _key(model="m.gguf|10|0"):
    return CostKey(backend="fake", model=model, build="b1", threads="t2")


def test_store_keeps_costs_per_key(tmp_path):
    path = str(tmp_path / "c" / "costs.json")
    assert C.read_costs(_key(), path) is None
    C.write_costs(_key(), [0.01, 0.012], path)
    C.write_costs(_key("other"), [0.02, 0.03], path)
    assert C.read_costs(_key(), path) == [0.01, 0.012]
    assert C.read_costs(str(_key("other")), path) == [0.02, 0.03]
    table = json.loads((tmp_path / "c" / "costs.json").read_text())
    assert sorted(table) == sorted([str(_key()), str(_key("other"))])
    assert str(_key()).split("|") == ["v4", "fake", "m.gguf", "10", "0", "b1", "t2"]
    with pytest.raises(ValueError, match="costs"):
        C.write_costs(_key(), [0.1, float("nan")], path)


def test_extend_costs():
    assert C.extend_costs([1.0, 1.5, 1.75], 2) == [1.0, 1.5]
    assert C.extend_costs([1.0, 1.5], 4) == [1.0, 1.5, 2.0, 2.5]  # on with the last step
    assert C.extend_costs([2.0], 3) == [2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="costs"):
        C.extend_costs([1.0, -1.0], 3)


# -- learnt while decoding -------------------------------------------------------------

PRIOR = [1.0, 2.0, 3.0, 4.0, 5.0]


def feed(costs: LearnedCosts, n_tokens: int, seconds: float, times: int) -> None:
    for _ in range(times):
        costs.observe(n_tokens, seconds)


def test_a_curve_starts_as_its_prior_and_moves_to_the_medians_it_sees():
    c = LearnedCosts(PRIOR)
    assert c.curve() == PRIOR and not c.learnt
    feed(c, 1, 0.010, C.MIN_PLAIN)  # the unit: one-token steps of 10 ms
    feed(c, 3, 0.020, 36)  # a batch of 3 costs 2 steps here, where the prior says 3
    curve = c.curve()
    assert c.learnt and curve[0] == 1.0
    # its own median, shrunk towards the prior as if the prior were PRIOR_SAMPLES times
    n = 36
    scale = (C.PRIOR_SAMPLES + n * (2.0 - 1.0) / (3.0 - 1.0)) / (C.PRIOR_SAMPLES + n)
    assert curve[2] == pytest.approx((n * 2.0 + C.PRIOR_SAMPLES * (1 + scale * 2.0)) / (n + C.PRIOR_SAMPLES))
    # sizes never verified follow the prior with its extra cost scaled as the verified ones say
    assert curve[4] == pytest.approx(1.0 + scale * 4.0)
    assert curve == sorted(curve)


def test_spikes_do_not_move_the_curve_and_a_busy_machine_still_gets_one():
    quiet, busy = LearnedCosts(PRIOR), LearnedCosts(PRIOR)
    rng = np.random.default_rng(1)
    for step in range(600):
        k = 1 if step % 3 else 5
        t = 0.010 * (1 + 0.5 * (k - 1))  # a batch of 5 costs 3 steps
        quiet.observe(k, t)
        # busy: every time stretched up to 1.5x, and one in five descheduled for 20x as long
        busy.observe(k, t * (1 + 0.5 * rng.random()) * (20.0 if rng.random() < 0.2 else 1.0))
    assert quiet.curve()[4] == pytest.approx(3.0, rel=0.02)
    assert busy.curve()[4] == pytest.approx(3.0, rel=0.2)  # noisy, not absent
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        busy.observe(1, bad)  # not a time: left out
    busy.observe(99, 1.0)  # beyond the curve: left out
    assert busy.n_observed == 600


def test_one_descheduled_step_counts_as_at_most_spike_times_its_median():
    c = LearnedCosts(PRIOR, spike=3.0)
    feed(c, 1, 0.010, C.MIN_PLAIN)
    c.observe(1, 10.0)
    assert max(c._times[0]) == pytest.approx(0.030)


def test_learned_costs_start_at_once_from_the_store_or_the_prior_for_the_size(tmp_path):
    path = str(tmp_path / "costs.json")
    key = _key("learnt")
    fresh = learned_costs(key, 6, n_params=135_000_000, path=path)
    assert fresh.curve() == pytest.approx(C.extend_costs(cost_prior("fake", 135_000_000), 6))
    assert learned_costs(key, 4, path=path) is fresh  # one curve per key in a process
    feed(fresh, 1, 0.010, 10)
    feed(fresh, 2, 0.013, 10)
    assert fresh.save() and not fresh.save()  # nothing new since: no second write
    stored = C.read_costs(key, path)
    assert stored == pytest.approx(fresh.curve())
    # the next process starts from what was stored
    C._CURVES.clear()
    again = learned_costs(key, 6, path=path)
    assert again is not fresh and again.curve() == pytest.approx(stored)
    # a curve measured by the earlier store version is a prior too
    old = _key("old")
    C.write_costs(old.versioned("v3"), [0.02, 0.03, 0.04], path)
    assert learned_costs(old, 3, path=path).curve() == pytest.approx([1.0, 1.5, 2.0])
    # no key: a fresh curve, never kept
    assert learned_costs(None, 3, path=path).key is None


def test_the_size_prior_is_the_nearest_model_of_the_backend():
    small, large = cost_prior("llama.cpp", 130_000_000), cost_prior("llama.cpp", 500_000_000)
    assert small[0] == large[0] == 1.0 and small != large and small[16] < large[16]
    assert cost_prior("llama.cpp", None) in (small, large, cost_prior("llama.cpp", 268_000_000))
    # a backend without a measured curve: the steepest (a cautious start)
    known = [cost_prior("llama.cpp", n) for n in (130_000_000, 270_000_000, 500_000_000)]
    assert cost_prior("no-such-backend", 1) == max(known, key=lambda c: c[1])  # dearest first draft token
    assert cost_prior("transformers", 135_000_000)[32] < 3.0


def test_saving_is_atomic_and_survives_an_unwritable_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    c = LearnedCosts(PRIOR, key=_key(), path=str(blocker / "costs.json"))
    feed(c, 1, 0.01, 10)
    feed(c, 2, 0.02, 10)
    assert c.save() is False  # the folder is a file: nothing written, nothing raised
    c.replace([0.01, 0.02, 0.03, 0.04, 0.05, 0.06])  # a measurement: starts again from it
    assert c.curve() == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0]) and not c.learnt
    with pytest.raises(ValueError, match="covers"):
        c.replace([1.0, 2.0])
    with pytest.raises(ValueError, match="spike"):
        LearnedCosts(PRIOR, spike=1.0)
