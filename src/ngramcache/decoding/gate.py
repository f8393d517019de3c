"""How much of a draft is worth verifying: the adaptive gate.

Verifying k drafted tokens costs more than verifying one token, and a draft pays only
when enough of it is right. :class:`AdaptiveGate` weighs the two: it knows what
verifying a batch of k tokens costs on this model (``costs``, e.g. from
``ngramcache.integrations.llama.verify_costs``) and learns how often drafts have been right so far.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ngramcache._validate import check_int

__all__ = ["AdaptiveGate", "VerifyTimes", "check_costs", "expected_rate"]

#: how many expected hits the scaling of the priors by this text's hits counts as already seen
PRIOR_WEIGHT = 4.0
#: the highest prior estimate: no draft position is ever taken as certain
MAX_PRIOR = 0.995


class VerifyTimes:
    """This machine's verification times as decoding meets them, against the measured curve.

    A stored cost curve is the machine as it was when it was measured: another process, a
    different power state or a longer context can make batches dearer (or cheaper) against
    one-token steps than the curve says, and a gate on a curve that is too flat drafts at a
    loss. Each verification's wall time is reported to :meth:`observe` with the curve's
    cost for its size; from them comes ``scale``, the factor by which the curve's extra cost
    of a batch over one token is multiplied: ``cost'(k) = 1 + scale * (cost(k) - 1)``.

    ``scale`` is 1 until ``min_plain`` one-token steps have been timed (their median is the
    unit the batches are measured in; batches before it are not used) and is shrunk towards 1 while little has been seen: the batches'
    observed extra cost counts against ``weight`` one-token steps of extra cost at the
    curve's value. Every observation, plain steps included, ages what was seen before
    (``decay``), so the scale follows a machine that changes, and returns towards the curve
    when a gate, put off by a bad stretch, stops drafting. A time over twice the expected one
    (the process descheduled, a collection) counts as twice.
    Several gates on one model (a server's conversations) may share one ``VerifyTimes``.
    """

    #: a time beyond this many times the expected one counts as this many
    SPIKE = 2.0

    def __init__(self, decay: float = 0.98, weight: float = 16.0, min_plain: int = 5):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if weight <= 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        self.decay, self.weight = float(decay), float(weight)
        self.min_plain = check_int("min_plain", min_plain, 1)
        self.scale = 1.0
        #: grows whenever ``scale`` changes, so that a gate knows to rescale its curve
        self.version = 0
        self._plain_s = self._plain_n = 0.0  # one-token steps: decayed seconds, count
        self._first: list[float] = []  # the first min_plain one-token steps: their median is the first unit
        self._batch_s = self._batch_n = self._batch_extra = 0.0  # batches: seconds, count, curve's extra cost

    @property
    def plain_seconds(self) -> float | None:
        """The mean time of a one-token step so far (None before ``min_plain`` of them)."""
        return self._plain_s / self._plain_n if self._plain_n > 0 else None

    def observe(self, n_tokens: int, seconds: float, curve_cost: float) -> None:
        """A verification batch of ``n_tokens`` took ``seconds``; the curve says it costs
        ``curve_cost`` one-token steps."""
        if not (seconds > 0 and math.isfinite(seconds)) or n_tokens < 1:
            return
        unit = self.plain_seconds
        if unit is None:
            # no unit to measure batches in yet; the first steps' median, so that one slow
            # step among them does not set it
            if n_tokens == 1:
                self._first.append(seconds)
                if len(self._first) >= self.min_plain:
                    self._plain_s = float(np.median(self._first)) * len(self._first)
                    self._plain_n = float(len(self._first))
            return
        d = self.decay
        self._plain_s *= d
        self._plain_n *= d
        self._batch_s *= d
        self._batch_n *= d
        self._batch_extra *= d
        if n_tokens == 1:
            self._plain_s += min(seconds, self.SPIKE * unit)
            self._plain_n += 1.0
        else:
            self._batch_s += min(seconds, self.SPIKE * unit * (1.0 + self.scale * (curve_cost - 1.0)))
            self._batch_n += 1.0
            self._batch_extra += curve_cost - 1.0
        unit = self.plain_seconds
        seen_extra = self._batch_s / unit - self._batch_n
        scale = min(4.0, max(0.25, (seen_extra + self.weight) / (self._batch_extra + self.weight)))
        if abs(scale - self.scale) > 0.01 * self.scale:
            self.scale = scale
            self.version += 1


def check_costs(costs) -> np.ndarray:
    """``costs`` (``costs[k-1]``: the time to verify k tokens) relative to ``costs[0]``;
    ValueError unless it is a non-empty 1-D sequence of positive finite numbers."""
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

    The ``p_j`` are learnt per state (where the proposal came from, how long the match
    or proposal was, and whether the previous proposal's first token was right) and
    decay so that the gate follows changes within a generation. Every proposal is scored
    against the tokens that really followed, including the proposals the gate declined,
    so skipping does not stop learning.

    Before a state has been seen, its estimate is its prior. ``priors="default"`` (the
    default) is a table of how often drafts in each state and at each position were right
    on a varied set of prompts and models (``ngramcache.decoding.gate_priors``): a copy
    that continues a 30-token match is drafted long from the first step, a one-token
    match is not drafted at all. That prior is scaled down by how this text is going: the
    hits seen over all states against the hits the priors expected, when fewer. ``priors=None``: one
    flat Beta ``prior`` for every state, shrunk towards the estimate pooled over states;
    then ``carry_forward=True`` estimates a position no proposal has reached yet from the
    furthest position reached, so draft lengths grow at once where long drafts have been
    right (for verifiers whose long batches are cheap).

    Two checks keep a wrong estimate from costing much. The cost curve is checked against
    what this run's verifications really take (``verify_times``, a :class:`VerifyTimes`;
    loops report each batch through ``observe_verify``), so a stored curve that is flatter
    than the machine now does not go on drafting at a loss. And what the drafts have gained
    or lost against plain decoding so far (``profit``, in one-token steps, reported through
    ``settled``) raises the margin a draft must beat plain by while it is negative
    (``loss_scale``, ``loss_decay``, ``max_margin``). A third bounds the loss of a single
    draft: what a draft may cost beyond a plain step starts at ``risk`` one-token steps and
    doubles with each draft kept whole (where batches are cheap, as with transformers on a
    CPU or any GPU, the bound does not bind).
    """

    #: proposal lengths (or match lengths) are bucketed: 1, 2-3, 4-7, 8+
    _LEN_BUCKETS = (1, 2, 4, 8)
    #: where a proposal came from: 0 lookup caches, 1 a copy of an earlier span, 2 the
    #: most frequent continuation of a suffix match (SuffixDrafter)
    N_SOURCES = 3

    def __init__(self, costs: Sequence[float], decay: float = 0.97, prior: tuple[float, float] = (1.0, 2.0),
                 shrink: float = 4.0, overhead: float = 0.0, min_gain: float = 0.05, carry_forward: bool = False,
                 priors: str | None = "default", verify_times: VerifyTimes | bool = True,
                 loss_scale: float = 2.5, loss_decay: float = 0.99, max_margin: float = 0.2,
                 risk: float | None = 2.0):
        self.costs = check_costs(costs)
        if verify_times is True:
            verify_times = VerifyTimes()
        elif verify_times is not False and not isinstance(verify_times, VerifyTimes):
            raise TypeError(f"verify_times must be a VerifyTimes, True or False, got {type(verify_times).__name__}")
        # the curve checked against this run's own verification times (False: the curve as given)
        self.verify_times = verify_times or None
        self._scale_version = -1
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
        if not loss_scale > 0:
            raise ValueError(f"loss_scale must be > 0, got {loss_scale}")
        if not 0.0 < loss_decay <= 1.0:
            raise ValueError(f"loss_decay must be in (0, 1], got {loss_decay}")
        if max_margin < 0:
            raise ValueError(f"max_margin must be >= 0, got {max_margin}")
        # drafts that have lost time in this text (one-token steps against plain decoding,
        # ``profit`` below zero) raise the margin a draft must beat plain by to
        # min_gain + deficit / loss_scale, at most ``max_margin`` (never below min_gain): a
        # gate whose estimates have been too hopeful here sends only its surest drafts until
        # the deficit has decayed (``loss_decay`` a step) or been won back.
        self.loss_scale = float(loss_scale)
        self.loss_decay = float(loss_decay)
        self.max_margin = float(max_margin)
        self.profit = 0.0
        if risk is not None and not risk > 0:
            raise ValueError(f"risk must be > 0 or None, got {risk}")
        # what a draft may cost beyond a plain step (one-token steps lost if its first token is
        # wrong): ``risk`` at first, doubled by each draft kept whole, halved (not below
        # ``risk``) by each draft whose first token was wrong. One long draft that fails can
        # cost a short answer a quarter of its time; None: no bound
        self.risk = None if risk is None else float(risk)
        self._risk = self.risk
        self.decay = float(decay)
        self.prior = (float(prior[0]), float(prior[1]))
        self.shrink = float(shrink)
        self.overhead = float(overhead)  # cost of one proposal, in units of a 1-token verify
        # positions no proposal has reached yet take the estimate of the furthest one that
        # has been reached, not the prior: a copy that has been right for 12 tokens tends to
        # stay right, and where verifying long batches costs little more than short ones
        # (a float32 model on a CPU) the prior would hold drafts back for many steps
        self.carry_forward = bool(carry_forward)
        self.max_len = self.costs.size - 1
        if priors is None:
            self._prior_means = None
        elif priors == "default":
            from ngramcache.decoding.gate_priors import prior_means

            self._prior_means = prior_means(self.max_len + 1)
        else:
            raise ValueError(f"priors must be 'default' or None, got {priors!r}")
        # the hits the priors expected for the proposals scored so far, decayed as the hits
        self._pool_expected = [0.0] * (self.max_len + 1)
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
        2: no previous proposal) and the source (0 lookup, 1 copy, 2 suffix)."""
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
        if self._prior_means is not None:
            m, pe = self._prior_means[state], self._pool_expected
            out = []
            for j in range(n):
                # this text against the priors' expectation, shrunk to 1 while little is seen.
                # Only ever down: hits beyond the expected come from the states that copy
                # well (long matches) and say nothing of the others; a state's own hits
                # raise its own estimate.
                scale = min(1.0, (ph[j] + PRIOR_WEIGHT) / (pe[j] + PRIOR_WEIGHT))
                target = min(MAX_PRIOR, m[j] * scale)
                out.append((h[j] + w * target) / (t[j] + w))
            return out
        if not self.carry_forward:
            return [(h[j] + w * (ph[j] + a) / (pt[j] + a + b)) / (t[j] + w) for j in range(n)]
        out, est = [], a / (a + b)
        for j in range(n):
            if pt[j] >= 1.0 or t[j] >= 1.0:  # reached by proposals (the counts decay)
                est = (h[j] + w * (ph[j] + a) / (pt[j] + a + b)) / (t[j] + w)
            out.append(est)
        return out

    def choose(self, state: int, available: int) -> int:
        """How many of ``available`` drafted tokens to verify (0 = do not draft)."""
        k_max = min(available, self.max_len)
        if k_max <= 0:
            return 0
        vt = self.verify_times
        if vt is not None and vt.version != self._scale_version:
            self._scale_version = vt.version
            self._cost = [1.0 + vt.scale * (float(c) - 1.0) for c in self.costs]
        margin = self.min_gain
        if self.profit < 0:
            margin = max(margin, min(self.max_margin, margin - self.profit / self.loss_scale))
        best_k, best_rate = 0, 1.0 + margin  # plain decoding: 1 token per unit of cost
        expected, run = 1.0, 1.0
        cost = self._cost
        if self._risk is not None:
            while k_max > 0 and cost[k_max] - 1.0 > self._risk:
                k_max -= 1
        for j, p in enumerate(self._probs(state, k_max)):
            run *= p
            expected += run
            rate = expected / (cost[j + 1] + self.overhead)
            if rate > best_rate:
                best_k, best_rate = j + 1, rate
        return best_k

    @property
    def effective_costs(self) -> np.ndarray:
        """The cost curve the gate decides on: ``costs`` with its extra cost of a batch
        over one token scaled by what this run's verifications took (``verify_times``)."""
        s = self.verify_times.scale if self.verify_times is not None else 1.0
        return 1.0 + s * (self.costs - 1.0)

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        """A verification of ``n_tokens`` tokens (the last settled token and ``n_tokens - 1``
        drafted ones) took ``seconds``: checks the cost curve against it (``verify_times``).
        Batches beyond the curve are not used."""
        if self.verify_times is not None and 1 <= n_tokens <= self.costs.size:
            self.verify_times.observe(n_tokens, seconds, float(self.costs[n_tokens - 1]))

    def settled(self, k: int, n_accepted: int) -> None:
        """A draft of ``k`` tokens was verified and ``n_accepted`` of them kept (``k`` 0: a
        plain step): what it gained over plain decoding (``1 + n_accepted`` tokens for
        ``cost(k + 1)``) is added to ``profit``, which decays by ``loss_decay`` a step, and
        the bound on the next draft's loss (``risk``) grows or shrinks with it."""
        self.profit *= self.loss_decay
        if 0 < k <= self.max_len:
            self.profit += 1.0 + n_accepted - self._cost[k]
            if self.risk is not None:
                if n_accepted >= k:
                    self._risk = min(2.0 * self._risk, 1e9)
                elif n_accepted == 0:
                    self._risk = max(self.risk, self._risk / 2.0)

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
        ph, pt, pe = self._pool_hits, self._pool_trials, self._pool_expected
        m = self._prior_means[state] if self._prior_means is not None else None
        for j in range(start, tried):
            hit = 1.0 if j < start + n_right else 0.0
            h[j] = h[j] * d + hit
            t[j] = t[j] * d + 1.0
            ph[j] = ph[j] * d + hit
            pt[j] = pt[j] * d + 1.0
            if m is not None:
                pe[j] = pe[j] * d + m[j]


def expected_rate(p: Sequence[float], costs: Sequence[float], k: int) -> float:
    """Tokens per unit of time when verifying k drafted tokens with conditional
    acceptances ``p`` (helper for reports and tests)."""
    c = check_costs(costs)
    k = check_int("k", k, 0)
    if k == 0:
        return 1.0
    e = 1.0 + float(np.sum(np.cumprod(np.asarray(p, dtype=float)[:k])))
    return e / float(c[k]) if k < c.size else math.nan
