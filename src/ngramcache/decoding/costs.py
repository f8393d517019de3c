"""Verification costs: what verifying a batch of k tokens costs a model, measured once and
kept, and the gated drafter built on them.

An integration provides one hook, ``time_batch(k) -> seconds``: one verification batch of
k tokens after a fixed context (a forward pass with logits for the k positions and a token
chosen from each row, as verification does), its KV cache rolled back afterwards.
:func:`calibrate` times it for every batch size up to 8 and about four sizes per doubling
beyond, in interleaved rounds after a warm-up round, keeps each size's median, measures
more rounds while the timings of a size spread too widely (another process taking the
CPU), and returns the closest non-decreasing curve (a longer batch never costs less).
:func:`stored_costs` keeps the result in one store on disk (:func:`cost_store_path`), keyed
by backend, model, build and threads (:class:`CostKey`), unless the timings stayed noisy.
:func:`gated_drafter` turns costs into a drafter with an ``AdaptiveGate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from ngramcache._validate import check_int
from ngramcache.decoding.gate import AdaptiveGate, check_costs

__all__ = ["CostKey", "Calibration", "calibrate", "stored_costs", "cost_store_path", "read_costs", "write_costs",
           "batch_sizes", "non_decreasing", "backend_timer", "context_tokens", "extend_costs", "gated_drafter",
           "MAX_SPREAD", "SHOW_PROGRESS_AFTER", "BUDGET_SECONDS"]

#: the version of the store's keys: v3 keys name the backend and its build (v2 keys, llama.cpp
#: only, measured the fastest of the repeats; they are left alone and never read)
STORE_VERSION = "v3"
#: the largest spread (interquartile range / median) of one batch size's timings that is
#: trusted: beyond it more rounds are measured, and costs that stay this noisy are used for
#: the run that measured them but not kept (a size slow in most rounds has a wrong median)
MAX_SPREAD = 0.25
#: a calibration shows its progress on stderr once it has taken this many seconds
SHOW_PROGRESS_AFTER = 1.5
#: a calibration starts no new round after this many seconds (once MIN_ROUNDS are done): on a
#: busy machine more rounds would not make the timings trustworthy, only the wait longer
BUDGET_SECONDS = 6.0
MIN_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class CostKey:
    """What verification costs depend on: the ``backend`` (``"llama.cpp"``,
    ``"transformers"``), the ``model`` (a file with its size and time, or an architecture),
    the ``build`` (library versions, kernels, dtype and device) and the ``threads``."""

    backend: str
    model: str
    build: str
    threads: str

    def __str__(self) -> str:
        return "|".join((STORE_VERSION, self.backend, self.model, self.build, self.threads))


def cost_store_path() -> str:
    """Where verification costs are kept: ``verify-costs.json`` in $NGRAMCACHE_CACHE_DIR,
    else in ``ngramcache`` under $XDG_CACHE_HOME or ~/.cache."""
    base = os.environ.get("NGRAMCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ngramcache")
    return os.path.join(base, "verify-costs.json")


def _read_table(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return {}
    return table if isinstance(table, dict) else {}


def read_costs(key: CostKey | str, path: str | None = None) -> list[float] | None:
    """The costs stored under ``key``, or None (none stored, or a damaged store or entry)."""
    costs = _read_table(path or cost_store_path()).get(str(key))
    if not isinstance(costs, list) or not costs:
        return None
    try:
        check_costs(costs)
    except (ValueError, TypeError):  # TypeError: an element that is no number (a dict ...)
        return None
    return [float(c) for c in costs]


def write_costs(key: CostKey | str, costs: Sequence[float], path: str | None = None) -> None:
    """Keep ``costs`` under ``key`` (atomically: temp file, fsync, rename); a damaged store
    is replaced."""
    from ngramcache.files import atomic_open

    check_costs(costs)
    path = path or cost_store_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    table = _read_table(path)
    table[str(key)] = [float(c) for c in costs]
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------
# Measuring


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One measurement: ``costs[k-1]``, the seconds to verify k tokens for k =
    1..max_batch; the ``sizes`` timed (the others interpolated) and each one's ``medians``;
    ``rounds`` of timings per size; ``spread``, the largest interquartile range / median
    of a size; ``noisy`` when the timings stayed too spread to keep (``MAX_SPREAD``);
    ``seconds`` it took."""

    costs: list[float]
    sizes: list[int]
    medians: list[float]
    rounds: int
    spread: float
    noisy: bool
    seconds: float


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes :func:`calibrate` times: every size up to 8, then about four per
    doubling, and ``max_batch`` itself."""
    max_batch = check_int("max_batch", max_batch, 1)
    sizes, k = [], 1
    while k < max_batch:
        sizes.append(k)
        k += 1 if k < 8 else max(1, k // 4)
    return sizes + [max_batch]


def non_decreasing(y: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``y`` in least squares (pool adjacent
    violators): one slow timing flattens its neighbourhood instead of lifting every
    longer batch."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(int(n))]


def _spread(samples: np.ndarray) -> np.ndarray:
    q1, med, q3 = np.percentile(samples, [25, 50, 75], axis=0)
    return (q3 - q1) / med


def calibrate(time_batch: Callable[[int], float], max_batch: int, repeats: int = 5, *,
              max_rounds: int | None = None, max_spread: float = MAX_SPREAD, progress: bool = True,
              budget: float | None = BUDGET_SECONDS) -> Calibration:
    """Time ``time_batch(k)`` (seconds for one verification batch of k tokens) for the
    sizes of :func:`batch_sizes` in interleaved rounds: a warm-up round, then ``repeats``
    rounds, then ``repeats`` more at a time while some size's spread exceeds
    ``max_spread``, up to ``max_rounds`` (default ``2 * repeats``). Each size keeps its
    median; the curve is :func:`non_decreasing` over the sizes, interpolated in between.
    ``budget``: seconds after which no further round is started once ``MIN_ROUNDS`` are
    done (None: no limit); costs cut short while noisy come back ``noisy``, to be used
    but not kept. ``progress``: show a progress line on stderr once it has taken
    ``SHOW_PROGRESS_AFTER`` seconds, and say so there when the timings stayed noisy."""
    from ngramcache.progress import Progress

    max_batch = check_int("max_batch", max_batch, 1)
    repeats = check_int("repeats", repeats, 1)
    max_rounds = check_int("max_rounds", 2 * repeats if max_rounds is None else max_rounds, repeats)
    if not max_spread > 0:
        raise ValueError(f"max_spread must be > 0, got {max_spread}")
    sizes = batch_sizes(max_batch)
    t0 = time.perf_counter()
    rows: list[list[float]] = []
    bar = Progress((repeats + 1) * len(sizes), "measuring verification costs", unit="batches", quiet=True)
    with bar:

        def round_of_timings() -> list[float]:
            row = []
            for k in sizes:
                dt = float(time_batch(k))
                if not (dt > 0 and np.isfinite(dt)):
                    raise ValueError(f"time_batch({k}) returned {dt!r}: expected positive finite seconds")
                row.append(dt)
                if progress and bar.quiet and bar.elapsed >= SHOW_PROGRESS_AFTER:
                    bar.quiet = False
                bar.update(1)
            return row

        round_of_timings()  # a warm-up round: caches, page faults, thread pools
        while True:
            for _ in range(repeats):
                rows.append(round_of_timings())
                if budget is not None and len(rows) >= MIN_ROUNDS and time.perf_counter() - t0 > budget:
                    break
            spread = float(np.max(_spread(np.asarray(rows))))
            noisy = spread > max_spread
            over_budget = budget is not None and time.perf_counter() - t0 > budget
            if not noisy or len(rows) + repeats > max_rounds or over_budget:
                break
            bar.total += repeats * len(sizes)
        bar.total = bar.n  # a budget may end it early: the bar ends full
    samples = np.asarray(rows)
    medians = [float(x) for x in np.median(samples, axis=0)]
    if noisy and progress:
        print(f"verification costs: timings of one batch size varied by {spread:.0%} over {len(rows)} rounds "
              "(another process on the CPU?); using their medians for now, measured again next time",
              file=sys.stderr)
    curve = np.interp(np.arange(1, max_batch + 1), sizes, non_decreasing(medians))
    return Calibration(costs=[float(c) for c in curve], sizes=sizes, medians=medians, rounds=len(rows),
                       spread=spread, noisy=noisy, seconds=time.perf_counter() - t0)


# costs measured in this process but too noisy to keep on disk: measured once per process
_NOISY: dict[str, list[float]] = {}
# the curves this process measured again because NGRAMCACHE_RECALIBRATE asked for it
_RECALIBRATED: set[str] = set()


def recalibrate_requested() -> bool:
    """Whether ``NGRAMCACHE_RECALIBRATE`` asks for every stored curve to be measured again
    (once per process): ``1`` yes, ``0`` or unset no; anything else is a ValueError."""
    value = os.environ.get("NGRAMCACHE_RECALIBRATE", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"NGRAMCACHE_RECALIBRATE must be 0 or 1, got {value!r}")
    return value == "1"


def stored_costs(key: CostKey | None, measure: Callable[[int], Calibration], max_batch: int,
                 refresh: bool = False, path: str | None = None) -> list[float]:
    """Costs of batches of 1..``max_batch`` tokens: the stored ones under ``key`` if they
    reach ``max_batch``, else ``measure(max_batch)``, kept under ``key`` unless noisy
    (noisy costs are reused by this process only). ``key`` None: measured every time.
    ``refresh``: measure again; ``NGRAMCACHE_RECALIBRATE=1`` does the same for each key once
    in this process (a stored curve can be right for the machine as it was, not as it is: a
    curve too flat makes the gate draft where drafting loses). An unwritable store only costs
    a new measurement later."""
    max_batch = check_int("max_batch", max_batch, 1)
    name = None if key is None else str(key)
    if name is not None and name not in _RECALIBRATED and recalibrate_requested():
        refresh = True
        _RECALIBRATED.add(name)
    if name is not None and not refresh:
        for costs in (read_costs(name, path), _NOISY.get(name)):
            if costs is not None and len(costs) >= max_batch:
                return costs[:max_batch]
    cal = measure(max_batch)
    if name is not None:
        if cal.noisy:
            _NOISY[name] = list(cal.costs)
        else:
            _NOISY.pop(name, None)
            try:
                write_costs(name, cal.costs, path)
            except OSError:
                pass
    return list(cal.costs)


def context_tokens(n: int, n_vocab: int) -> np.ndarray:
    """``n`` int32 tokens of a fixed context for timing, spread over the vocabulary and
    clear of its first 100 ids (a real vocabulary's special tokens)."""
    lo = 100 if n_vocab > 1000 else 0
    return (np.arange(n, dtype=np.int64) * 7919 % min(n_vocab - lo, 30000) + lo).astype(np.int32)


@contextlib.contextmanager
def backend_timer(backend, max_batch: int, n_context: int = 512) -> Iterator[Callable[[int], float]]:
    """The ``time_batch`` hook of a ``ngramcache.decoding.loop.Backend``: decodes
    ``n_context`` tokens of context (fewer if the context window is smaller), then each
    call decodes k tokens with logits for all, chooses a token from each row and drops
    them again. The backend's KV cache is cleared before and after."""
    max_batch = check_int("max_batch", max_batch, 1, backend.n_batch)
    n_context = check_int("n_context", n_context, 1)
    n_context = max(1, min(n_context, backend.n_ctx - max_batch))
    backend.clear()
    ctx = context_tokens(n_context, backend.n_vocab)
    try:
        for s in range(0, n_context, backend.n_batch):
            backend.decode(ctx[s : s + backend.n_batch], s, backend.n_batch)

        def time_batch(k: int) -> float:
            t = time.perf_counter()
            backend.decode(ctx[:k], n_context, 0)
            for i in range(k):
                int(np.argmax(backend.logits(i)))
            dt = time.perf_counter() - t
            backend.truncate(n_context)
            return dt

        yield time_batch
    finally:
        backend.clear()


# ---------------------------------------------------------------------------------
# Costs -> gate -> drafter


def extend_costs(costs: Sequence[float], n: int) -> list[float]:
    """The first ``n`` of ``costs``; measured costs shorter than that go on linearly with
    their last step."""
    n = check_int("n", n, 1)
    check_costs(costs)
    c = [float(x) for x in costs]
    step = c[-1] - c[-2] if len(c) > 1 else c[-1]
    return (c + [c[-1] + step * (i + 1) for i in range(n - len(c))])[:n]


def gated_drafter(costs: Sequence[float] | None, drafter: str | None = None, n_draft: int = 16, *,
                  gate_options: dict | None = None, gate: AdaptiveGate | None = None, **options):
    """The drafter called ``drafter`` (``ngramcache.drafters.catalog``; None: its default)
    proposing up to ``n_draft`` tokens, with an ``AdaptiveGate`` on ``costs`` (seconds to
    verify 1, 2, ... tokens, extended by :func:`extend_costs` to ``n_draft + 1``) and
    ``gate_options`` (the gate's keywords). ``costs`` None: no gate (every proposal is
    verified whole). ``gate``: a gate that has already learnt (an earlier turn's) to go on
    with instead of a new one. ``options``: the drafter's own keywords (None values left out)."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, make_drafter

    n_draft = check_int("n_draft", n_draft, 0)
    if costs is None:
        gate = None
    elif gate is None or gate.max_len < n_draft:
        gate = AdaptiveGate(extend_costs(costs, n_draft + 1), **(gate_options or {}))
    return make_drafter(DEFAULT_DRAFTER if drafter is None else drafter, n_draft=n_draft, gate=gate, **options)
