"""What the drafting gate assumes before it has seen anything, read from the package's data
file ``ngramcache/data/gate_priors.json`` (made by ``bench/make_gate_priors.py``; docs/gate.md):

* how often drafted tokens are right, per gate state and draft position
  (:func:`acceptance_means`; states are numbered by :func:`state_index`);
* what verifying a batch of k tokens costs against one token, per backend and model size
  (:func:`cost_prior`), for a model whose own curve has not been learnt yet.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

from ngramcache.drafters.base import Source

__all__ = ["LENGTH_BUCKETS", "N_STATES", "acceptance_means", "cost_prior", "state_index", "FLAT_PRIOR"]

#: the proposal (or match) lengths a state tells apart: 1, 2-3, 4-7, 8 and more
LENGTH_BUCKETS = (1, 2, 4, 8)
#: the previous proposal's first token: wrong, right, or no previous proposal
_PREVIOUS = ("wrong", "right", "none")
N_STATES = len(Source) * len(LENGTH_BUCKETS) * len(_PREVIOUS)
#: the estimate of a position before anything is known, where the table has no row (and for
#: a gate without the table): one right in three
FLAT_PRIOR = 1.0 / 3.0


def state_index(confidence: int, previous: int, source: Source) -> int:
    """The gate's state of a proposal: its ``source``, its length bucket (``confidence``: the
    match or proposal length) and ``previous`` (0: the previous proposal's first token was
    wrong, 1: right, 2: no previous proposal)."""
    b = 0
    for i, lo in enumerate(LENGTH_BUCKETS):
        if confidence >= lo:
            b = i
    return (int(source) * len(LENGTH_BUCKETS) + b) * len(_PREVIOUS) + previous


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    text = resources.files("ngramcache.data").joinpath("gate_priors.json").read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=8)
def _means(n_positions: int) -> tuple[tuple[float, ...], ...]:
    table = _data()["acceptance"]
    if tuple(table["length_buckets"]) != LENGTH_BUCKETS:
        raise ValueError("gate_priors.json: its length buckets are not the gate's")
    buckets = [(lo, math.inf if hi is None else hi) for lo, hi in table["position_buckets"]]
    rows = {}
    for r in table["rows"]:
        src = Source[r["source"].upper()]
        rows[state_index(LENGTH_BUCKETS[r["length"]], _PREVIOUS.index(r["previous"]), src)] = r["p"]
    out = []
    for st in range(N_STATES):
        row = rows.get(st)
        means = []
        for j in range(n_positions):
            pb = next(i for i, (lo, hi) in enumerate(buckets) if lo <= j < hi)
            means.append(float(row[pb]) if row is not None else FLAT_PRIOR)
        out.append(tuple(means))
    return tuple(out)


def acceptance_means(n_positions: int) -> tuple[tuple[float, ...], ...]:
    """Per state (:func:`state_index`), the prior chance that drafted token j is right given
    that the ones before it were, for j = 0 .. ``n_positions - 1``."""
    return _means(int(n_positions))


def cost_prior(backend: str, n_params: int | None) -> list[float]:
    """The cost curve (``cost(k) / cost(1)``, k = 1, 2, ...) measured for the model of
    ``backend`` nearest in size to ``n_params`` (None: the middle one of that backend); the
    steepest curve of any backend when this one has none (a cautious start: the curve is
    learnt while decoding)."""
    curves = _data()["verify_costs"]["curves"]
    mine = [c for c in curves if c["backend"] == backend]
    if not mine:
        return [float(x) for x in max(curves, key=lambda c: c["curve"][1])["curve"]]
    mine.sort(key=lambda c: c["params"])
    if n_params is None or n_params <= 0:
        best = mine[len(mine) // 2]
    else:
        best = min(mine, key=lambda c: abs(math.log(c["params"] / n_params)))
    return [float(x) for x in best["curve"]]
