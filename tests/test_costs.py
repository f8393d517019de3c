"""Verification costs (ngramcache.decoding.costs): the one calibration over a timing hook
(medians, more rounds while noisy, a non-decreasing curve), the store keyed by backend,
model, build and threads, and the gated drafter built on costs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ngramcache import CopyDrafter, LookupDrafter
from ngramcache.decoding import costs as C
from ngramcache.decoding.costs import CostKey, calibrate, gated_drafter, stored_costs
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
    assert cal.sizes == sizes and cal.rounds == 3 and not cal.noisy and cal.spread == 0.0
    assert clock.calls == sizes * 4  # a warm-up round, then three, each over every size in turn
    assert cal.costs == pytest.approx([1.0 + k * 0.25 for k in range(1, 13)])  # linear: interpolation is exact


def test_one_spike_does_not_move_the_median():
    n = len(C.batch_sizes(6))
    clock = Clock(spikes={n + 2: 50.0})  # first measured round, third size
    cal = calibrate(clock, 6, repeats=5, progress=False)
    assert cal.costs == pytest.approx([1.0 + k * 0.25 for k in range(1, 7)])
    assert not cal.noisy and cal.rounds == 5


def test_noisy_timings_get_more_rounds_then_are_flagged(capsys):
    n = len(C.batch_sizes(4))
    # every other round of size 2 is slow: its spread never settles
    clock = Clock(spikes={r * n + 1: 9.0 for r in range(1, 40, 2)})
    cal = calibrate(clock, 4, repeats=3, progress=False)
    assert cal.noisy and cal.rounds == 6 and cal.spread > C.MAX_SPREAD  # 2 * repeats by default
    assert cal.costs == sorted(cal.costs)
    assert capsys.readouterr().err == ""  # progress=False: nothing on stderr
    cal = calibrate(Clock(spikes={r * n + 1: 9.0 for r in range(1, 40, 2)}), 4, repeats=3, max_rounds=12,
                    progress=False)
    assert cal.rounds == 12


def test_noisy_timings_are_said_on_stderr_when_progress_is_on(capsys):
    n = len(C.batch_sizes(3))
    calibrate(Clock(spikes={r * n: 30.0 for r in range(1, 40, 2)}), 3, repeats=2)
    assert "timings of one batch size varied by" in capsys.readouterr().err


def test_calibrate_bad_arguments():
    with pytest.raises(ValueError, match="max_batch"):
        calibrate(Clock(), 0)
    with pytest.raises(ValueError, match="repeats"):
        calibrate(Clock(), 4, repeats=0)
    with pytest.raises(ValueError, match="max_rounds"):
        calibrate(Clock(), 4, repeats=3, max_rounds=2)
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
    assert str(_key()).split("|") == ["v3", "fake", "m.gguf", "10", "0", "b1", "t2"]
    with pytest.raises(ValueError, match="costs"):
        C.write_costs(_key(), [0.1, float("nan")], path)


def test_stored_costs_measures_once_and_keeps_only_quiet_measurements(tmp_path):
    path = str(tmp_path / "costs.json")
    measured = []

    def measure(noisy):
        def run(n):
            measured.append(n)
            return C.Calibration(costs=[1.0 + k for k in range(n)], sizes=list(range(1, n + 1)),
                                 medians=[1.0 + k for k in range(n)], rounds=5, spread=0.9 if noisy else 0.01,
                                 noisy=noisy, seconds=0.1)
        return run

    assert stored_costs(_key(), measure(False), 4, path=path) == [1.0, 2.0, 3.0, 4.0]
    assert stored_costs(_key(), measure(False), 3, path=path) == [1.0, 2.0, 3.0]  # a prefix of what is kept
    assert measured == [4]
    assert stored_costs(_key(), measure(False), 6, path=path) == [1.0 + k for k in range(6)]  # longer: measured
    assert stored_costs(_key(), measure(False), 2, refresh=True, path=path) == [1.0, 2.0]
    assert measured == [4, 6, 2]
    # noisy costs are not kept on disk, but this process does not measure them again
    assert stored_costs(_key("noisy"), measure(True), 3, path=path) == [1.0, 2.0, 3.0]
    assert stored_costs(_key("noisy"), measure(True), 3, path=path) == [1.0, 2.0, 3.0]
    assert measured == [4, 6, 2, 3] and C.read_costs(_key("noisy"), path) is None
    # no key: measured every time
    stored_costs(None, measure(False), 2, path=path)
    stored_costs(None, measure(False), 2, path=path)
    assert measured[-2:] == [2, 2]


def test_recalibrate_measures_each_stored_curve_again_once_per_process(tmp_path, monkeypatch):
    path = str(tmp_path / "costs.json")
    measured = []

    def measure(scale):
        def run(n):
            measured.append(scale)
            costs = [1.0 + scale * k for k in range(n)]
            return C.Calibration(costs=costs, sizes=list(range(1, n + 1)), medians=costs, rounds=5,
                                 spread=0.01, noisy=False, seconds=0.1)
        return run

    monkeypatch.setattr(C, "_RECALIBRATED", set())
    assert stored_costs(_key(), measure(1.0), 3, path=path) == [1.0, 2.0, 3.0]  # an old machine's curve
    monkeypatch.setenv("NGRAMCACHE_RECALIBRATE", "1")
    assert stored_costs(_key(), measure(2.0), 3, path=path) == [1.0, 3.0, 5.0]  # measured again, and kept
    assert stored_costs(_key(), measure(3.0), 3, path=path) == [1.0, 3.0, 5.0]  # once: not on every request
    assert measured == [1.0, 2.0]
    monkeypatch.delenv("NGRAMCACHE_RECALIBRATE")
    assert C.read_costs(_key(), path) == [1.0, 3.0, 5.0]
    monkeypatch.setenv("NGRAMCACHE_RECALIBRATE", "yes")
    with pytest.raises(ValueError, match="NGRAMCACHE_RECALIBRATE must be 0 or 1"):
        stored_costs(_key("other"), measure(1.0), 3, path=path)


def test_stored_costs_survive_an_unwritable_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cal = C.Calibration(costs=[1.0, 2.0], sizes=[1, 2], medians=[1.0, 2.0], rounds=5, spread=0.0, noisy=False,
                        seconds=0.0)
    assert stored_costs(_key(), lambda n: cal, 2, path=str(blocker / "costs.json")) == [1.0, 2.0]


def test_extend_costs():
    assert C.extend_costs([1.0, 1.5, 1.75], 2) == [1.0, 1.5]
    assert C.extend_costs([1.0, 1.5], 4) == [1.0, 1.5, 2.0, 2.5]  # on with the last step
    assert C.extend_costs([2.0], 3) == [2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="costs"):
        C.extend_costs([1.0, -1.0], 3)


def test_gated_drafter_builds_the_named_drafter_with_a_gate_on_the_costs():
    d = gated_drafter([1.0, 1.1, 1.2], "lookup", n_draft=6, gate_options={"min_gain": 0.2}, ngram_max=3)
    assert isinstance(d, LookupDrafter) and d.n_draft == 6
    assert d.gate.max_len == 6 and d.gate.min_gain == 0.2
    assert np.allclose(d.gate.costs, np.array([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]) / 1.0)
    d = gated_drafter(None, n_draft=4)
    assert isinstance(d, CopyDrafter) and d.gate is None  # the default drafter, ungated
    with pytest.raises(ValueError, match="unknown drafter"):
        gated_drafter([1.0], "nope")
    with pytest.raises(TypeError, match="takes no option"):
        gated_drafter([1.0], "pld", static=object())
    with pytest.raises(ValueError, match="n_draft"):
        gated_drafter([1.0], n_draft=-1)


def test_calibration_stops_at_its_budget_and_the_result_is_not_kept(monkeypatch):
    from types import SimpleNamespace

    from ngramcache.decoding import costs as costs_mod

    clock = [0.0]
    monkeypatch.setattr(costs_mod, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []
    rng = np.random.default_rng(0)

    def time_batch(k):  # a busy machine: every batch takes a second of the clock, timings all over
        clock[0] += 1.0
        calls.append(k)
        return 0.01 * k * (1 + 3 * rng.random())

    cal = costs_mod.calibrate(time_batch, 17, progress=False, budget=30.0)
    n_sizes = len(costs_mod.batch_sizes(17))
    assert cal.rounds == costs_mod.MIN_ROUNDS or cal.rounds * n_sizes <= 30 + n_sizes
    assert cal.noisy and len(calls) < (2 * 5 + 1) * n_sizes  # fewer than the unbudgeted ten rounds
