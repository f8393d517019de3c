"""Drafters: what proposes tokens for a model to verify.

A drafter sees the verified sequence grow (``reset`` with the prompt, then ``accept``
with every batch of verified tokens) and proposes continuations (``propose``). It
never sees rejected tokens, so it never has to forget anything.

``LookupDrafter`` is llama.cpp's lookup decoding (context, dynamic and static n-gram
caches). ``AdaptiveGate`` decides how much of a proposal is worth verifying, from what
verifying k tokens costs on this model and how often drafts have been right so far.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from . import _core
from .files import atomic_open
from ._validate import as_tokens
from .cache import NgramCache, _check_sizes

_EMPTY = np.zeros(0, dtype=np.int32)


@dataclass
class DraftStats:
    """Counters of one drafter since its last ``reset``."""

    drafted: int = 0          # tokens handed to the verifier
    accepted: int = 0         # of those, how many the verifier confirmed
    draft_seconds: float = 0.0  # time spent proposing and updating caches
    proposals: int = 0        # propose() calls that returned at least one token
    skipped: int = 0          # proposals the gate judged not worth verifying

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@runtime_checkable
class Drafter(Protocol):
    """What a speculative loop needs from a drafter.

    ``reset(prompt_tokens)``: start a new sequence. ``propose(n_max)``: up to ``n_max``
    int32 tokens expected to follow the sequence (possibly none). ``accept(tokens)``:
    the tokens the verifier settled on since the last call, including its own next
    token (the correction or the bonus token). ``stats``: a ``DraftStats``.
    """

    def reset(self, prompt_tokens) -> None: ...

    def propose(self, n_max: int) -> np.ndarray: ...

    def accept(self, tokens) -> None: ...

    @property
    def stats(self) -> DraftStats: ...


class _TokenBuffer:
    """A growing int32 sequence; appends are amortised O(new tokens)."""

    def __init__(self, capacity: int = 1024):
        self._data = np.empty(max(16, capacity), dtype=np.int32)
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def extend(self, toks: np.ndarray) -> None:
        need = self.n + toks.size
        if need > self._data.size:
            cap = self._data.size
            while cap < need:
                cap *= 2
            grown = np.empty(cap, dtype=np.int32)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n : need] = toks
        self.n = need

    def view(self) -> np.ndarray:
        return self._data[: self.n]


# ---------------------------------------------------------------------------------
# The adaptive gate


def _check_costs(costs) -> np.ndarray:
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or c.size < 1:
        raise ValueError("costs: expected a 1-D sequence, costs[k-1] = time to verify k tokens")
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("costs: every verification cost must be a positive finite number")
    return c / c[0]


class AdaptiveGate:
    """Chooses how many drafted tokens to verify.

    ``costs[k-1]`` is the time to verify a batch of k tokens (the last verified token
    plus k-1 drafted ones); only ratios matter. For a proposal of length L the gate
    keeps the first k tokens, k in 0..L, that maximise expected tokens per unit of
    time, ``E(k) / cost(k+1)`` with ``E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j``, where
    ``p_j`` is the estimated chance that drafted token j is right given that the
    tokens before it were. k = 0 (plain decoding) wins whenever no draft is expected
    to pay for its verification.

    The ``p_j`` are learnt per state (how long the drafter's proposal was, and
    whether the previous proposal's first token was right), shrunk towards the
    estimate pooled over states, and decay so that the gate follows changes within a
    generation. Every proposal is scored against the tokens that really followed,
    including the proposals the gate declined, so skipping does not stop learning.
    """

    #: proposal lengths (or match lengths) are bucketed: 1, 2-3, 4-7, 8+
    _LEN_BUCKETS = (1, 2, 4, 8)
    #: where a proposal came from: 0 lookup caches, 1 a copy of an earlier span
    N_SOURCES = 2

    def __init__(self, costs: Sequence[float], decay: float = 0.97, prior: tuple[float, float] = (1.0, 2.0),
                 shrink: float = 4.0, overhead: float = 0.0, min_gain: float = 0.05):
        self.costs = _check_costs(costs)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if prior[0] <= 0 or prior[1] <= 0:
            raise ValueError(f"prior: both Beta parameters must be > 0, got {prior}")
        if shrink < 0:
            raise ValueError(f"shrink must be >= 0, got {shrink}")
        if overhead < 0:
            raise ValueError(f"overhead must be >= 0, got {overhead}")
        if min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {min_gain}")
        # drafting only when it is expected to beat plain decoding by this much: the
        # estimates that trigger a draft are the lucky ones (the winner's curse)
        self.min_gain = float(min_gain)
        self.decay = float(decay)
        self.prior = (float(prior[0]), float(prior[1]))
        self.shrink = float(shrink)
        self.overhead = float(overhead)  # cost of one proposal, in units of a 1-token verify
        self.max_len = self.costs.size - 1
        n_states = len(self._LEN_BUCKETS) * 3 * self.N_SOURCES
        # hits/trials per (state, position), position j = drafted token j+1. Plain lists:
        # at most a few dozen numbers per step, where numpy's per-call cost would dominate.
        self._cost = [float(c) for c in self.costs]
        self._hits = [[0.0] * (self.max_len + 1) for _ in range(n_states)]
        self._trials = [[0.0] * (self.max_len + 1) for _ in range(n_states)]
        self._pool_hits = [0.0] * (self.max_len + 1)
        self._pool_trials = [0.0] * (self.max_len + 1)

    def state(self, proposal_len: int, prev: int, source: int = 0) -> int:
        """State index from the proposal's length (for copies: the length of the match
        it continues), the previous outcome (0: previous first token wrong, 1: right,
        2: no previous proposal) and the source (0 lookup, 1 copy)."""
        b = 0
        for i, lo in enumerate(self._LEN_BUCKETS):
            if proposal_len >= lo:
                b = i
        return (source * len(self._LEN_BUCKETS) + b) * 3 + prev

    def probabilities(self, state: int, n: int) -> np.ndarray:
        """Estimated conditional acceptance of drafted tokens 1..n in ``state``."""
        return np.asarray(self._probs(state, min(n, self.max_len + 1)))

    def _probs(self, state: int, n: int) -> list[float]:
        a, b = self.prior
        w = self.shrink
        h, t = self._hits[state], self._trials[state]
        ph, pt = self._pool_hits, self._pool_trials
        return [(h[j] + w * (ph[j] + a) / (pt[j] + a + b)) / (t[j] + w) for j in range(n)]

    def choose(self, state: int, available: int) -> int:
        """How many of ``available`` drafted tokens to verify (0 = do not draft)."""
        k_max = min(available, self.max_len)
        if k_max <= 0:
            return 0
        best_k, best_rate = 0, 1.0 + self.min_gain  # plain decoding: 1 token per unit of cost
        expected, run = 1.0, 1.0
        cost = self._cost
        for j, p in enumerate(self._probs(state, k_max)):
            run *= p
            expected += run
            rate = expected / (cost[j + 1] + self.overhead)
            if rate > best_rate:
                best_k, best_rate = j + 1, rate
        return best_k

    def observe(self, state: int, n_right: int, n_scored: int, start: int = 0) -> None:
        """Drafted tokens ``start+1 .. start+n_scored`` of a proposal made in ``state``
        were compared with what followed: the first ``n_right`` of them were right
        (``n_right < n_scored``: the next one was wrong). Tokens before ``start`` were
        reported earlier (proposals are scored as the text arrives)."""
        end = min(start + n_scored, self.max_len + 1)
        n_right = min(n_right, end - start)
        if end <= start:
            return
        tried = start + n_right + (1 if start + n_right < end else 0)
        d = self.decay
        h, t = self._hits[state], self._trials[state]
        ph, pt = self._pool_hits, self._pool_trials
        for j in range(start, tried):
            hit = 1.0 if j < start + n_right else 0.0
            h[j] = h[j] * d + hit
            t[j] = t[j] * d + 1.0
            ph[j] = ph[j] * d + hit
            pt[j] = pt[j] * d + 1.0


# ---------------------------------------------------------------------------------
# Verification costs, measured once per model and kept on disk


def _cost_cache_path() -> str:
    base = os.environ.get("NGRAMCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ngramcache")
    return os.path.join(base, "verify-costs.json")


def _model_key(model_path: str, n_threads: int, n_threads_batch: int) -> str:
    st = os.stat(model_path)
    # v2: measured after 512 tokens of context (attention makes batches dearer with length)
    return f"v2|{os.path.abspath(model_path)}|{st.st_size}|{int(st.st_mtime)}|t{n_threads}|tb{n_threads_batch}"


def load_costs(model_path: str, n_threads: int, n_threads_batch: int, path: str | None = None) -> list[float] | None:
    """The verification costs stored for this model file and thread counts, or None."""
    import json

    path = path or _cost_cache_path()
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        costs = table.get(_model_key(model_path, n_threads, n_threads_batch))
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(costs, list) or not costs:
        return None
    try:
        _check_costs(costs)
    except ValueError:
        return None
    return [float(c) for c in costs]


def store_costs(model_path: str, n_threads: int, n_threads_batch: int, costs: Sequence[float],
                path: str | None = None) -> None:
    """Remember verification costs (atomically: temp file, fsync, rename)."""
    import json

    path = path or _cost_cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    table[_model_key(model_path, n_threads, n_threads_batch)] = [float(c) for c in costs]
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------
# llama.cpp's lookup drafter


class LookupDrafter:
    """llama.cpp's lookup decoding as a ``Drafter``.

    Drafts from the context cache (n-grams of the current sequence, kept current
    incrementally), then the ``dynamic`` cache (an ``NgramCache``, e.g. loaded from a
    ``-lcd`` file), then the ``static`` table (an ``NgramCache`` or a ``StaticTable``),
    exactly as ``common_ngram_cache_draft``. Per step the work is proportional to the
    tokens accepted, never to the length of the sequence.

    With a ``gate`` (an ``AdaptiveGate``), ``propose`` returns only as much of the
    lookup's proposal as is expected to pay for its verification, often nothing.
    """

    def __init__(self, static=None, dynamic: NgramCache | None = None, n_draft: int = 8,
                 ngram_min: int = 1, ngram_max: int = 4, gate: AdaptiveGate | None = None):
        if not isinstance(n_draft, (int, np.integer)) or isinstance(n_draft, bool):
            raise ValueError(f"n_draft must be an integer, got {type(n_draft).__name__}")
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        _check_sizes(ngram_min, ngram_max)
        if dynamic is not None and not isinstance(dynamic, _core.NgramCache):
            raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
        if gate is not None and not isinstance(gate, AdaptiveGate):
            raise TypeError(f"gate must be an AdaptiveGate or None, got {type(gate).__name__}")
        self.static = static
        self.dynamic = dynamic
        self.n_draft = int(n_draft)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.gate = gate
        self.context = NgramCache()
        self._buf = _TokenBuffer()
        self._stats = DraftStats()
        self._last = _EMPTY  # the proposal awaiting verification
        # proposals being scored against what really followed: (start, tokens, state, scored)
        self._pending: list[tuple[int, np.ndarray, int, int]] = []
        self._prev = 2  # previous proposal's first token: 0 wrong, 1 right, 2 no proposal
        self._first: int | None = None

    @property
    def stats(self) -> DraftStats:
        return self._stats

    @property
    def tokens(self) -> np.ndarray:
        """The verified sequence so far (a read-only view)."""
        v = self._buf.view()
        v.flags.writeable = False
        return v

    def reset(self, prompt_tokens) -> None:
        t0 = time.perf_counter()
        arr = as_tokens(prompt_tokens, "prompt_tokens")
        self.context.clear()
        self._buf.clear()
        self._buf.extend(arr)
        if arr.size:
            self.context._update(self._buf.view(), self.ngram_min, self.ngram_max, int(arr.size))
        self._reset_index()
        self._stats = DraftStats(draft_seconds=time.perf_counter() - t0)
        self._last = _EMPTY
        self._pending.clear()
        self._prev = 2
        self._first: int | None = None

    def propose(self, n_max: int | None = None) -> np.ndarray:
        t0 = time.perf_counter()
        if n_max is not None and n_max < 0:
            raise ValueError(f"n_max must be >= 0, got {n_max}")
        n = self.n_draft if n_max is None else min(int(n_max), self.n_draft)
        out = _EMPTY
        self._first = None
        if n > 0 and self._buf.n > 0:
            # the buffer holds only validated tokens: call the core directly, skipping
            # the O(length) re-validation of the public draft()
            cand, conf, source = self._candidates(n)
            out = cand
            if self.gate is not None and cand.size:
                self._first = int(cand[0])
                state = self.gate.state(conf, self._prev, source)
                self._pending.append((self._buf.n, cand, state, 0))
                k = self.gate.choose(state, int(cand.size))
                if k < cand.size:
                    if k == 0:
                        self._stats.skipped += 1
                    out = cand[:k]
        self._last = out
        if out.size:
            self._stats.proposals += 1
            self._stats.drafted += int(out.size)
        self._stats.draft_seconds += time.perf_counter() - t0
        return out

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        """(proposal, confidence length, source) for the gate."""
        # the buffer holds only validated tokens: call the core directly, skipping the
        # O(length) re-validation of the public draft()
        cand = _core._draft(self._buf.view(), n, self.context, self.dynamic, self.static,
                            self.ngram_min, self.ngram_max)
        return cand, int(cand.size), 0

    def accept(self, tokens) -> None:
        t0 = time.perf_counter()
        new = as_tokens(tokens)
        if new.size:
            last = self._last
            m = min(last.size, new.size)
            if m:
                eq = last[:m] == new[:m]
                self._stats.accepted += int(m if eq.all() else np.argmin(eq))
            if self._first is not None:
                self._prev = 1 if int(new[0]) == self._first else 0
            elif self.gate is not None:
                self._prev = 2
            self._first = None
            self._buf.extend(new)
            self.context._update(self._buf.view(), self.ngram_min, self.ngram_max, int(new.size))
            self._appended(int(new.size))
            if self._pending:
                self._score_pending()
        self._last = _EMPTY
        self._stats.draft_seconds += time.perf_counter() - t0

    def _reset_index(self) -> None:
        """Hook: the buffer was refilled from scratch."""

    def _appended(self, n_new: int) -> None:
        """Hook: ``n_new`` tokens were appended to the buffer."""

    def _score_pending(self) -> None:
        # score each pending proposal on the tokens that arrived since the last call,
        # so that the gate learns at once even while it declines to draft
        seq = self._buf.view()
        keep = []
        for start, cand, state, done in self._pending:
            have = min(cand.size, self._buf.n - start)
            if have <= done:
                keep.append((start, cand, state, done))
                continue
            eq = cand[done:have] == seq[start + done : start + have]
            right = int(eq.size if eq.all() else np.argmin(eq))
            self.gate.observe(state, right, right + 1 if right < eq.size else right, start=done)
            if right == eq.size and have < cand.size:
                keep.append((start, cand, state, have))
        self._pending = keep

    def save_dynamic(self, path: str | os.PathLike) -> NgramCache:
        """Merge the context cache into the dynamic cache (creating it if there was
        none) and write it to ``path`` in llama.cpp's format, like ``llama-lookup -lcd``.
        Returns the dynamic cache."""
        if self.dynamic is None:
            self.dynamic = NgramCache()
        self.dynamic.merge(self.context)
        self.dynamic.save(path)
        return self.dynamic

    def __repr__(self) -> str:
        parts = [f"n_draft={self.n_draft}"]
        if self.dynamic is not None:
            parts.append("dynamic")
        if self.static is not None:
            parts.append("static")
        if self.gate is not None:
            parts.append("gated")
        return f"<LookupDrafter {' '.join(parts)}, {self._buf.n} tokens>"


class CopyDrafter(LookupDrafter):
    """Copies spans: when the newest tokens repeat an earlier stretch of the sequence,
    proposes what followed that stretch; otherwise drafts as ``LookupDrafter``.

    Of the earlier places where the last ``min_match`` tokens occurred (the newest
    ``max_candidates``), it continues the one whose match extends furthest back (up to
    ``max_match`` tokens; the newest wins ties). llama.cpp's lookup chooses each drafted
    token by n-gram counts, which in text being copied (code under edit, a quoted
    passage) often picks a continuation seen more often elsewhere; a copy follows one
    place. Work per step is bounded by ``max_candidates * max_match`` comparisons plus
    one index entry per new token, never the length of the sequence.

    With a gate, copies and lookups are judged separately, copies by match length.
    """

    def __init__(self, static=None, dynamic: NgramCache | None = None, n_draft: int = 16,
                 ngram_min: int = 1, ngram_max: int = 4, gate: AdaptiveGate | None = None,
                 min_match: int = 2, max_match: int = 32, max_candidates: int = 8):
        super().__init__(static=static, dynamic=dynamic, n_draft=n_draft, ngram_min=ngram_min,
                         ngram_max=ngram_max, gate=gate)
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.min_match = int(min_match)
        self.max_match = int(max_match)
        self.max_candidates = int(max_candidates)
        self._index: dict[tuple, list[int]] = {}
        self._indexed = 0  # positions < _indexed are in the index

    def _reset_index(self) -> None:
        self._index = {}
        self._indexed = 0
        self._appended(0)

    def _appended(self, n_new: int) -> None:
        # index every position i (end of a min_match-gram) that has a successor
        seq = self._buf.view()
        m = self.min_match
        end = self._buf.n - 1  # the newest token has no successor yet
        i = max(self._indexed, m - 1)
        if i < end:
            toks = seq[max(0, i - m + 1) : end].tolist()
            off = max(0, i - m + 1)
            idx = self._index
            for j in range(i, end):
                key = tuple(toks[j - m + 1 - off : j + 1 - off])
                lst = idx.get(key)
                if lst is None:
                    idx[key] = [j]
                else:
                    lst.append(j)
            self._indexed = end

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        seq = self._buf.view()
        last = self._buf.n - 1
        m = self.min_match
        if last + 1 >= m:
            lst = self._index.get(tuple(seq[last - m + 1 : last + 1].tolist()))
            if lst:
                best_pos, best_len = -1, 0
                for pos in reversed(lst[-self.max_candidates :]):
                    length = m
                    limit = min(self.max_match, pos + 1)
                    while length < limit and seq[pos - length] == seq[last - length]:
                        length += 1
                    if length > best_len:
                        best_pos, best_len = pos, length
                cand = seq[best_pos + 1 : min(best_pos + 1 + n, last + 1)]
                if cand.size:
                    return cand.copy(), best_len, 1
        return super()._candidates(n)


class OracleDrafter:
    """Proposes the true continuation (taken from a reference run): the ceiling any
    drafter can reach with the same verification costs. For benchmarks. Once the
    verified text departs from the continuation it proposes nothing."""

    def __init__(self, continuation, n_draft: int = 8):
        if n_draft < 0:
            raise ValueError(f"n_draft must be >= 0, got {n_draft}")
        self.continuation = as_tokens(continuation, "continuation")
        self.n_draft = int(n_draft)
        self._n_prompt = 0
        self._n = 0
        self._stats = DraftStats()
        self._last = _EMPTY

    @property
    def stats(self) -> DraftStats:
        return self._stats

    def reset(self, prompt_tokens) -> None:
        self._n_prompt = int(as_tokens(prompt_tokens, "prompt_tokens").size)
        self._n = 0
        self._stats = DraftStats()
        self._last = _EMPTY

    def propose(self, n_max: int | None = None) -> np.ndarray:
        n = self.n_draft if n_max is None else min(int(n_max), self.n_draft)
        out = self.continuation[self._n : self._n + max(n, 0)]
        self._last = out
        if out.size:
            self._stats.proposals += 1
            self._stats.drafted += int(out.size)
        return out

    def accept(self, tokens) -> None:
        new = as_tokens(tokens)
        m = min(self._last.size, new.size)
        if m:
            eq = self._last[:m] == new[:m]
            self._stats.accepted += int(m if eq.all() else np.argmin(eq))
        if not np.array_equal(new, self.continuation[self._n : self._n + new.size]):
            self._n = self.continuation.size  # departed: nothing more to propose
        self._n += int(new.size)
        self._last = _EMPTY


def expected_rate(p: Sequence[float], costs: Sequence[float], k: int) -> float:
    """Tokens per unit of time when verifying k drafted tokens with conditional
    acceptances ``p`` (helper for reports and tests)."""
    c = _check_costs(costs)
    if k == 0:
        return 1.0
    e = 1.0 + float(np.sum(np.cumprod(np.asarray(p, dtype=float)[:k])))
    return e / float(c[k]) if k < c.size else math.nan
