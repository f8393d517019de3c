"""The mutable n-gram cache: llama.cpp's context and dynamic caches."""

from __future__ import annotations

import os

import numpy as np

from ngramcache import _core
from ngramcache._validate import as_tokens, check_int, check_ngram_sizes, tail_tokens

CacheFormatError = _core.CacheFormatError

MIN_BUDGET = 1 << 20  # the smallest memory cap: a cache's fixed structures need some room


class NgramCache:
    """n-gram -> {next token: count}, as llama.cpp's ``common_ngram_cache``.

    Keys are 1- to 4-grams. Each key's continuations keep their first-seen order, from
    which ties when drafting are decided as llama.cpp's ``std::unordered_map`` decides
    them (libstdc++'s iteration order, docs/parity.md). ``save`` writes records and pairs
    in that order, so files are byte for byte llama.cpp's; ``load`` keeps file order.

    Thread safety: any number of threads may draft from, ``get`` from or ``save`` one
    cache at the same time; ``update``, ``merge``, ``clear`` take it exclusively (an
    internal lock serialises them, so mixing is safe but writers wait for readers).

    Changes are all or nothing: an ``update`` or ``merge`` that would take a count past
    the int32 range of ``lookup.bin`` raises OverflowError and leaves the cache as it was.

    Memory: unbounded by default, like llama.cpp's. ``max_bytes`` (at least 1 MiB) caps a
    cache that lives long, e.g. a server's dynamic cache: whenever its estimated
    footprint (``estimated_bytes``, an upper bound of what it allocates) would exceed the
    cap, the n-grams least recently counted are forgotten until it is at most 3/4 of the
    cap. What is kept is unchanged (counts, first-seen order); drafts come from it, so
    they can differ from llama.cpp's once something was forgotten (``evicted`` counts).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self._impl = _core.NgramCache()
        if max_bytes is not None:
            self.max_bytes = max_bytes

    @property
    def max_bytes(self) -> int | None:
        """The memory cap in bytes, or None for none (the default)."""
        return self._impl.max_bytes or None

    @max_bytes.setter
    def max_bytes(self, value: int | None) -> None:
        value = check_int("max_bytes", value, MIN_BUDGET, 2**63 - 1, none_ok=True)
        self._impl.max_bytes = value or 0

    @property
    def evicted(self) -> int:
        """How many n-grams the memory cap made this cache forget so far."""
        return self._impl.evicted

    @property
    def estimated_bytes(self) -> int:
        """Under a cap, the upper bound of the bytes held that the cap is checked against;
        without one, ``nbytes``."""
        return self._impl.estimated_bytes

    def update(self, tokens, ngram_min: int = 1, ngram_max: int = 4, nnew: int | None = None) -> None:
        """Count the n-grams of sizes ngram_min..ngram_max that end in the last ``nnew``
        tokens (all tokens when ``nnew`` is None), each followed by its next token.

        This is llama.cpp's ``common_ngram_cache_update``: call it with ``nnew=1`` after
        appending each token to keep a context cache current.
        """
        ngram_min, ngram_max = check_ngram_sizes(ngram_min, ngram_max)
        nnew = check_int("nnew", nnew, 0, none_ok=True)
        if nnew is None:
            arr = as_tokens(tokens)
            self._impl.update(arr, ngram_min, ngram_max, arr.size)
        else:
            # Only the last nnew + ngram_max tokens take part: validating and passing just
            # those makes an incremental update O(nnew), not O(len(tokens)).
            arr = tail_tokens(tokens, nnew + ngram_max)
            self.update_checked(arr, ngram_min, ngram_max, min(nnew, arr.size))

    def update_checked(self, tokens: np.ndarray, ngram_min: int, ngram_max: int, nnew: int) -> None:
        """``update(tokens, ngram_min, ngram_max, nnew)`` for callers that validated
        everything already (``tokens`` a 1-D int32 array of ids >= 0, the sizes and
        ``nnew`` as ``update`` checks them): drafters, whose tokens are checked once when
        they arrive, keep their context cache current with it at every step."""
        self._impl.update(tokens[-(nnew + ngram_max):], ngram_min, ngram_max, nnew)

    def get(self, ngram) -> dict[int, int]:
        """The continuations of ``ngram`` (1-4 token ids) as {token: count}, in first-seen
        order; an empty dict if the n-gram was never seen."""
        arr = as_tokens(ngram, "ngram")
        if not 1 <= arr.size <= 4:
            raise ValueError(f"ngram: an n-gram is 1 to 4 token ids, got {arr.size}")
        return self._impl.get(arr)

    def merge(self, other: "NgramCache") -> None:
        """Add every count of ``other`` to this cache (llama.cpp's ``common_ngram_cache_merge``)."""
        if not isinstance(other, NgramCache):
            raise TypeError(f"can only merge an NgramCache, got {type(other).__name__}")
        self._impl.merge(other._impl)

    def save(self, path: str | os.PathLike) -> None:
        """Write the cache in llama.cpp's ``lookup.bin`` format (atomically: temp file,
        fsync, rename, so an interrupted save never destroys the previous file)."""
        self._impl.save(os.fsencode(path))  # bytes: any name the OS allows, UTF-8 or not

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NgramCache":
        """Read a llama.cpp ``lookup.bin``; raises CacheFormatError (with the byte offset)
        for a damaged file and FileNotFoundError for a missing one."""
        return _wrap(cls, _core.NgramCache.load(os.fspath(path)))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> "NgramCache":
        """Parse a ``lookup.bin`` image held in memory."""
        return _wrap(cls, _core.NgramCache.from_bytes(bytes(data), name))

    def to_bytes(self) -> bytes:
        """The ``lookup.bin`` image of this cache."""
        return self._impl.to_bytes()

    def clear(self) -> None:
        """Remove every n-gram."""
        self._impl.clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys[N, 4], offsets[N + 1], tokens[M], counts[M]): every record in insertion
        order, continuations in first-seen order (key i owns entries offsets[i]:offsets[i+1])."""
        return self._impl.arrays()

    def items(self):
        """Iterate over (ngram tuple, {token: count}) pairs in insertion order."""
        keys, offsets, toks, cnts = self.arrays()
        for i in range(keys.shape[0]):
            k = tuple(int(t) for t in keys[i] if t >= 0)
            a, b = offsets[i], offsets[i + 1]
            yield k, dict(zip(toks[a:b].tolist(), cnts[a:b].tolist()))

    @property
    def nbytes(self) -> int:
        """Memory held by the cache, in bytes (approximate)."""
        return self._impl.nbytes

    def __len__(self) -> int:
        return len(self._impl)

    def __repr__(self) -> str:
        cap = f", max_bytes={self.max_bytes}" if self.max_bytes else ""
        return f"<NgramCache with {len(self)} n-grams{cap}>"


def _wrap(cls, impl: _core.NgramCache) -> NgramCache:
    """An instance of ``cls`` (NgramCache or a subclass) holding a cache the core made."""
    cache = cls.__new__(cls)
    cache._impl = impl
    return cache
