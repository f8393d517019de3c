"""Verification costs: what verifying a batch of k tokens costs a model against one token,
learnt while decoding and kept.

:class:`LearnedCosts` is the curve the gate decides on. It starts at once from a prior curve
(the one stored for this model, build and thread count, else the one of the nearest model
size in the package's priors, ``ngramcache.decoding.priors``) and is refined from the
verification times the decoding loop reports anyway (``observe``): per batch size the median
of its recent times, a time beyond ``spike`` times that median counted as that, each size's
median shrunk towards the prior while few were seen. Nothing is measured up front.
:func:`learned_costs` hands out one such curve per key and process, and what it learnt is
saved atomically in one store on disk (:func:`cost_store_path`), keyed by backend, model,
build and threads (:class:`CostKey`).

:func:`calibrate` is an explicit measurement (interleaved rounds of a ``time_batch(k)`` hook,
medians, the closest non-decreasing curve) for benchmarks and for filling the priors; no
command runs it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import os
import statistics
import threading
import time
import weakref
from collections import deque
from typing import Callable, Iterator, Sequence

import numpy as np

from ngramcache._validate import check_int
from ngramcache.decoding.priors import cost_prior

__all__ = ["CostKey", "Calibration", "LearnedCosts", "calibrate", "check_costs", "cost_store_path", "read_costs",
           "write_costs", "learned_costs", "batch_sizes", "non_decreasing", "backend_timer", "context_tokens",
           "extend_costs"]

#: the version of the store's keys: v4 holds learnt curves relative to one token (v3, measured
#: seconds, is still read as a prior)
STORE_VERSION = "v4"
_OLD_VERSIONS = ("v3",)
#: a batch size's median is shrunk towards the prior as if the prior were this many of its times
PRIOR_SAMPLES = 4
#: one-token steps timed before their median is the unit the batches are measured in
MIN_PLAIN = 5


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
        return self.versioned(STORE_VERSION)

    def versioned(self, version: str) -> str:
        """The key as the store spells it for ``version``."""
        return "|".join((version, self.backend, self.model, self.build, self.threads))


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


def check_costs(costs) -> np.ndarray:
    """``costs`` (``costs[k-1]``: the time to verify k tokens) relative to ``costs[0]``;
    ValueError unless it is a non-empty 1-D sequence of positive finite numbers."""
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or c.size < 1:
        raise ValueError("costs: expected a 1-D sequence, costs[k-1] = time to verify k tokens")
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("costs: every verification cost must be a positive finite number")
    return c / c[0]


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
    of a size (how noisy the machine was); ``seconds`` it took."""

    costs: list[float]
    sizes: list[int]
    medians: list[float]
    rounds: int
    spread: float
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


