"""Drafters: what proposes tokens for a model to verify.

A drafter sees the verified sequence grow (``reset`` with the prompt, then ``accept``
with every batch of verified tokens) and proposes continuations (``propose``). It
never sees rejected tokens, so it never has to forget anything.

Here: the ``Drafter`` protocol, its ``DraftStats``, ``SequenceDrafter`` (the bookkeeping
every drafter shares, with three hooks for a drafter written in Python) and
``CoreSequenceDrafter``, the base of every drafter whose matching runs in the compiled core
(its handle is ``_impl``, as for ``NgramCache`` and ``StaticTable``). The drafters
themselves are in the sibling modules; ``ngramcache.drafters.registry`` names them. With an
``ngramcache.decoding.gate.AdaptiveGate`` a drafter proposes only as much as is expected to
pay for its verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache.decoding.gate import AdaptiveGate
from ngramcache.decoding.prefix import accepted_prefix
from ngramcache.drafters.options import Option, check_n_draft, check_options

__all__ = ["Drafter", "DraftStats", "SequenceDrafter", "CoreSequenceDrafter"]

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
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@runtime_checkable
class Drafter(Protocol):
    """What a speculative loop needs from a drafter.

    ``reset(prompt_tokens)``: start a new sequence. ``propose(n_max)``: up to ``n_max``
    int32 tokens expected to follow the sequence (possibly none). ``accept(tokens)``:
    the tokens the verifier settled on since the last call, including its own next
    token (the correction or the bonus token). ``stats``: a ``DraftStats``.

    Optional: ``verified(n_tokens, seconds)``, the wall time of each verification batch
    (the last settled token and the draft), which ``ngramcache``'s loop and ``hf.generate``
    report when the drafter has it (a gated drafter checks its cost curve against it).
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
# the common part of every drafter that follows the verified sequence


