"""Drafters: what proposes tokens for a model to verify.

A drafter sees the verified sequence grow (``reset`` with the prompt, then ``accept``
with every batch of verified tokens) and proposes continuations (``propose``). It
never sees rejected tokens, so it never has to forget anything.

``LookupDrafter`` is llama.cpp's lookup decoding (context, dynamic and static n-gram
caches); ``CopyDrafter`` also copies earlier spans of the sequence;
``PromptLookupDrafter`` is plain prompt lookup as Hugging Face, llama-cpp-python and vLLM
do it; ``OracleDrafter`` proposes a known continuation (a ceiling for benchmarks). With an
``ngramcache.decoding.gate.AdaptiveGate`` a drafter proposes only as much as is expected to pay
for its verification.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ngramcache import _core
from ngramcache._validate import as_tokens, check_int, check_ngram_sizes
from ngramcache.cache import NgramCache
from ngramcache.draft import draft_checked
from ngramcache.decoding.gate import AdaptiveGate
from ngramcache.static_table import StaticTable

__all__ = ["Drafter", "DraftStats", "SequenceDrafter", "CoreSequenceDrafter", "LookupDrafter", "CopyDrafter",
           "PromptLookupDrafter", "OracleDrafter"]

_EMPTY = np.zeros(0, dtype=np.int32)

#: the longest n-gram PromptLookupDrafter matches (the core's PromptLookupDrafter::kMaxNgram)
PROMPT_LOOKUP_MAX_NGRAM = 64


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
    """

    def __init__(self, n_draft: int, gate: AdaptiveGate | None = None):
        self.n_draft = check_int("n_draft", n_draft, 0)
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
        if n > 0 and self._buf.n > 0:
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
            last = self._last
            m = min(last.size, new.size)
            if m:  # lists: numpy's per-call cost would dominate a comparison of a few tokens
                a, b = last[:m].tolist(), new[:m].tolist()
                k = 0
                while k < m and a[k] == b[k]:
                    k += 1
                self._stats.accepted += k
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
            eq = cand[done:have] == seq[start + done : start + have]
            right = int(eq.size if eq.all() else np.argmin(eq))
            self.gate.observe(state, right, right + 1 if right < eq.size else right, start=done)
            if right == eq.size and have < cand.size:
                keep.append((start, cand, state, have))
        self._pending = keep


class CoreSequenceDrafter(SequenceDrafter):
    """A ``SequenceDrafter`` whose index and matching live in the compiled core: a
    ``_core`` object of the sequence protocol (``reset``, ``accept``, ``propose``,
    ``confidence``) that sees the same verified tokens. A subclass sets ``self._core``
    in its constructor and the gate source ``_SOURCE`` (see ``AdaptiveGate.state``).
    ``ngramcache.replays.replay_drafter`` replays such a drafter entirely in C++."""

    _SOURCE = 1
    _core = None

    def _reset_index(self) -> None:
        self._core.reset(self._buf.view())

    def _appended(self, n_new: int) -> None:
        self._core.accept(self._buf.view()[self._buf.n - n_new :])

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        cand = self._core.propose(n)
        return cand, int(self._core.confidence), self._SOURCE

    def __repr__(self) -> str:
        gated = ", gated" if self.gate is not None else ""
        return f"<{type(self).__name__} n_draft={self.n_draft}{gated}, {self._buf.n} tokens>"


# ---------------------------------------------------------------------------------
# llama.cpp's lookup drafter


