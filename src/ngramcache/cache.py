"""The mutable n-gram cache: llama.cpp's context and dynamic caches."""

from __future__ import annotations

import os

import numpy as np

from . import _core
from ._validate import as_tokens

CacheFormatError = _core.CacheFormatError


def _check_sizes(ngram_min: int, ngram_max: int) -> None:
    if not (1 <= ngram_min <= ngram_max <= 4):
        raise ValueError(f"need 1 <= ngram_min <= ngram_max <= 4, got ngram_min={ngram_min}, ngram_max={ngram_max}")


class NgramCache(_core.NgramCache):
    """n-gram -> {next token: count}, as llama.cpp's ``common_ngram_cache``.

    Keys are 1- to 4-grams. Each key's continuations keep their first-seen order,
    which decides ties when drafting (the token first seen latest wins).

    Thread safety: any number of threads may draft from, ``get`` from or ``save`` one
    cache at the same time; ``update``, ``merge``, ``clear`` take it exclusively (an
    internal lock serialises them, so mixing is safe but writers wait for readers).
    """

    def update(self, tokens, ngram_min: int = 1, ngram_max: int = 4, nnew: int | None = None) -> None:
        """Count the n-grams of sizes ngram_min..ngram_max that end in the last ``nnew``
        tokens (all tokens when ``nnew`` is None), each followed by its next token.

        This is llama.cpp's ``common_ngram_cache_update``: call it with ``nnew=1`` after
        appending each token to keep a context cache current.
        """
        _check_sizes(ngram_min, ngram_max)
        if nnew is not None:
            if not isinstance(nnew, (int, np.integer)) or isinstance(nnew, bool):
                raise ValueError(f"nnew must be an integer or None, got {type(nnew).__name__}")
            if nnew < 0:
                raise ValueError(f"nnew must be >= 0, got {nnew}")
            # Only the last nnew + ngram_max tokens take part: validate and pass just those,
            # so an incremental update costs O(nnew), not O(len(tokens)).
            n = len(tokens) if hasattr(tokens, "__len__") and not isinstance(tokens, (str, bytes)) else 0
            start = max(0, n - int(nnew) - ngram_max)
            if start:
                try:
                    tokens = tokens[start:]
                except TypeError:  # a sequence without slicing (deque): validate it whole
                    pass
        arr = as_tokens(tokens)
        self._update(arr, ngram_min, ngram_max, arr.size if nnew is None else int(nnew))

    def get(self, ngram) -> dict[int, int]:
        """The continuations of ``ngram`` (1-4 token ids) as {token: count}, in first-seen
        order; an empty dict if the n-gram was never seen."""
        arr = as_tokens(ngram, "ngram")
        if not 1 <= arr.size <= 4:
            raise ValueError(f"ngram: an n-gram is 1 to 4 token ids, got {arr.size}")
        return self._get(arr)

    def merge(self, other: "NgramCache") -> None:
        """Add every count of ``other`` to this cache (llama.cpp's ``common_ngram_cache_merge``)."""
        if not isinstance(other, _core.NgramCache):
            raise TypeError(f"can only merge an NgramCache, got {type(other).__name__}")
        self._merge(other)

    def save(self, path: str | os.PathLike) -> None:
        """Write the cache in llama.cpp's ``lookup.bin`` format (atomically: temp file,
        fsync, rename, so an interrupted save never destroys the previous file)."""
        self._save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NgramCache":
        """Read a llama.cpp ``lookup.bin``; raises CacheFormatError (with the byte offset)
        for a damaged file and FileNotFoundError for a missing one."""
        cache = cls()
        cache._load_into(os.fspath(path))
        return cache

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> "NgramCache":
        """Parse a ``lookup.bin`` image held in memory."""
        cache = cls()
        cache._load_bytes(bytes(data), name)
        return cache

    def to_bytes(self) -> bytes:
        """The ``lookup.bin`` image of this cache."""
        return self._to_bytes()

    def clear(self) -> None:
        """Remove every n-gram."""
        self._clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys[N, 4], offsets[N + 1], tokens[M], counts[M]): every record in insertion
        order, continuations in first-seen order (key i owns entries offsets[i]:offsets[i+1])."""
        return self._arrays()

    def items(self):
        """Iterate over (ngram tuple, {token: count}) pairs in insertion order."""
        keys, offsets, toks, cnts = self.arrays()
        for i in range(keys.shape[0]):
            k = tuple(int(t) for t in keys[i] if t >= 0)
            a, b = offsets[i], offsets[i + 1]
            yield k, dict(zip(toks[a:b].tolist(), cnts[a:b].tolist()))

    def __repr__(self) -> str:
        return f"<NgramCache with {len(self)} n-grams>"
