"""How much of a draft is worth verifying: the one admission policy of ngramcache.

Verifying k drafted tokens costs more than verifying one token, and a draft pays only when
enough of it is right. A :class:`Gate` weighs the two for every proposal: it keeps the first
k tokens, k in 0..L, that maximise the expected tokens per unit of time,

    E(k) / cost(k + 1),   E(k) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_k,

and drafts only when that beats a plain step (rate 1) by ``min_gain``. ``cost`` is a
:class:`~ngramcache.decoding.costs.LearnedCosts` curve (learnt from the verification times
while decoding); ``p_j`` is the chance that drafted token j is right given the ones before
it, learnt per state (the proposal's source, its match length, whether the previous
proposal's first token was right) from every proposal scored against what followed, the
declined ones too, and starting from the package's priors (``ngramcache.decoding.priors``).
One bound keeps a wrong estimate cheap: a draft may cost at most ``risk`` one-token steps
beyond a plain step, a bound doubled by each draft kept whole and halved (not below
``risk``) by one whose first token was wrong.

:class:`GateSettings` is every setting; :class:`GatedDrafter` puts a gate in front of any
drafter, and is what the decoding loops and the commands use. docs/gate.md explains it.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ngramcache import _core
from ngramcache._prefix import accepted_prefix
from ngramcache._validate import as_tokens, check_int
from ngramcache.decoding.costs import LearnedCosts, check_costs, extend_costs, learned_costs
from ngramcache.decoding.priors import FLAT_PRIOR, LENGTH_BUCKETS, acceptance_means, state_index
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.base import Drafter, DraftStats, Proposal, Source

__all__ = ["Gate", "GateSettings", "GatedDrafter", "Priors", "expected_rate", "gated_drafter", "why_no_drafts"]

_EMPTY = np.zeros(0, dtype=np.int32)


class Priors(enum.Enum):
    """What a state's estimate is before the state has been seen."""

    TABLE = "table"  #: the package's table of how often drafts in each state were right
    FLAT = "flat"    #: one in three for every state, shrunk towards what all states saw


@dataclass(frozen=True)
class GateSettings:
    """Every setting of the gate (docs/gate.md).

    ``min_gain`` (fraction, default 0.05): how much a draft's expected rate must beat a plain
    step's by; the estimates that trigger a draft are the lucky ones.
    ``decay`` (per scored token, default 0.97): how fast old evidence fades, so that the gate
    follows a text that turns from copying to writing.
    ``prior_weight`` (observations, default 4.0): how many observations a state's prior counts
    as against the state's own; also how many expected hits the scaling of the priors by this
    text counts as already seen.
    ``priors`` (default ``Priors.TABLE``): where a state's estimate starts.
    ``risk`` (one-token steps, default 2.0; None: no bound): what the first draft may cost
    beyond a plain step.
    ``learn_costs`` (default True): refine the cost curve from the verification times; False
    decides on the curve as given.
    ``cost_window`` (verification times per batch size, default 64) and ``spike`` (multiples
    of a batch size's median, default 3.0): how the curve is learnt
    (:class:`~ngramcache.decoding.costs.LearnedCosts`)."""

    min_gain: float = 0.05
    decay: float = 0.97
    prior_weight: float = 4.0
    priors: Priors = Priors.TABLE
    risk: float | None = 2.0
    learn_costs: bool = True
    cost_window: int = 64
    spike: float = 3.0

    def __post_init__(self):
        if not (self.min_gain >= 0 and math.isfinite(self.min_gain)):
            raise ValueError(f"min_gain must be a finite number >= 0, got {self.min_gain}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")
        if not (self.prior_weight > 0 and math.isfinite(self.prior_weight)):
            raise ValueError(f"prior_weight must be a finite number > 0, got {self.prior_weight}")
        if not isinstance(self.priors, Priors):
            raise TypeError(f"priors must be a Priors ({', '.join(p.name for p in Priors)}), got {self.priors!r}")
        if self.risk is not None and not (self.risk > 0):
            raise ValueError(f"risk must be > 0 or None, got {self.risk}")
        check_int("cost_window", self.cost_window, 5)
        if not self.spike > 1.0:
            raise ValueError(f"spike must be > 1, got {self.spike}")