class LookupDrafter(SequenceDrafter):
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
        super().__init__(n_draft, gate)
        ngram_min, ngram_max = check_ngram_sizes(ngram_min, ngram_max)
        if dynamic is not None and not isinstance(dynamic, NgramCache):
            raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
        if static is not None and not isinstance(static, (NgramCache, StaticTable)):
            raise TypeError(f"static must be an NgramCache, a StaticTable or None, got {type(static).__name__}")
        self.static = static
        self.dynamic = dynamic
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.context = NgramCache()

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence: the context cache is rebuilt from ``prompt_tokens``."""
        super().reset(prompt_tokens)

    def _reset_index(self) -> None:
        self.context.clear()
        if self._buf.n:
            self.context.update_checked(self._buf.view(), self.ngram_min, self.ngram_max, self._buf.n)

    def _appended(self, n_new: int) -> None:
        # only the n-grams ending in the new tokens: O(new tokens)
        self.context.update_checked(self._buf.view(), self.ngram_min, self.ngram_max, n_new)

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        """(proposal, confidence length, source) for the gate."""
        # draft() reads only the newest tokens, whatever the length of the sequence
        cand = draft_checked(self._buf.view(), n, self.context, self.dynamic, self.static,
                             self.ngram_min, self.ngram_max)
        return cand, int(cand.size), 0

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


class CopyDrafter(CoreSequenceDrafter):
    """Copies spans: when the newest tokens repeat an earlier stretch of the sequence,
    proposes what followed that stretch; otherwise drafts as ``LookupDrafter``.

    Of the earlier places where the last ``min_match`` tokens occurred (the newest
    ``max_candidates``), it continues the one whose match extends furthest back (up to
    ``max_match`` tokens; the newest wins ties). llama.cpp's lookup chooses each drafted
    token by n-gram counts, which in text being copied (code under edit, a quoted
    passage) often picks a continuation seen more often elsewhere; a copy follows one
    place. Work per step is bounded by ``max_candidates * max_match`` comparisons plus
    one index entry per new token, never the length of the sequence.

    The lookup fallback reads the context cache (``context``, an ``NgramCache`` kept
    current with the sequence), then ``dynamic``, then ``static``, exactly as
    ``LookupDrafter``. Index, matching and fallback run in the compiled core, so
    ``ngramcache.replays.replay_drafter`` replays this drafter entirely in C++.

    With a gate, copies and lookups are judged separately, copies by match length.
    """

    def __init__(self, static=None, dynamic: NgramCache | None = None, n_draft: int = 16,
                 ngram_min: int = 1, ngram_max: int = 4, gate: AdaptiveGate | None = None,
                 min_match: int = 2, max_match: int = 32, max_candidates: int = 8):
        super().__init__(n_draft, gate)
        ngram_min, ngram_max = check_ngram_sizes(ngram_min, ngram_max)
        _check_caches(static, dynamic)
        min_match = check_int("min_match", min_match, 1)
        max_match = check_int("max_match", max_match, 1)
        if min_match > max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.max_candidates = check_int("max_candidates", max_candidates, 1)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.static = static
        self._dynamic = dynamic
        #: the context cache: the n-grams of the current sequence, which the core keeps current
        self.context = NgramCache()
        self._core = _core.CopyDrafter(self.context._impl, None if dynamic is None else dynamic._impl,
                                       None if static is None else static._impl, ngram_min, ngram_max,
                                       min_match, max_match, self.max_candidates)

    @property
    def dynamic(self) -> NgramCache | None:
        """The dynamic cache the lookup fallback reads after the context cache (or None)."""
        return self._dynamic

    @dynamic.setter
    def dynamic(self, cache: NgramCache | None) -> None:
        _check_caches(None, cache)
        self._dynamic = cache
        self._core.set_dynamic(None if cache is None else cache._impl)

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence: the copy index and the context cache are rebuilt from
        ``prompt_tokens``."""
        super().reset(prompt_tokens)

    def _candidates(self, n: int) -> tuple[np.ndarray, int, int]:
        cand = self._core.propose(n)
        return cand, int(self._core.confidence), int(self._core.source)

    @property
    def _index(self) -> dict[tuple, list[int]]:
        # every indexed position (the last token of a min_match-gram with a successor) by
        # its gram, oldest first: for tests and inspection
        return self._core.index()

    def save_dynamic(self, path: str | os.PathLike) -> NgramCache:
        """Merge the context cache into the dynamic cache (creating it if there was
        none) and write it to ``path`` in llama.cpp's format, like ``llama-lookup -lcd``.
        Returns the dynamic cache."""
        if self._dynamic is None:
            self.dynamic = NgramCache()
        self._dynamic.merge(self.context)
        self._dynamic.save(path)
        return self._dynamic

    def __repr__(self) -> str:
        parts = [f"n_draft={self.n_draft}", f"min_match={self.min_match}"]
        if self._dynamic is not None:
            parts.append("dynamic")
        if self.static is not None:
            parts.append("static")
        if self.gate is not None:
            parts.append("gated")
        return f"<CopyDrafter {' '.join(parts)}, {self._buf.n} tokens>"


