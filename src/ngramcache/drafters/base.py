"""Drafters: what proposes tokens for a model to verify.

A drafter sees the verified sequence grow (``reset`` with the prompt, then ``accept``
with every batch of verified tokens) and proposes continuations (``propose``). It
never sees rejected tokens, so it never has to forget anything.

Here: the ``Drafter`` protocol, its ``DraftStats``, ``SequenceDrafter`` (the bookkeeping
every drafter shares, with three hooks for a drafter written in Python, whose sequence it
keeps) and ``CoreSequenceDrafter``, the base of every drafter whose matching runs in the
compiled core (its handle is ``_impl``, as for ``NgramCache`` and ``StaticTable``), which
holds the sequence itself. The drafters
themselves are in the sibling modules; ``ngramcache.drafters.registry`` names them.

A drafter is a leaf: it proposes, and says how sure it is and where the proposal came from
(:meth:`SequenceDrafter.proposal`, a :class:`Proposal`). How much of a proposal is worth
verifying is decided outside it, by the decoding layer's gate (``ngramcache.decoding.gate``),
which wraps any drafter.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache._prefix import accepted_prefix
from ngramcache.drafters.options import Option, check_n_draft, check_options

__all__ = ["Drafter", "DraftStats", "Proposal", "Source", "SequenceDrafter", "CoreSequenceDrafter"]

_EMPTY = np.zeros(0, dtype=np.int32)


class Source(enum.IntEnum):
    """Where a proposal came from; the gate judges each source apart. The values are the
    compiled core's (``CopyDrafter``'s ``source``)."""

    LOOKUP = 0  #: n-gram counts (llama.cpp's lookup caches)
    COPY = 1    #: the continuation of an earlier copy of the newest tokens
    SUFFIX = 2  #: the most frequent continuation of a suffix match


@dataclass(frozen=True)
class Proposal:
    """One step's proposal: the ``tokens``, the ``confidence`` the gate keys on (the length
    of the match behind them, or of the proposal) and its ``source``."""

    tokens: np.ndarray
    confidence: int
    source: Source


_NO_PROPOSAL = Proposal(_EMPTY, 0, Source.LOOKUP)


@dataclass
class DraftStats:
    """Counters of one drafter since its last ``reset``."""

    drafted: int = 0          # tokens handed to the verifier
    accepted: int = 0         # of those, how many the verifier confirmed
    draft_seconds: float = 0.0  # time spent proposing and updating caches
    proposals: int = 0        # propose() calls that returned at least one token
    skipped: int = 0          # proposals a gate judged not worth verifying

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
    report when the drafter has it (a gated drafter learns its cost curve from it).
    """

    def reset(self, prompt_tokens) -> None: ...

    def propose(self, n_max: int) -> np.ndarray: ...

    def accept(self, tokens) -> None: ...

    @property
    def stats(self) -> DraftStats: ...


