"""Suffix drafting (SuffixDecoding, Oliaro et al. 2024): the most frequent continuation of
the longest suffix match, in the current request and in a store of earlier requests.

``SuffixDrafter`` keeps a depth-bounded suffix trie of its request (every substring of
up to ``max_depth + 1`` tokens, with its count); a ``SuffixStore`` keeps one over earlier
requests, shared by any number of drafters and threads. docs/drafters.md gives the
proposal rule, costs and the store's guarantees.
"""

from __future__ import annotations

import os

import numpy as np

from ngramcache import _core
from ngramcache._state_file import StateFormat
from ngramcache._validate import as_tokens, check_int
from ngramcache.drafters.base import CoreSequenceDrafter, Source
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.options import Option

__all__ = ["SuffixDrafter", "SuffixStore", "SUFFIX_MAX_DEPTH"]

# A saved store (docs/format.md): the header, each request's length (uint64), every
# request's tokens (int32), then the CRC-32 of everything before it; little-endian.
# Header fields after magic and version: max_tokens, max_depth, reserved, n_requests.
_FORMAT = StateFormat(b"NGSS", 1, "<QIIQ", "a suffix store")

#: the largest ``max_depth`` (memory grows with it where text repeats: up to max_depth + 1
#: nodes a token)
SUFFIX_MAX_DEPTH = 1024


MAX_DEPTH = Option("max_depth", int, 64, "longest match counted", lo=1, hi=SUFFIX_MAX_DEPTH)
ALPHA = Option("alpha", float, 4.0, "longest draft, in multiples of the match length", lo=0.0, lo_open=True)
MIN_PROB = Option("min_prob", float, 0.1, "stop the draft where its estimated probability falls below this",
                  lo=0.0, hi=1.0)


def _check_depth(max_depth) -> int:
    return MAX_DEPTH.check(max_depth)


class SuffixStore:
    """Earlier requests' tokens (prompts and outputs), for ``SuffixDrafter``.

    Holds at most ``max_tokens`` tokens: adding a request evicts whole requests, oldest
    first, until it fits; a request longer than ``max_tokens`` is not kept. Matches in
    the store are at most ``max_depth`` tokens long. Safe to share between threads:
    drafters propose from it under a shared lock while ``add`` or ``clear`` hold it
    exclusively (readers wait for an add to finish, never see half of one).
    ``len(store)`` is the number of requests held.
    """

    def __init__(self, max_tokens: int = 1_000_000, max_depth: int = 64):
        max_tokens = check_int("max_tokens", max_tokens, 1)
        self._impl = _core.SuffixStore(max_tokens, _check_depth(max_depth))

    @property
    def max_tokens(self) -> int:
        return self._impl.max_tokens

    @property
    def max_depth(self) -> int:
        return self._impl.max_depth

    @property
    def n_tokens(self) -> int:
        """Tokens held, over every request."""
        return self._impl.n_tokens

    @property
    def n_requests(self) -> int:
        return self._impl.n_requests

    @property
    def nbytes(self) -> int:
        """Bytes the store has allocated: its trie and the tokens held (about 170
        bytes a token of text that does not repeat; up to about 4.5 KB a token, at
        max_depth 64, where requests repeat earlier ones at length)."""
        return self._impl.nbytes

    def __len__(self) -> int:
        return self._impl.n_requests

    def add(self, tokens) -> None:
        """Keep a finished request (its prompt and output), evicting the oldest requests
        as the memory bound needs."""
        self._impl.add(as_tokens(tokens))

    def clear(self) -> None:
        """Forget every request."""
        self._impl.clear()

    def requests(self) -> list[np.ndarray]:
        """The requests held, oldest first (copies)."""
        return self._impl.requests()

    def save(self, path: str | os.PathLike) -> None:
        """Write the store's requests and bounds to ``path`` (atomic: a temporary file
        renamed over ``path``, so an interrupted save leaves the previous file whole).
        ``SuffixStore.load`` rebuilds the same store from it."""
        reqs = self.requests()
        lengths = np.array([r.size for r in reqs], dtype="<u8")
        _FORMAT.write(path, (self.max_tokens, self.max_depth, 0, len(reqs)),
                      [lengths] + [r.astype("<i4", copy=False) for r in reqs])

    @classmethod
    def load(cls, path: str | os.PathLike, max_tokens: int | None = None,
             max_depth: int | None = None) -> "SuffixStore":
        """The store saved at ``path``, with its saved bounds unless ``max_tokens`` or
        ``max_depth`` are given (a smaller ``max_tokens`` keeps the newest requests that
        fit). A damaged, truncated or foreign file raises ``CacheFormatError`` naming
        the problem; a missing one ``FileNotFoundError``."""
        name = os.fspath(path)
        (saved_tokens, saved_depth, _, n), payload = _FORMAT.read(name, None)
        if n > len(payload) // 8:
            raise _FORMAT.damaged(name, f"{n} requests cannot fit in {len(payload)} bytes")
        lengths = np.frombuffer(payload, dtype="<u8", count=n).astype(np.int64)
        total = int(lengths.sum()) if n else 0
        if (lengths < 0).any() or 8 * n + 4 * total != len(payload):
            raise _FORMAT.damaged(name, "request lengths do not match the file size")
        try:
            store = cls(saved_tokens if max_tokens is None else max_tokens,
                        saved_depth if max_depth is None else max_depth)
        except ValueError as e:
            if max_tokens is None and max_depth is None:
                raise _FORMAT.damaged(name, f"bad bounds in the header: {e}") from None
            raise
        tokens = np.frombuffer(payload, dtype="<i4", count=total, offset=8 * n).astype(np.int32)
        if total and int(tokens.min()) < 0:
            raise _FORMAT.damaged(name, "negative token id in a request")
        start = 0
        for k in lengths.tolist():
            store._impl.add(tokens[start : start + k])
            start += k
        return store

    def __repr__(self) -> str:
        return (f"<SuffixStore {self.n_requests} requests, {self.n_tokens} of {self.max_tokens} tokens, "
                f"max_depth={self.max_depth}>")