class Gate:
    """The admission policy (module docstring) on one cost curve.

    ``costs``: a :class:`~ngramcache.decoding.costs.LearnedCosts` (shared by every gate on
    one model), or a sequence (``costs[k-1]``: the time to verify k tokens; only ratios
    matter), learnt from this gate's verifications only. ``settings``: :class:`GateSettings`.

    The arithmetic is the compiled core's (``cpp/include/ngramcache/gate.hpp``), the one
    implementation that the decoding loops and the gated replay
    (``ngramcache.replays.replay_drafter``) share; this class hands it the priors and, as
    the curve is learnt, each new curve."""

    def __init__(self, costs: LearnedCosts | Sequence[float], settings: GateSettings = GateSettings()):
        if not isinstance(settings, GateSettings):
            raise TypeError(f"settings must be a GateSettings, got {type(settings).__name__}")
        self.settings = settings
        if not isinstance(costs, LearnedCosts):
            costs = LearnedCosts(check_costs(costs), window=settings.cost_window, spike=settings.spike)
        self.costs = costs
        self.max_len = costs.size - 1
        self._version = -1
        self._cost = list(costs.prior)
        means = acceptance_means(self.max_len + 1) if settings.priors is Priors.TABLE else ()
        self._core = _core.Gate(self._cost, LENGTH_BUCKETS, len(Source), means, min_gain=settings.min_gain,
                                decay=settings.decay, prior_weight=settings.prior_weight, risk=settings.risk,
                                flat_prior=FLAT_PRIOR)

    # -- the curve

    def curve(self) -> list[float]:
        """The cost curve the gate decides on now (``cost(k) / cost(1)``)."""
        if not self.settings.learn_costs:
            return self._cost
        c = self.costs.curve()
        if self.costs.version != self._version:
            self._version, self._cost = self.costs.version, c
            self._core.set_cost(c)
        return self._cost

    def verified(self, n_tokens: int, seconds: float) -> None:
        """A verification of ``n_tokens`` tokens (the last settled token and ``n_tokens - 1``
        drafted ones) took ``seconds``: the curve learns from it."""
        if self.settings.learn_costs:
            self.costs.observe(n_tokens, seconds)

    # -- the estimates

    @staticmethod
    def state(confidence: int, previous: int, source: Source) -> int:
        """The state of a proposal (``ngramcache.decoding.priors.state_index``)."""
        return state_index(confidence, previous, source)

    def probabilities(self, state: int, n: int) -> np.ndarray:
        """Estimated conditional acceptance of drafted tokens 1..n in ``state``."""
        return self._core.probabilities(state, max(0, min(n, self.max_len + 1)))

    def tallies(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """The decayed hits and trials of ``state`` per draft position: what its estimates
        rest on beyond the priors (``bench/make_gate_priors.py`` fits the priors from them)."""
        return self._core.tallies(state)

    # -- the decision

    def choose(self, state: int, available: int) -> int:
        """How many of ``available`` drafted tokens to verify (0 = do not draft)."""
        k_max = min(available, self.max_len)
        if k_max <= 0:
            return 0
        self.curve()  # the core decides on the curve as learnt now
        return self._core.choose(state, k_max)

    def settled(self, k: int, n_accepted: int) -> None:
        """A draft of ``k`` tokens was verified and ``n_accepted`` of them kept: the bound on
        the next draft grows (kept whole) or shrinks (first token wrong)."""
        if self.settings.risk is None or not 0 < k <= self.max_len:
            return
        if n_accepted >= k:
            self.curve()  # the bound grows up to the longest batch's cost as learnt now
        self._core.settled(k, max(0, n_accepted))

    def observe(self, state: int, n_right: int, n_scored: int, start: int = 0) -> None:
        """Drafted tokens ``start+1 .. start+n_scored`` of a proposal made in ``state`` were
        compared with what followed: the first ``n_right`` of them were right (``n_right <
        n_scored``: the next one was wrong)."""
        if n_scored > 0:
            self._core.observe(state, max(0, n_right), n_scored, start)

    def __repr__(self) -> str:
        c = self.curve()
        return f"<Gate cost({len(c)}) = {c[-1]:.2f}, {self.costs.describe()}>"


class GatedDrafter:
    """A ``Drafter`` that puts ``gate`` in front of ``drafter``: each step it asks the drafter
    for one proposal (``drafter.proposal(n)``, or ``propose`` for a drafter of the bare
    protocol: a lookup whose confidence is its length), lets the gate cut it, scores it
    against the tokens that really follow, and hands the verification times to the gate.
    ``stats`` counts what was handed to the verifier; ``offered`` the proposals the drafter
    made, ``declined`` those the gate cut to nothing."""

    def __init__(self, drafter: Drafter, gate: Gate):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
        if not isinstance(gate, Gate):
            raise TypeError(f"gate must be a Gate, got {type(gate).__name__}")
        self.drafter, self.gate = drafter, gate
        self._stats = DraftStats()
        self._last = _EMPTY
        self._first: int | None = None
        self._prev = 2  # previous proposal's first token: 0 wrong, 1 right, 2 no proposal
        self._n = 0  # tokens in the sequence
        # proposals being scored: (start, tokens, state, scored); the tokens since the oldest
        self._pending: list[tuple[int, np.ndarray, int, int]] = []
        self._recent: list[int] = []
        self._recent_start = 0
        self.offered = self.declined = 0
        self._first_scored = self._first_right = 0

    @property
    def n_draft(self) -> int:
        """The longest proposal asked for: the drafter's own ``n_draft`` (the gate's longest
        batch for a drafter without one)."""
        return getattr(self.drafter, "n_draft", self.gate.max_len)

    @property
    def stats(self) -> DraftStats:
        """Counters since the last ``reset``: what was handed to the verifier."""
        return self._stats

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence (the gate's estimates go on: a new request of the same kind)."""
        t0 = time.perf_counter()
        self.drafter.reset(prompt_tokens)
        self._n = len(as_tokens(prompt_tokens, "prompt_tokens"))
        self._last, self._first, self._prev = _EMPTY, None, 2
        self._pending.clear()
        self._recent, self._recent_start = [], self._n
        self.offered = self.declined = self._first_scored = self._first_right = 0
        # what the earlier requests learnt, for the next process (a server's requests: at most
        # a write a minute)
        self.gate.costs.save(at_most_every=60.0)
        self._stats = DraftStats(draft_seconds=time.perf_counter() - t0)

    def _proposal(self, n: int) -> Proposal:
        step = getattr(self.drafter, "proposal", None)
        if step is not None:
            return step(n)
        tokens = as_tokens(self.drafter.propose(n), "draft")[:n]
        return Proposal(tokens, int(tokens.size), Source.LOOKUP)

    def propose(self, n_max: int | None = None) -> np.ndarray:
        """What of the drafter's proposal (up to ``n_max`` tokens) the gate expects to pay."""
        t0 = time.perf_counter()
        n = self.n_draft if n_max is None else min(check_int("n_max", n_max, 0), self.n_draft)
        out, self._first = _EMPTY, None
        if n > 0:
            p = self._proposal(n)
            cand = p.tokens
            if cand.size:
                self.offered += 1
                self._first = int(cand[0])
                state = self.gate.state(p.confidence, self._prev, p.source)
                if not self._pending:
                    self._recent, self._recent_start = [], self._n
                self._pending.append((self._n, cand, state, 0))
                k = self.gate.choose(state, int(cand.size))
                if k == 0:
                    self.declined += 1
                    self._stats.skipped += 1
                out = cand[:k]
        self._last = out
        if out.size:
            self._stats.proposals += 1
            self._stats.drafted += int(out.size)
        self._stats.draft_seconds += time.perf_counter() - t0
        return out

    def accept(self, tokens) -> None:
        """The tokens the verifier settled on since the last call."""
        t0 = time.perf_counter()
        new = as_tokens(tokens)
        self.drafter.accept(new)
        if new.size:
            n_acc = accepted_prefix(self._last, new)
            self._stats.accepted += n_acc
            self.gate.settled(int(self._last.size), n_acc)
            self._prev = 2 if self._first is None else int(int(new[0]) == self._first)
            self._first = None
            self._n += int(new.size)
            if self._pending:
                self._recent.extend(new.tolist())
                self._score_pending()
        self._last = _EMPTY
        self._stats.draft_seconds += time.perf_counter() - t0

    def verified(self, n_tokens: int, seconds: float) -> None:
        """The verifier took ``seconds`` for a batch of ``n_tokens`` tokens: the gate's curve
        learns from it."""
        self.gate.verified(n_tokens, seconds)

    def _score_pending(self) -> None:
        # each pending proposal is scored on the tokens that arrived since, so that the gate
        # learns at once, the declined proposals too
        seq, base = self._recent, self._recent_start
        keep = []
        for start, cand, state, done in self._pending:
            have = min(cand.size, self._n - start)
            if have <= done:
                keep.append((start, cand, state, done))
                continue
            truth = np.asarray(seq[start - base + done : start - base + have], dtype=np.int32)
            right = accepted_prefix(cand[done:have], truth)
            if done == 0:
                self._first_scored += 1
                self._first_right += int(right > 0)
            self.gate.observe(state, right, right + 1 if right < have - done else right, start=done)
            if right == have - done and have < cand.size:
                keep.append((start, cand, state, have))
        self._pending = keep
        if keep:
            drop = min(s for s, *_ in keep) - base
            if drop > 0:
                del self._recent[:drop]
                self._recent_start += drop
        else:
            self._recent, self._recent_start = [], self._n

    def why_no_drafts(self) -> str | None:
        """One sentence on why nothing was drafted since the last ``reset``; None when
        something was, or nothing could be (no step)."""
        if self._stats.drafted:
            return None
        if not self.offered:
            return ("nothing was drafted: the drafter found no earlier text that the output repeats, "
                    "so it had nothing to propose")
        curve = self.gate.curve()
        k = min(len(curve), 2)
        right = (f", and {self._first_right} of {self._first_scored} first proposed tokens were right"
                 if self._first_scored else "")
        return (f"nothing was drafted: the gate declined all {self.offered} proposals, none expected to beat a plain "
                f"step by {self.gate.settings.min_gain:.0%} (verifying {k} tokens costs {curve[k - 1]:.2f}x one "
                f"token on this machine, {self.gate.costs.describe()}{right})")

    def __repr__(self) -> str:
        return f"<GatedDrafter {self.drafter!r}, {self.gate!r}>"


def why_no_drafts(drafter) -> str | None:
    """:meth:`GatedDrafter.why_no_drafts` of ``drafter``; for an ungated drafter that drafted
    nothing, why; None when it drafted."""
    if drafter is None:
        return None
    if isinstance(drafter, GatedDrafter):
        return drafter.why_no_drafts()
    if getattr(drafter.stats, "drafted", 1) == 0:
        return "nothing was drafted: the drafter found no earlier text that the output repeats"
    return None


def gated_drafter(costs: LearnedCosts | Sequence[float] | None, drafter: str | None = None, n_draft: int = N_DRAFT, *,
                  settings: GateSettings = GateSettings(), gate: Gate | None = None, **options):
    """The drafter called ``drafter`` (``ngramcache.drafters.catalog``; None: its default)
    proposing up to ``n_draft`` tokens, behind a :class:`Gate` on ``costs`` (a
    ``LearnedCosts``, or seconds to verify 1, 2, ... tokens, extended to ``n_draft + 1``)
    with ``settings``. ``costs`` None: no gate (every proposal verified whole). ``gate``: a
    gate that has already learnt (an earlier turn's) to go on with. ``options``: the
    drafter's own keywords (None values left out)."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, make_drafter

    n_draft = check_int("n_draft", n_draft, 0)
    inner = make_drafter(DEFAULT_DRAFTER if drafter is None else drafter, n_draft=n_draft, **options)
    if costs is None:
        return inner
    if gate is None or gate.max_len < n_draft:
        if not isinstance(costs, LearnedCosts):
            costs = extend_costs(costs, n_draft + 1)
        elif costs.size < n_draft + 1 and costs.key is not None:
            # a longer draft than the curve covers (a request's own n_draft): the same
            # model's curve, extended
            costs = learned_costs(costs.key, n_draft + 1, path=costs.path)
        gate = Gate(costs, settings)
    return GatedDrafter(inner, gate)


def expected_rate(p: Sequence[float], costs: Sequence[float], k: int) -> float:
    """Tokens per unit of time when verifying k drafted tokens with conditional
    acceptances ``p`` (helper for reports and tests)."""
    c = check_costs(costs)
    k = check_int("k", k, 0)
    if k == 0:
        return 1.0
    e = 1.0 + float(np.sum(np.cumprod(np.asarray(p, dtype=float)[:k])))
    return e / float(c[k]) if k < c.size else math.nan
