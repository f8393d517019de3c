"""The static table: an immutable n-gram table in an NGST file, opened in O(1) with mmap.

llama.cpp's static cache (``lookup.bin``) must be parsed into hash maps before use: seconds
and several times the file's size in memory for a large corpus. A ``StaticTable`` is built
once (by sorting, not by hashing) and then mapped read-only: opening checks the 64-byte
header and the bounds of every section in constant time, and the operating system pages
in only what lookups touch. ``docs/format.md`` describes the file byte by byte.
"""

from __future__ import annotations

import os

import numpy as np

from . import _core
from ._validate import as_tokens
from .cache import NgramCache

CacheFormatError = _core.CacheFormatError

HEADER_SIZE = 64


def _ngram_size_arg(ngram_size) -> int:
    if isinstance(ngram_size, bool) or not isinstance(ngram_size, (int, np.integer)):
        raise ValueError(f"ngram_size must be an integer 1 to 4, got {ngram_size!r}")
    if not 1 <= ngram_size <= 4:
        raise ValueError(f"ngram_size must be 1 to 4, got {ngram_size}")
    return int(ngram_size)


class StaticTable(_core.StaticTable):
    """n-gram -> {next token: count}, immutable, for llama.cpp's static cache role.

    Make one with :meth:`build` (from tokens), :meth:`from_llama` (import a llama.cpp
    ``lookup.bin``), :meth:`from_cache` or :meth:`open` (map an NGST file). Pass it as
    ``static=`` to :func:`ngramcache.draft`: the drafts are exactly those of an
    ``NgramCache`` holding the same counts.

    Every key stores its best continuation (highest count; among equal counts the one
    first seen latest, the rule drafting uses) with its count and the key's total, so a
    static-only draft step is one lookup.

    Nothing can change a table once made, so any number of threads may use one at once.
    A mapped table reads the file lazily: do not truncate or rewrite the file in place
    while it is open (``save`` and ``to_llama`` replace files atomically, which is safe).
    """

    __slots__ = ()

    def __init__(self, _pending) -> None:
        """Not for direct use: call ``StaticTable.build``, ``open``, ``from_llama``,
        ``from_cache`` or ``from_bytes``."""
        if not isinstance(_pending, _core._StaticPending):
            raise TypeError("make a StaticTable with StaticTable.build, .open, .from_llama, .from_cache or .from_bytes")
        super().__init__(_pending)

    # ---- making tables ---------------------------------------------------------------

    @classmethod
    def build(cls, tokens, ngram_size: int = 2) -> "StaticTable":
        """Count every n-gram of ``tokens`` followed by its next token, as
        ``NgramCache().update(tokens, ngram_size, ngram_size)`` (what llama-lookup-create
        does with 2-grams), and return the table, in memory; ``save`` writes it."""
        n = _ngram_size_arg(ngram_size)
        return cls(_core._static_build(as_tokens(tokens), n))

    @classmethod
    def open(cls, path: str | os.PathLike) -> "StaticTable":
        """Map an NGST file read-only. Checks the header and every section's bounds, in
        time independent of the file's size; ``verify()`` checks the contents.

        Raises CacheFormatError naming the problem for an empty, truncated or damaged
        file, FileNotFoundError if it does not exist."""
        return cls(_core._static_open(os.fspath(path)))

    @classmethod
    def from_llama(cls, path: str | os.PathLike, ngram_size: int | None = None) -> "StaticTable":
        """Import a llama.cpp ``lookup.bin`` (e.g. from ``llama-lookup-create``).

        The counts are exactly those ``NgramCache.load`` reads; on a tie the later token
        of a record is the best one (what llama.cpp picks). A static cache holds 2-grams
        only; for a file with several n-gram sizes (a context or dynamic cache) pass
        ``ngram_size`` to keep the keys of one size."""
        n = 0 if ngram_size is None else _ngram_size_arg(ngram_size)
        return cls(_core._static_from_llama(os.fspath(path), n))

    @classmethod
    def from_cache(cls, cache: NgramCache, ngram_size: int = 2) -> "StaticTable":
        """The keys of size ``ngram_size`` of an ``NgramCache``, with its counts; a key's
        best token follows the cache's first-seen order, as drafting from the cache would."""
        if not isinstance(cache, _core.NgramCache):
            raise TypeError(f"cache must be an NgramCache, got {type(cache).__name__}")
        return cls(_core._static_from_cache(cache, _ngram_size_arg(ngram_size)))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> "StaticTable":
        """A table from an NGST image held in memory (copied), checked like ``open``."""
        return cls(_core._static_from_bytes(bytes(data), name))

    @staticmethod
    def read_header(path: str | os.PathLike) -> dict:
        """The header of an NGST file as a dict (see ``info``), reading only its first
        64 bytes; checks them and that the file has the size they describe."""
        p = os.fspath(path)
        with open(p, "rb") as f:
            head = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
        return _core._static_header(head, size, p)

    # ---- writing ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the NGST file atomically (temporary file, fsync, rename): an interrupted
        save never leaves a damaged file behind, and a mapped table may be saved over the
        file it maps."""
        self._save(os.fspath(path))

    def to_bytes(self) -> bytes:
        """The NGST image (what ``save`` writes)."""
        return self._to_bytes()

    def to_llama(self, path: str | os.PathLike) -> None:
        """Write llama.cpp's ``lookup.bin`` format (atomically), usable as ``-lcs``. Each
        record lists its best token last, so llama.cpp breaks ties the way this table
        does. Runs ``verify()`` first, so damage is never exported."""
        self._to_llama(os.fspath(path))

    def to_llama_bytes(self) -> bytes:
        """The ``lookup.bin`` image of ``to_llama``."""
        return self._to_llama_bytes()

    def to_cache(self) -> NgramCache:
        """A new mutable ``NgramCache`` with the same counts (e.g. to merge tables); its
        first-seen order keeps every key's best token."""
        cache = NgramCache()
        self._into_cache(cache)
        return cache

    # ---- reading ---------------------------------------------------------------------

    def verify(self) -> None:
        """Check every byte: the checksums of all sections, then that the index, keys,
        entries, best tokens, sums and totals are consistent. O(size); raises
        CacheFormatError with the first problem found."""
        self._verify()

    def get(self, ngram) -> dict[int, int]:
        """The continuations of ``ngram`` (``ngram_size`` token ids) as {token: count},
        tokens ascending; an empty dict if the n-gram is not in the table."""
        return self._get(self._ngram(ngram))

    def best(self, ngram) -> tuple[int, int, int] | None:
        """(best token, its count, sum of the key's counts) as stored for ``ngram``, or
        None if absent. Drafting uses the token when count >= 50 % of sum and sum >= 2."""
        return self._best(self._ngram(ngram))

    def __contains__(self, ngram) -> bool:
        return super().__contains__(self._ngram(ngram))

    @property
    def path(self) -> str | None:
        """The file a mapped table reads, else None."""
        return self._name if self.mapped else None

    def info(self) -> dict:
        """The header as a dict: format version, n-gram size, counts, section offsets and
        sizes, checksums, plus ``path`` and ``mapped``."""
        d = self._header()
        d["path"] = self.path
        d["mapped"] = self.mapped
        return d

    def arrays(self) -> dict[str, np.ndarray]:
        """Every key in table order as read-only arrays (copies): ``keys`` [K, n],
        ``offsets`` [K + 1] into ``tokens``/``counts`` [entries] (tokens ascending per key),
        and per key ``best_token``, ``best_count``, ``sum``."""
        names = ("keys", "offsets", "tokens", "counts", "best_token", "best_count", "sum")
        return dict(zip(names, self._arrays()))

    def items(self):
        """Iterate over (ngram tuple, {token: count}) in table order."""
        a = self.arrays()
        keys, offsets, toks, cnts = a["keys"], a["offsets"], a["tokens"], a["counts"]
        for i in range(keys.shape[0]):
            lo, hi = offsets[i], offsets[i + 1]
            yield tuple(keys[i].tolist()), dict(zip(toks[lo:hi].tolist(), cnts[lo:hi].tolist()))

    def _ngram(self, ngram) -> np.ndarray:
        arr = as_tokens(ngram, "ngram")
        if arr.size != self.ngram_size:
            raise ValueError(f"ngram: this table holds {self.ngram_size}-grams, got {arr.size} token ids")
        return arr

    def __repr__(self) -> str:
        where = f" mapped from {self._name!r}" if self.mapped else ""
        return (f"<StaticTable of {self.n_keys} {self.ngram_size}-grams, {self.n_entries} entries, "
                f"total {self.total}{where}>")