class SuffixDrafter(CoreSequenceDrafter):
    """SuffixDecoding's drafter: from the longest suffix of the sequence (up to
    ``max_depth`` tokens) that occurred before, follow the most frequent continuation
    token by token (equal counts: the one seen latest), each with its empirical
    probability count(context + token) / count(context followed by anything). The draft
    stops before the running product of those probabilities falls below ``min_prob``,
    and is at most ``alpha`` times the match length long (and ``n_draft``).

    With a ``store``, the request is matched in the store too and the proposal with the
    longer match wins (then the one with more expected accepted tokens, then the
    request's own); the request is added to the store when the drafter is reset for the
    next one, or by ``finish()``. A proposal's confidence is its match length.
    """

    _SOURCE = Source.SUFFIX
    OPTIONS = (MAX_DEPTH, ALPHA, MIN_PROB)

    def __init__(self, n_draft: int = N_DRAFT, max_depth: int = MAX_DEPTH.default, alpha: float = ALPHA.default,
                 min_prob: float = MIN_PROB.default, store: SuffixStore | None = None):
        super().__init__(n_draft)
        self._set_options(max_depth=max_depth, alpha=alpha, min_prob=min_prob)
        if store is not None and not isinstance(store, SuffixStore):
            raise TypeError(f"store must be a SuffixStore or None, got {type(store).__name__}")
        self.store = store
        self._impl = _core.SuffixDrafter(self.max_depth, self.alpha, self.min_prob,
                                         None if store is None else store._impl)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the current request (its trie and tokens), not counting
        the store's."""
        return self._impl.nbytes

    def finish(self) -> None:
        """Hand the request so far to the store (if any) and start an empty sequence;
        a following ``reset`` adds nothing more."""
        self._impl.finish()
        self.reset([])

    def __repr__(self) -> str:
        extra = ", store" if self.store is not None else ""
        return (f"<SuffixDrafter n_draft={self.n_draft} max_depth={self.max_depth} alpha={self.alpha} "
                f"min_prob={self.min_prob}{extra}, {self.tokens.size} tokens>")