class _TokenBuffer:
    """A growing int32 sequence; appends are amortised O(new tokens). The sequence of a
    drafter written in Python (a compiled drafter holds its own). Tokens once written are
    never written again (appends go past them, growth copies), so a view never changes."""

    def __init__(self, capacity: int = 1024):
        self._data = np.empty(max(16, capacity), dtype=np.int32)
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
    """The bookkeeping every sequence-following drafter shares: the verified tokens and
    the counters.

    A subclass provides three hooks: ``_reset_index()`` (the sequence was refilled from
    scratch), ``_appended(n_new)`` (``n_new`` verified tokens were appended) and
    ``_candidates(n) -> Proposal``: up to ``n`` proposed tokens with their confidence and
    source. The sequence is ``tokens``; ``_restart`` and ``_extend`` keep it and call the
    first two hooks (in a Python buffer here; ``CoreSequenceDrafter`` hands it to the core
    instead). :meth:`proposal` is that step as the gate sees it (no counters touched);
    :meth:`propose` hands the whole proposal to the verifier and counts it.

    ``OPTIONS`` (``Option`` objects) are the constructor's own settings and ``ORDERED`` the
    pairs ``(a, b)`` of them that need ``a <= b``; ``_set_options`` checks them and sets
    them as attributes. The registry builds its flags and checks from the same lists.
    """

    OPTIONS: tuple[Option, ...] = ()
    ORDERED: tuple[tuple[str, str], ...] = ()

    def __init__(self, n_draft: int):
        self.n_draft = check_n_draft(n_draft)
        self._buf = self._new_buffer(0)
        self._stats = DraftStats()
        self._last = _EMPTY  # the proposal awaiting verification

    def _set_options(self, **values) -> None:
        for name, value in check_options(self.OPTIONS, values, self.ORDERED).items():
            setattr(self, name, value)

    @property
    def stats(self) -> DraftStats:
        """Counters since the last ``reset``."""
        return self._stats

    @property
    def tokens(self) -> np.ndarray:
        """The verified sequence so far, without a copy: a read-only view that stays valid
        and unchanged after later ``accept`` and ``reset`` calls (they write elsewhere)."""
        v = self._buf.view()
        v.flags.writeable = False
        return v

    @staticmethod
    def _new_buffer(capacity: int) -> _TokenBuffer | None:
        """The sequence's buffer, room for ``capacity`` tokens and more (None where the
        compiled core holds the sequence)."""
        return _TokenBuffer(capacity + 1024)

    def _restart(self, prompt: np.ndarray) -> None:
        """The sequence becomes ``prompt`` (in a new buffer: views of the old one keep it)."""
        self._buf = self._new_buffer(prompt.size)
        self._buf.extend(prompt)
        self._reset_index()

    def _extend(self, new: np.ndarray) -> None:
        """``new`` (not empty) joins the sequence."""
        self._buf.extend(new)
        self._appended(int(new.size))

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence from ``prompt_tokens``."""
        t0 = time.perf_counter()
        self._restart(as_tokens(prompt_tokens, "prompt_tokens"))
        self._stats = DraftStats(draft_seconds=time.perf_counter() - t0)
        self._last = _EMPTY

    def proposal(self, n_max: int | None = None) -> Proposal:
        """Up to ``min(n_max, n_draft)`` tokens to follow the sequence (``n_max`` None:
        ``n_draft``), with their confidence and source: one step as a gate judges it. Counts
        nothing; the tokens the verifier is then given are reported through ``accept``."""
        n_max = check_int("n_max", n_max, 0, none_ok=True)
        n = self.n_draft if n_max is None else min(n_max, self.n_draft)
        return self._candidates(n) if n > 0 else _NO_PROPOSAL

    def propose(self, n_max: int | None = None) -> np.ndarray:
        """Up to ``min(n_max, n_draft)`` tokens to follow the sequence (``n_max`` None:
        ``n_draft``), all handed to the verifier."""
        t0 = time.perf_counter()
        out = self.proposal(n_max).tokens
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
            self._stats.accepted += accepted_prefix(self._last, new)
            self._extend(new)
        self._last = _EMPTY
        self._stats.draft_seconds += time.perf_counter() - t0

    def _reset_index(self) -> None:
        """Hook: the sequence was refilled from scratch."""

    def _appended(self, n_new: int) -> None:
        """Hook: ``n_new`` tokens were appended to the sequence."""

    def _candidates(self, n: int) -> Proposal:
        """Hook: up to ``n`` proposed tokens, their confidence and source."""
        return _NO_PROPOSAL


class CoreSequenceDrafter(SequenceDrafter):
    """A ``SequenceDrafter`` whose sequence, index and matching live in the compiled core:
    ``_impl``, an object of the core's sequence protocol (``reset``, ``accept``, ``step``,
    ``tokens``). Each ``reset`` and ``accept`` is one call into it, and so is each step:
    ``step(n)`` returns the proposal, its confidence and its source (-1 where the drafter has
    one source only: the class's ``_SOURCE``). The sequence is held there alone; ``tokens``
    reads it in place. A subclass sets ``self._impl`` in its constructor.
    ``ngramcache.replays.replay_drafter`` replays such a drafter entirely in C++."""

    _SOURCE = Source.COPY
    _impl = None

    @property
    def tokens(self) -> np.ndarray:
        """The verified sequence so far, read in place from the core without a copy: a
        read-only array that keeps the memory it shows, so it stays valid and unchanged after
        later ``accept`` and ``reset`` calls (the core then writes elsewhere)."""
        return self._impl.tokens

    @staticmethod
    def _new_buffer(capacity: int) -> None:
        return None

    def _restart(self, prompt: np.ndarray) -> None:
        self._impl.reset(prompt)
        self._reset_index()

    def _extend(self, new: np.ndarray) -> None:
        self._impl.accept(new)
        self._appended(int(new.size))

    def _candidates(self, n: int) -> Proposal:
        tokens, confidence, source = self._impl.step(n)
        return Proposal(tokens, confidence, self._SOURCE if source < 0 else Source(source))

    def __repr__(self) -> str:
        settings = "".join(f" {o.name}={getattr(self, o.name)!r}" for o in self.OPTIONS)
        return f"<{type(self).__name__} n_draft={self.n_draft}{settings}, {self.tokens.size} tokens>"