class PromptLookupDrafter(CoreSequenceDrafter):
    """Plain prompt lookup decoding, as Hugging Face (``prompt_lookup_num_tokens``),
    llama-cpp-python (``LlamaPromptLookupDecoding``) and vLLM (``method="ngram"``) do it.

    For an n-gram size from ``max_ngram`` down to ``min_ngram``, it looks for an earlier
    occurrence of the last ``size`` tokens and proposes the (up to ``n_draft``) tokens
    that followed it; the longest size with an occurrence wins. ``match="first"`` takes
    the earliest occurrence in the sequence, as those three do, so its proposals are
    theirs token for token; ``match="recent"`` the newest. An occurrence may overlap the
    newest tokens themselves, and a continuation stops at the end of the sequence (it can
    be shorter than ``n_draft``).

    The peers rescan the whole sequence at every step; here an index per n-gram size is
    kept current as tokens arrive, so a step costs O(max_ngram^2 + n_draft) whatever the
    length of the sequence. The gate keys on the size of the matched n-gram.
    """

    _SOURCE = 1

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, n_draft: int = 10, match: str = "first",
                 gate: AdaptiveGate | None = None):
        super().__init__(n_draft, gate)
        min_ngram = check_int("min_ngram", min_ngram, 1)
        max_ngram = check_int("max_ngram", max_ngram, 1, PROMPT_LOOKUP_MAX_NGRAM)
        if min_ngram > max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if not isinstance(match, str):
            raise TypeError(f"match must be 'first' or 'recent', got {type(match).__name__}")
        if match not in ("first", "recent"):
            raise ValueError(f"match must be 'first' or 'recent', got {match!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.match = match
        self._core = _core.PromptLookupDrafter(max_ngram, min_ngram, match == "recent")

    def __repr__(self) -> str:
        gated = ", gated" if self.gate is not None else ""
        return (f"<PromptLookupDrafter max_ngram={self.max_ngram} min_ngram={self.min_ngram} "
                f"match={self.match!r} n_draft={self.n_draft}{gated}, {self._buf.n} tokens>")


def _check_caches(static, dynamic) -> None:
    if dynamic is not None and not isinstance(dynamic, NgramCache):
        raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
    if static is not None and not isinstance(static, (NgramCache, StaticTable)):
        raise TypeError(f"static must be an NgramCache, a StaticTable or None, got {type(static).__name__}")


class OracleDrafter:
    """Proposes the true continuation (taken from a reference run): the ceiling any
    drafter can reach with the same verification costs. For benchmarks. Once the
    verified text departs from the continuation it proposes nothing."""

    def __init__(self, continuation, n_draft: int = 8):
        self.n_draft = check_int("n_draft", n_draft, 0)
        self.continuation = as_tokens(continuation, "continuation")
        self._n_prompt = 0
        self._n = 0
        self._stats = DraftStats()
        self._last = _EMPTY

    @property
    def stats(self) -> DraftStats:
        """Counters since the last ``reset``."""
        return self._stats

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence; the continuation follows ``prompt_tokens``."""
        self._n_prompt = int(as_tokens(prompt_tokens, "prompt_tokens").size)
        self._n = 0
        self._stats = DraftStats()
        self._last = _EMPTY

    def propose(self, n_max: int | None = None) -> np.ndarray:
        """The next ``min(n_max, n_draft)`` tokens of the continuation, or none once
        the text has departed from it."""
        n_max = check_int("n_max", n_max, 0, none_ok=True)
        n = self.n_draft if n_max is None else min(n_max, self.n_draft)
        out = self.continuation[self._n : self._n + n]
        self._last = out
        if out.size:
            self._stats.proposals += 1
            self._stats.drafted += int(out.size)
        return out

    def accept(self, tokens) -> None:
        """Follow the verified tokens along the continuation."""
        new = as_tokens(tokens)
        m = min(self._last.size, new.size)
        if m:
            eq = self._last[:m] == new[:m]
            self._stats.accepted += int(m if eq.all() else np.argmin(eq))
        if not np.array_equal(new, self.continuation[self._n : self._n + new.size]):
            self._n = self.continuation.size  # departed: nothing more to propose
        self._n += int(new.size)
        self._last = _EMPTY
