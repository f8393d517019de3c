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

from ngramcache import _core
from ngramcache._validate import NGRAM_MAX, as_tokens, check_int
from ngramcache.cache import NgramCache, _wrap

CacheFormatError = _core.CacheFormatError

HEADER_SIZE = 64


class StaticTable:
    """n-gram -> {next token: count}, immutable, for llama.cpp's static cache role.

    Make one with :meth:`build` (from tokens), :meth:`from_llama` (import a llama.cpp
    ``lookup.bin``), :meth:`from_cache` or :meth:`open` (map an NGST file). Pass it as
    ``static=`` to :func:`ngramcache.draft`: the drafts are exactly those of an
    ``NgramCache`` holding the same counts.

    Every key stores its best continuation (highest count; among equal counts the one
    llama.cpp picks from the lookup.bin of the same counts, docs/parity.md) with its
    count and the key's total, so a static-only draft step is one lookup.

    Nothing can change a table once made, so any number of threads may use one at once.
    A mapped table reads the file lazily: do not truncate or rewrite the file in place
    while it is open (``save`` and ``to_llama`` replace files atomically, which is safe).
    """

    __slots__ = ("_impl",)

    def __init__(self, _table) -> None:
        """Not for direct use: call ``StaticTable.build``, ``open``, ``from_llama``,
        ``from_cache`` or ``from_bytes``."""
        if not isinstance(_table, _core.StaticTable):
            raise TypeError("make a StaticTable with StaticTable.build, .open, .from_llama, .from_cache or .from_bytes")
        self._impl = _table

    # ---- making tables ---------------------------------------------------------------

    @classmethod
    def build(cls, tokens, ngram_size: int = 2) -> "StaticTable":
        """Count every n-gram of ``tokens`` followed by its next token, as
        ``NgramCache().update(tokens, ngram_size, ngram_size)`` (what llama-lookup-create
        does with 2-grams), and return the table, in memory; ``save`` writes it. A tie
        goes as in llama.cpp with the lookup.bin llama-lookup-create writes from the same
        tokens: that cache saved, then loaded."""
        n = check_int("ngram_size", ngram_size, 1, NGRAM_MAX)
        return cls(_core.StaticTable.build(as_tokens(tokens), n))

    @classmethod
    def open(cls, path: str | os.PathLike) -> "StaticTable":
        """Map an NGST file read-only. Checks the header and every section's bounds, in
        time independent of the file's size; ``verify()`` checks the contents.

        Raises CacheFormatError naming the problem for an empty, truncated or damaged
        file, FileNotFoundError if it does not exist."""
        return cls(_core.StaticTable.open(os.fspath(path)))

    @classmethod
    def from_llama(cls, path: str | os.PathLike, ngram_size: int | None = None) -> "StaticTable":
        """Import a llama.cpp ``lookup.bin`` (e.g. from ``llama-lookup-create``).

        The counts are exactly those ``NgramCache.load`` reads; on a tie the best token
        is the one llama.cpp's map loaded from the file visits first. A static cache holds 2-grams
        only; for a file with several n-gram sizes (a context or dynamic cache) pass
        ``ngram_size`` to keep the keys of one size."""
        n = check_int("ngram_size", ngram_size, 1, NGRAM_MAX, none_ok=True)
        return cls(_core.StaticTable.from_lookup_file(os.fspath(path), 0 if n is None else n))

    @classmethod
    def from_cache(cls, cache: NgramCache, ngram_size: int = 2) -> "StaticTable":
        """The keys of size ``ngram_size`` of an ``NgramCache``, with its counts; a key's
        best token is the one drafting with this cache as the static cache picks."""
        if not isinstance(cache, NgramCache):
            raise TypeError(f"cache must be an NgramCache, got {type(cache).__name__}")
        n = check_int("ngram_size", ngram_size, 1, NGRAM_MAX)
        return cls(_core.StaticTable.from_cache(cache._impl, n))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> "StaticTable":
        """A table from an NGST image held in memory (copied), checked like ``open``."""
        return cls(_core.StaticTable.from_image(bytes(data), name))

    @staticmethod
    def read_header(path: str | os.PathLike) -> dict:
        """The header of an NGST file as a dict (see ``info``), reading only its first
        64 bytes; checks them and that the file has the size they describe."""
        p = os.fspath(path)
        with open(p, "rb") as f:
            head = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
        return _core.read_header(head, size, p)

    # ---- writing ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the NGST file atomically (temporary file, fsync, rename): an interrupted
        save never leaves a damaged file behind, and a mapped table may be saved over the
        file it maps."""
        self._impl.save(os.fsencode(path))  # bytes: any name the OS allows, UTF-8 or not

    def to_bytes(self) -> bytes:
        """The NGST image (what ``save`` writes)."""
        return self._impl.to_bytes()

    def to_llama(self, path: str | os.PathLike) -> None:
        """Write llama.cpp's ``lookup.bin`` format (atomically), usable as ``-lcs``. Each
        record lists its pairs in an order that makes llama.cpp's loader break a tie
        toward this table's best token. Runs ``verify()`` first, so damage is never exported."""
        self._impl.save_lookup(os.fsencode(path))

    def to_llama_bytes(self) -> bytes:
        """The ``lookup.bin`` image of ``to_llama``."""
        return self._impl.to_lookup_bytes()

    def to_cache(self) -> NgramCache:
        """A new mutable ``NgramCache`` with the same counts (e.g. to merge tables); its
        first-seen order keeps every key's best token."""
        return _wrap(NgramCache, self._impl.to_cache())

    # ---- reading ---------------------------------------------------------------------

    def verify(self) -> None:
        """Check every byte: the checksums of all sections, then that the index, keys,
        entries, best tokens, sums and totals are consistent. O(size); raises
        CacheFormatError with the first problem found."""
        self._impl.verify()

    def get(self, ngram) -> dict[int, int]:
        """The continuations of ``ngram`` (``ngram_size`` token ids) as {token: count},
        tokens ascending; an empty dict if the n-gram is not in the table."""
        return self._impl.get(_key(ngram, self.ngram_size))

    def best(self, ngram) -> tuple[int, int, int] | None:
        """(best token, its count, sum of the key's counts) as stored for ``ngram``, or
        None if absent. Drafting uses the token when count >= 50 % of sum and sum >= 2."""
        return self._impl.best(_key(ngram, self.ngram_size))

    def __contains__(self, ngram) -> bool:
        return self._impl.__contains__(_key(ngram, self.ngram_size))

    def __len__(self) -> int:
        return len(self._impl)

    @property
    def ngram_size(self) -> int:
        """The size of every key (2 for llama.cpp's static cache)."""
        return self._impl.ngram_size

    @property
    def n_keys(self) -> int:
        """Distinct n-grams."""
        return self._impl.n_keys

    @property
    def n_entries(self) -> int:
        """(n-gram, next token) pairs: the records of llama.cpp's file."""
        return self._impl.n_entries

    @property
    def total(self) -> int:
        """The sum of all counts (observations)."""
        return self._impl.total

    @property
    def nbytes(self) -> int:
        """The size of the image (the NGST file), in bytes."""
        return self._impl.nbytes

    @property
    def mapped(self) -> bool:
        """Whether the table reads a memory-mapped file (``open``) rather than memory."""
        return self._impl.mapped

    @property
    def path(self) -> str | None:
        """The file a mapped table reads, else None."""
        return self._impl.name if self.mapped else None

    def info(self) -> dict:
        """The header as a dict: format version, n-gram size, counts, section offsets and
        sizes, checksums, plus ``path`` and ``mapped``."""
        d = self._impl.header()
        d["path"] = self.path
        d["mapped"] = self.mapped
        return d

    def arrays(self) -> dict[str, np.ndarray]:
        """Every key in table order as read-only arrays (copies): ``keys`` [K, n],
        ``offsets`` [K + 1] into ``tokens``/``counts`` [entries] (tokens ascending per key),
        and per key ``best_token``, ``best_count``, ``sum``."""
        names = ("keys", "offsets", "tokens", "counts", "best_token", "best_count", "sum")
        return dict(zip(names, self._impl.arrays()))

    def items(self):
        """Iterate over (ngram tuple, {token: count}) in table order."""
        a = self.arrays()
        keys, offsets, toks, cnts = a["keys"], a["offsets"], a["tokens"], a["counts"]
        for i in range(keys.shape[0]):
            lo, hi = offsets[i], offsets[i + 1]
            yield tuple(keys[i].tolist()), dict(zip(toks[lo:hi].tolist(), cnts[lo:hi].tolist()))

    def __repr__(self) -> str:
        where = f" mapped from {self._impl.name!r}" if self.mapped else ""
        return (f"<StaticTable of {self.n_keys} {self.ngram_size}-grams, {self.n_entries} entries, "
                f"total {self.total}{where}>")


def _key(ngram, n: int) -> np.ndarray:
    """``ngram`` as the int32 key of a table of ``n``-grams, or ValueError."""
    arr = as_tokens(ngram, "ngram")
    if arr.size != n:
        raise ValueError(f"ngram: this table holds {n}-grams, got {arr.size} token ids")
    return arr