class SequenceDrafter:
    """The bookkeeping every sequence-following drafter shares: the verified tokens,
    the counters, and the adaptive gate (what the gate was told, and scoring each
    proposal against what really followed).

    A subclass provides three hooks: ``_reset_index()`` (the buffer was refilled from
    scratch), ``_appended(n_new)`` (``n_new`` verified tokens were appended) and
    ``_candidates(n) -> (tokens, confidence, source)``: up to ``n`` proposed tokens,
    the confidence the gate keys on (a proposal or match length) and the gate source
    (see ``AdaptiveGate.state``).

    ``OPTIONS`` (``Option`` objects) are the constructor's own settings and ``ORDERED`` the
    pairs ``(a, b)`` of them that need ``a <= b``; ``_set_options`` checks them and sets
    them as attributes. The registry builds its flags and checks from the same lists.
    """

    OPTIONS: tuple[Option, ...] = ()
    ORDERED: tuple[tuple[str, str], ...] = ()

    def __init__(self, n_draft: int, gate: AdaptiveGate | None = None):
        self.n_draft = check_n_draft(n_draft)
        if gate is not None and not isinstance(gate, AdaptiveGate):
            raise TypeError(f"gate must be an AdaptiveGate or None, got {type(gate).__name__}")
        self.gate = gate
        self._buf = _TokenBuffer()
        self._stats = DraftStats()
        self._last = _EMPTY  # the proposal awaiting verification
        # proposals being scored against what really followed: (start, tokens, state, scored)
        self._pending: list[tuple[int, np.ndarray, int, int]] = []
        self._prev = 2  # previous proposal's first token: 0 wrong, 1 right, 2 no proposal
        self._first: int | None = None

    def _set_options(self, **values) -> None:
        for name, value in check_options(self.OPTIONS, values, self.ORDERED).items():
            setattr(self, name, value)

    @property
    def stats(self) -> DraftStats:
        """Counters since the last ``reset``."""
        return self._stats

    @property
    def tokens(self) -> np.ndarray:
        """The verified sequence so far (a read-only view)."""
        v = self._buf.view()
        v.flags.writeable = False
        return v

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence from ``prompt_tokens``."""
        t0 = time.perf_counter()
        arr = as_tokens(prompt_tokens, "prompt_tokens")
        self._buf.clear()
        self._buf.extend(arr)
        self._reset_index()
        self._stats = DraftStats(draft_seconds=time.perf_counter() - t0)
        self._last = _EMPTY
        self._pending.clear()
        self._prev = 2
        self._first = None

    def propose(self, n_max: int | None = None) -> np.ndarray:
        """Up to ``min(n_max, n_draft)`` tokens to follow the sequence (``n_max`` None:
        ``n_draft``); with a gate, only as many as are expected to pay."""
        t0 = time.perf_counter()
        n_max = check_int("n_max", n_max, 0, none_ok=True)
        n = self.n_draft if n_max is None else min(n_max, self.n_draft)
        out = _EMPTY
        self._first = None
        if n > 0:
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

    def accept(self, tokens) -> None:
        """Append the tokens the verifier settled on since the last call (the accepted
        drafts and its own next token)."""
        t0 = time.perf_counter()
        new = as_tokens(tokens)
        if new.size:
            n_acc = accepted_prefix(self._last, new)
            self._stats.accepted += n_acc
            if self.gate is not None:
                self.gate.settled(int(self._last.size), n_acc)
            if self._first is not None:
                self._prev = 1 if int(new[0]) == self._first else 0
            elif self.gate is not None:
                self._prev = 2
            self._first = None
            self._buf.extend(new)
            self._appended(int(new.size))
            if self._pending:
                self._score_pending()
        self._last = _EMPTY
        self._stats.draft_seconds += time.perf_counter() - t0

    def verified(self, n_tokens: int, seconds: float) -> None:
        """The verifier took ``seconds`` for a batch of ``n_tokens`` tokens (the last settled
        token and the draft): the gate checks its cost curve against it
        (``AdaptiveGate.observe_verify``). Optional for a drafter; loops that time their
        verifications call it when it is there."""
        if self.gate is not None:
            self.gate.observe_verify(n_tokens, seconds)

    def _reset_index(self) -> None:
        """Hook: the buffer was refilled from scratch."""

    def _appended(self, n_new: int) -> None:
        """Hook: ``n_new`` tokens were appended to the buffer."""

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        """Hook: (up to ``n`` proposed tokens, confidence, gate source)."""
        return _EMPTY, 0, 0

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
            right = accepted_prefix(cand[done:have], seq[start + done : start + have])
            self.gate.observe(state, right, right + 1 if right < have - done else right, start=done)
            if right == have - done and have < cand.size:
                keep.append((start, cand, state, have))
        self._pending = keep


class CoreSequenceDrafter(SequenceDrafter):
    """A ``SequenceDrafter`` whose index and matching live in the compiled core: ``_impl``,
    an object of the core's sequence protocol (``reset``, ``accept``, ``propose``,
    ``confidence``) that sees the same verified tokens. A subclass sets ``self._impl`` in
    its constructor and the gate source ``_SOURCE`` (see ``AdaptiveGate.state``).
    ``ngramcache.replays.replay_drafter`` replays such a drafter entirely in C++."""

    _SOURCE = 1
    _impl = None

    def _reset_index(self) -> None:
        self._impl.reset(self._buf.view())

    def _appended(self, n_new: int) -> None:
        self._impl.accept(self._buf.view()[self._buf.n - n_new :])

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        cand = self._impl.propose(n)
        return cand, int(self._impl.confidence), self._SOURCE

    def __repr__(self) -> str:
        settings = "".join(f" {o.name}={getattr(self, o.name)!r}" for o in self.OPTIONS)
        gated = ", gated" if self.gate is not None else ""
        return f"<{type(self).__name__} n_draft={self.n_draft}{settings}{gated}, {self._buf.n} tokens>"