def calibrate(time_batch: Callable[[int], float], max_batch: int, repeats: int = 5, *,
              progress: bool = True) -> Calibration:
    """Time ``time_batch(k)`` (seconds for one verification batch of k tokens) for the
    sizes of :func:`batch_sizes` in ``repeats`` interleaved rounds after a warm-up round.
    Each size keeps its median; the curve is :func:`non_decreasing` over the sizes,
    interpolated in between. ``progress``: a progress line on stderr."""
    from ngramcache.progress import Progress

    max_batch = check_int("max_batch", max_batch, 1)
    repeats = check_int("repeats", repeats, 1)
    sizes = batch_sizes(max_batch)
    t0 = time.perf_counter()
    rows: list[list[float]] = []
    with Progress((repeats + 1) * len(sizes), "measuring verification costs", unit="batches",
                  quiet=not progress) as bar:
        for r in range(repeats + 1):  # round 0 warms up: caches, page faults, thread pools
            row = []
            for k in sizes:
                dt = float(time_batch(k))
                if not (dt > 0 and math.isfinite(dt)):
                    raise ValueError(f"time_batch({k}) returned {dt!r}: expected positive finite seconds")
                row.append(dt)
                bar.update(1)
            if r:
                rows.append(row)
    samples = np.asarray(rows)
    medians = [float(x) for x in np.median(samples, axis=0)]
    q1, q3 = np.percentile(samples, [25, 75], axis=0)
    spread = float(np.max((q3 - q1) / np.asarray(medians)))
    curve = np.interp(np.arange(1, max_batch + 1), sizes, non_decreasing(medians))
    return Calibration(costs=[float(c) for c in curve], sizes=sizes, medians=medians, rounds=len(rows),
                       spread=spread, seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------
# Learning while decoding


class LearnedCosts:
    """A verification cost curve, ``curve()[k-1]`` = cost of a batch of k tokens / cost of
    one, learnt from the verification times decoding reports.

    It starts as ``prior`` (seconds or ratios, only ratios matter). :meth:`observe` takes
    each verification's size and wall time; per batch size the last ``window`` times are
    kept, a time beyond ``spike`` times its size's median (while a size has few times: beyond
    ``spike`` times what the curve expects of it) counted as that (the process descheduled for
    a while: a busy machine makes the curve noisy, not wrong). Once
    ``MIN_PLAIN`` one-token steps have been timed, their median is the unit; a size's
    ratio is its median over the unit, shrunk towards the prior as if the prior were
    ``PRIOR_SAMPLES`` of its times. Sizes never verified follow the prior with its extra
    cost over one token scaled as the verified sizes say. The curve never falls with k.

    With a ``key``, :meth:`save` keeps the curve in the store (atomically) for the next
    process; a process saves what it learnt when it exits, and a gated drafter at the
    start of each request. Safe to share between the threads of a server (a lock)."""

    def __init__(self, prior: Sequence[float], *, key: CostKey | None = None, path: str | None = None,
                 window: int = 64, spike: float = 3.0):
        self.prior = [float(c) for c in check_costs(prior)]
        self.key, self.path = key, path
        self.window = check_int("window", window, MIN_PLAIN)
        if not spike > 1.0:
            raise ValueError(f"spike must be > 1, got {spike}")
        self.spike = float(spike)
        self._times = [deque(maxlen=self.window) for _ in self.prior]
        self._medians: list[float | None] = [None] * len(self.prior)  # per size, as last computed
        self._dirty: set[int] = set()  # sizes with times since their median was computed
        self._curve = list(self.prior)
        self._lock = threading.Lock()
        self._changed = 0  # observations since the curve was last computed
        #: verification times taken in so far
        self.n_observed = 0
        self._unsaved = 0  # observations since the last save
        self._saved_at: float | None = None
        #: grows whenever the curve changes, so that a gate knows to read it again
        self.version = 0
        if key is not None:
            _SAVE_AT_EXIT.add(self)

    @property
    def size(self) -> int:
        """The largest batch the curve covers."""
        return len(self.prior)

    @property
    def learnt(self) -> bool:
        """Whether the curve rests on this machine's times (the unit and at least one batch
        size beyond one token), not on the prior alone."""
        return len(self._times[0]) >= MIN_PLAIN and any(len(q) for q in self._times[1:])

    def observe(self, n_tokens: int, seconds: float) -> None:
        """A verification batch of ``n_tokens`` tokens took ``seconds``. Sizes beyond the
        curve and times that are no positive finite number are left out."""
        if not (1 <= n_tokens <= self.size) or not (seconds > 0 and math.isfinite(seconds)):
            return
        with self._lock:
            i = n_tokens - 1
            q, median = self._times[i], self._medians[i]
            if len(q) >= MIN_PLAIN:
                if median is None:  # the median is refreshed with the curve, every few steps
                    median = self._medians[i] = statistics.median(q)
                seconds = min(seconds, self.spike * median)
            elif i and len(self._times[0]) >= MIN_PLAIN and self._medians[0] is not None:
                # a batch size seen a few times only: against what the curve expects of it
                seconds = min(seconds, self.spike * self._medians[0] * self._curve[i])
            q.append(float(seconds))
            self._dirty.add(i)
            self.n_observed += 1
            self._unsaved += 1
            self._changed += 1

    def curve(self) -> list[float]:
        """The curve as learnt so far (a list of ``size`` ratios, the first 1.0)."""
        # medians of a few dozen numbers per size: recomputed every few observations, not
        # at every step
        if self._changed >= 4 or (self._changed and self.n_observed < 64):
            with self._lock:
                new = self._compute()
                self._changed = 0
            if new != self._curve:
                self._curve = new
                self.version += 1
        return self._curve

    def _compute(self) -> list[float]:
        for i in self._dirty:  # only the sizes that saw new times
            self._medians[i] = statistics.median(self._times[i])
        self._dirty.clear()
        if len(self._times[0]) < MIN_PLAIN:
            return self._curve
        unit = self._medians[0]
        seen = {}  # batch size -> (observed ratio, how many times)
        for k in range(2, self.size + 1):
            q = self._times[k - 1]
            if q:
                seen[k] = (self._medians[k - 1] / unit, len(q))
        # the prior's extra cost over one token, scaled as the verified sizes say
        num, den = float(PRIOR_SAMPLES), float(PRIOR_SAMPLES)
        for k, (r, n) in seen.items():
            extra = self.prior[k - 1] - 1.0
            if extra > 0:
                num += n * (r - 1.0) / extra
                den += n
        scale = max(0.0, num / den)
        out = [1.0]
        for k in range(2, self.size + 1):
            guess = 1.0 + scale * (self.prior[k - 1] - 1.0)
            r, n = seen.get(k, (guess, 0))
            out.append((n * r + PRIOR_SAMPLES * guess) / (n + PRIOR_SAMPLES))
        return [max(1.0, c) for c in non_decreasing(out)]

    def save(self, at_most_every: float = 0.0) -> bool:
        """Keep the curve in the store under ``key`` (atomically), if it has learnt anything
        since the last save and the last save is ``at_most_every`` seconds old; True if it
        wrote. An unwritable store is left alone."""
        if self.key is None or not self._unsaved or not self.learnt:
            return False
        now = time.monotonic()
        if self._saved_at is not None and now - self._saved_at < at_most_every:
            return False
        curve = self.curve()
        self._unsaved, self._saved_at = 0, now
        try:
            write_costs(self.key, curve, self.path)
        except OSError:
            return False
        return True

    def replace(self, costs: Sequence[float]) -> None:
        """Start again from ``costs`` (a measurement: seconds or ratios, at least ``size``
        of them), forgetting the times seen, and keep it in the store at once."""
        c = check_costs(costs)
        if c.size < self.size:
            raise ValueError(f"costs: {c.size} given, the curve covers {self.size} batch sizes")
        with self._lock:
            self.prior = [float(x) for x in c[: self.size]]
            for q in self._times:
                q.clear()
            self._medians = [None] * self.size
            self._dirty.clear()
            self._curve, self._changed = list(self.prior), 0
            self.version += 1
        if self.key is not None:
            try:
                write_costs(self.key, self.prior, self.path)
            except OSError:
                pass

    def describe(self) -> str:
        """Where the curve comes from, in words."""
        if self.learnt:
            return f"learnt from {self.n_observed} verifications"
        return "not measured here yet: the prior for this model"

    def __repr__(self) -> str:
        c = self.curve()
        return f"<LearnedCosts cost({len(c)}) = {c[-1]:.2f}, {self.describe()}>"


_SAVE_AT_EXIT: "weakref.WeakSet[LearnedCosts]" = weakref.WeakSet()


@atexit.register
def _save_at_exit() -> None:
    for costs in list(_SAVE_AT_EXIT):
        costs.save()


# one curve per key and store in a process: every gate on one model learns into it
_CURVES: dict[tuple[str, str], LearnedCosts] = {}
_CURVES_LOCK = threading.Lock()


def learned_costs(key: CostKey | None, max_batch: int, n_params: int | None = None,
                  path: str | None = None, **options) -> LearnedCosts:
    """The cost curve for batches of 1..``max_batch`` tokens of the model ``key`` names,
    at once: the one this process already learns into, else the curve stored under
    ``key``, else the package's prior for a model of ``key.backend`` with ``n_params``
    parameters (``ngramcache.decoding.priors.cost_prior``), extended as
    :func:`extend_costs` does where shorter. ``key`` None: a fresh curve, not kept.
    ``options``: :class:`LearnedCosts`'s ``window`` and ``spike``."""
    max_batch = check_int("max_batch", max_batch, 1)
    if key is None:
        return LearnedCosts(extend_costs(cost_prior("", n_params), max_batch), **options)
    store = path or cost_store_path()
    with _CURVES_LOCK:
        have = _CURVES.get((str(key), store))
        if have is not None and have.size >= max_batch:
            return have
        prior = have.curve() if have is not None else None
        if prior is None:
            for version in (STORE_VERSION,) + _OLD_VERSIONS:
                prior = read_costs(key.versioned(version), path)
                if prior is not None:
                    break
        if prior is None:
            prior = cost_prior(key.backend, n_params)
        costs = LearnedCosts(extend_costs(prior, max_batch), key=key, path=path, **options)
        _CURVES[(str(key), store)] = costs
        return costs


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
