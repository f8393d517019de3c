"""Benchmarks in pairs: every pytest-benchmark group times ngramcache and a baseline (a
slow pure-Python reference, a dict-based cache, or a peer) on the same input in the same
run, so the group's ratio baseline / ngramcache means something even on a noisy machine
where absolute times move from run to run.

A benchmark says which side it is on with ``ngramcache_side`` or ``baseline_side`` before
it runs; bench/conftest.py hands every finished benchmark to ``record``, which keeps the
medians, writes each ngramcache row's ratios into its ``extra_info`` (so that a saved
run, ``--benchmark-save``, holds them too) and gives the lines the run prints at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

NGRAMCACHE = "ngramcache"
BASELINE = "baseline"

# Rounds per benchmark (pedantic mode, so the whole run stays within a few minutes): the
# ngramcache side takes milliseconds a round and gets many rounds for a stable median,
# the baselines take up to a second and get few (they are there for the ratio).
NGRAMCACHE_ROUNDS = 30
BASELINE_ROUNDS = 3


def ngramcache_side(benchmark, group: str, label: str) -> None:
    _place(benchmark, group, NGRAMCACHE, label)


def baseline_side(benchmark, group: str, label: str) -> None:
    _place(benchmark, group, BASELINE, label)


def _place(benchmark, group: str, side: str, label: str) -> None:
    # the group must be set before the benchmark runs: its statistics copy it when made
    benchmark.group = group
    benchmark.extra_info.update(side=side, label=label)


@dataclass
class Row:
    side: str
    label: str
    median: float  # seconds per round
    extra_info: dict  # the benchmark's own, saved with it


_ROWS: dict[str, list[Row]] = {}


def record(benchmark) -> None:
    """Keep a finished benchmark's median if it is one side of a pair (nothing is kept
    when benchmarks are disabled: there are no statistics then)."""
    side = benchmark.extra_info.get("side")
    if side is None or benchmark.stats is None or not benchmark.stats.stats.rounds:
        return
    rows = _ROWS.setdefault(benchmark.group, [])
    rows.append(Row(side, benchmark.extra_info["label"], benchmark.stats.stats.median, benchmark.extra_info))
    # either side may finish first: rewrite the group's ratios whenever a row arrives
    for row in rows:
        if row.side == NGRAMCACHE:
            row.extra_info["baseline_ratios"] = {b.label: round(b.median / row.median, 2)
                                                 for b in rows if b.side == BASELINE}


def ratio_lines() -> list[str]:
    """'group: baseline / ngramcache = N x' for every pair measured, groups in name order."""
    lines = []
    for group in sorted(_ROWS):
        rows = _ROWS[group]
        for fast in (r for r in rows if r.side == NGRAMCACHE):
            for base in (r for r in rows if r.side == BASELINE):
                lines.append(f"{group}: {base.label} / {fast.label} = {format_ratio(base.median / fast.median)}")
            inter = fast.extra_info.get("interleaved")
            if inter:
                lines.append(f"{group}: {inter['label']}, interleaved round by round / {fast.label} = "
                             f"{inter['ratio']:.2f}x (rounds {', '.join(f'{r:.2f}' for r in inter['rounds'])})")
    return lines


def interleave(benchmark, label: str, baseline):
    """A ``setup`` for ``benchmark.pedantic`` that runs ``baseline()`` (untimed by the
    benchmark, timed here) before every round, so that each round of this side has its
    baseline next to it: on a machine whose speed drifts, two benchmarks run one after the
    other can differ by a fifth for no reason of their own. After the run, ``finish()``
    writes the per-round ratios baseline / this into ``extra_info['interleaved']``."""
    import time

    times: list[float] = []

    def setup():
        t0 = time.perf_counter()
        baseline()
        times.append(time.perf_counter() - t0)

    def finish():
        data = list(benchmark.stats.stats.data) if benchmark.stats is not None else []
        base = times[len(times) - len(data):]  # the warm-up rounds' baselines left out
        if data and len(base) == len(data):
            ratios = [b / d for b, d in zip(base, data)]
            benchmark.extra_info["interleaved"] = {"label": label, "rounds": ratios,
                                                   "ratio": sorted(ratios)[len(ratios) // 2]}

    return setup, finish


def format_ratio(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


class BaselineResults:
    """Each group's baseline result, kept from the baseline's own benchmark so that the
    ngramcache side can be checked against it without running the slow baseline again
    (it runs again only when its benchmark was deselected, e.g. ``-k ngramcache``)."""

    def __init__(self) -> None:
        self._results: dict[str, object] = {}

    def keep(self, group: str, result):
        self._results[group] = result
        return result

    def get(self, group: str, compute):
        if group not in self._results:
            self._results[group] = compute()
        return self._results[group]
