"""llama.cpp's newer draft-free drafters (``--spec-type ngram-simple``, ``ngram-map-k``,
``ngram-map-k4v``, ``ngram-mod``), with exactly llama.cpp's drafts.

Two faces per drafter:

* llama.cpp's calling shape, for code ported from llama.cpp or driving a server loop:
  ``NgramSimple``, ``NgramMapK``, ``NgramMod`` with ``begin(prompt)``,
  ``draft(prompt, id_last) -> int32 array`` and ``accept(n_accepted)``, where ``prompt``
  is the context *without* ``id_last``, the token just sampled, and ``n_accepted``
  counts the accepted draft tokens (not the sampled one);
* the ``Drafter`` protocol of ``ngramcache.drafters.base`` (``reset``/``propose``/``accept``
  with the verified tokens): ``NgramSimpleDrafter``, ``NgramMapDrafter`` and
  ``NgramModDrafter``, which also replay in C++ (``ngramcache.replays.replay_drafter``).

ngram-mod's ``NgramModTable`` (16 MiB by default, as llama.cpp) can be shared by any
number of drafters and threads; see docs/speculative.md for its guarantees.

Each drafter keeps a copy of the prompt and indexes only what was appended, so a call
costs the same at any context length. ``draft(prompt, ...)`` with the *same* list (or
other sequence object) as the previous call, grown by appending, converts and checks
only the new tokens and the last few it had seen; a different object is converted
whole and compared with the copy. So do not edit a prompt list in place other than by
appending; pass a new object (or call ``begin``) when the history is rewritten.
"""

from __future__ import annotations

import os

import numpy as np

from ngramcache import _core
from ngramcache._state_file import StateFormat
from ngramcache._validate import INT32_MAX, as_tokens, check_int
from ngramcache.drafters.base import CoreSequenceDrafter, Source
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.options import Option, check_options

__all__ = [
    "NgramSimple", "NgramMapK", "NgramMod", "NgramModTable",
    "NgramSimpleDrafter", "NgramMapDrafter", "NgramModDrafter",
]

SIZE_MAX = 1024              # llama.cpp's option range for the n-gram sizes
MOD_TABLE_SIZE = 4194304     # common_ngram_mod's entries (16 MiB)
# A prompt object seen before is trusted to have only grown; the last _GUARD tokens of
# what was seen are compared again, which catches a list cut and regrown.
_GUARD = 8


# llama.cpp's option ranges and defaults, one set per drafter
SIMPLE_OPTIONS = (
    Option("size_n", int, 12, "tokens matched", lo=1, hi=SIZE_MAX),
    Option("size_m", int, 48, "most tokens copied", lo=1, hi=SIZE_MAX),
)
MAP_OPTIONS = (
    Option("size_n", int, 12, "key size", lo=1, hi=SIZE_MAX),
    Option("size_m", int, 48, "value size", lo=1, hi=SIZE_MAX),
    Option("min_hits", int, 1, "minimum hits of a key", lo=1, hi=65535),
    Option("k4v", bool, False, "keep up to four counted values per key (ngram-map-k4v)"),
)
MOD_OPTIONS = (
    Option("n_match", int, 24, "tokens hashed per lookup", lo=1, hi=SIZE_MAX),
    Option("n_min", int, 48, "shortest draft", lo=0, hi=SIZE_MAX),
    Option("n_max", int, 64, "longest draft", lo=0, hi=SIZE_MAX),
)
_SIMPLE = {o.name: o.default for o in SIMPLE_OPTIONS}
_MAP = {o.name: o.default for o in MAP_OPTIONS}
_MOD = {o.name: o.default for o in MOD_OPTIONS}


class NgramModTable:
    """ngram-mod's table: ``size`` int32 slots (default 4,194,304 = 16 MiB), slot = a
    polynomial hash of the n-gram, holding the token that followed it last (-1: none).
    Share one among drafters (``NgramMod(table=...)``, ``NgramModDrafter(table=...)``)
    and threads: slots are atomic, so concurrent use is free of data races."""

    def __init__(self, size: int = MOD_TABLE_SIZE):
        size = check_int("size", size, 1, 2**32)
        self._impl = _core.NgramModTable(size)

    @property
    def size(self) -> int:
        """Number of slots."""
        return self._impl.size

    @property
    def nbytes(self) -> int:
        """Memory of the slots (4 bytes each), fixed at construction."""
        return self._impl.nbytes

    @property
    def used(self) -> int:
        """Slots written since the last reset."""
        return self._impl.used

    @property
    def resets(self) -> int:
        """How often the table was cleared (by ``reset`` or a drafter's reset rules)."""
        return self._impl.resets

    def get(self, ngram) -> int:
        """The token stored for ``ngram``'s slot, -1 when empty (no key is stored: a
        colliding n-gram answers too, as in llama.cpp)."""
        return self._impl.get(as_tokens(ngram, "ngram"))

    def reset(self) -> None:
        """Empty every slot (for every drafter sharing the table)."""
        self._impl.reset()

    def entries(self) -> np.ndarray:
        """Every slot (int32, -1 where empty), copied; each slot is read once, atomically,
        so drafters may keep writing meanwhile."""
        return self._impl.entries()

    def set_entries(self, entries) -> None:
        """Overwrite every slot with ``entries`` (``size`` int32 values, -1 for empty);
        ValueError if their number is not ``size`` or a value is below -1."""
        self._impl.set_entries(np.ascontiguousarray(entries, dtype=np.int32))

    def save(self, path: str | os.PathLike) -> None:
        """Write every slot to ``path`` (``NGMT`` magic, version, size, the int32 slots, a
        CRC-32; little-endian; docs/format.md), atomically: an interrupted save leaves the
        previous file whole. Drafters may keep writing meanwhile; each slot is read once,
        atomically."""
        _MOD_FORMAT.write(path, (self.size,), (self.entries().astype("<i4"),))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NgramModTable":
        """The table saved at ``path``. A damaged, truncated or foreign file raises
        ``CacheFormatError`` naming the problem; a missing one ``FileNotFoundError``."""
        name = os.fspath(path)
        (size,), payload = _MOD_FORMAT.read(name, lambda fields: 4 * fields[0])
        if not 1 <= size <= 2**32:
            raise _MOD_FORMAT.damaged(name, f"bad table size {size}")
        table = cls(size)
        try:
            table.set_entries(np.frombuffer(payload, dtype="<i4"))
        except ValueError as e:
            raise _MOD_FORMAT.damaged(name, str(e)) from None
        return table

    def __repr__(self) -> str:
        return f"<NgramModTable {self.size} slots, {self.used} used>"


_MOD_FORMAT = StateFormat(b"NGMT", 1, "<Q", "an ngram-mod table")  # the number of slots


def _small_tokens(toks) -> np.ndarray:
    """as_tokens for the few tokens a growing prompt gains per call: a list of plain ints
    skips numpy's reductions, whose fixed cost would dominate."""
    if type(toks) is list and toks and all(type(t) is int for t in toks) and min(toks) >= 0 \
            and max(toks) <= INT32_MAX:
        return np.array(toks, dtype=np.int32)
    return as_tokens(toks, "prompt")


class _LlamaShaped:
    """What the llama.cpp-shaped drafters share: the prompt handed to the core's copy
    with as little conversion as the caller allows."""

    _impl = None
    OPTIONS: tuple[Option, ...] = ()

    def __init__(self):
        self._obj = None  # the prompt object of the last call, trusted to only grow
        self._n = 0

    def _set_options(self, **values) -> None:
        for name, value in check_options(self.OPTIONS, values).items():
            setattr(self, name, value)

    def _sync(self, prompt) -> None:
        core = self._impl
        if prompt is self._obj:
            try:
                n = len(prompt)
            except TypeError:
                n = -1
            if n >= self._n:
                start = max(0, self._n - _GUARD)
                try:
                    tail = _small_tokens(prompt[start:])
                except TypeError:  # not sliceable: converted whole below
                    tail = None
                if tail is not None and core.extend(tail, start):
                    self._n = n
                    return
        arr = as_tokens(prompt, "prompt")
        core.sync(arr)
        self._obj = prompt
        self._n = int(arr.size)

    def begin(self, prompt) -> None:
        """A new request starts with ``prompt`` (its tokens processed, nothing sampled)."""
        self._sync(prompt)
        self._impl.begin()

    def draft(self, prompt, id_last) -> np.ndarray:
        """The draft (int32, possibly empty) to follow ``prompt`` + ``[id_last]``."""
        id_last = check_int("id_last", id_last, 0, INT32_MAX)
        self._sync(prompt)
        return self._impl.draft(id_last)

    def accept(self, n_accepted) -> None:
        """How many tokens of the last draft the target model accepted (0 included)."""
        self._impl.accept(check_int("n_accepted", n_accepted, 0, INT32_MAX))

    @property
    def n_tokens(self) -> int:
        """Length of the prompt the drafter holds."""
        return self._impl.n_tokens


class NgramSimple(_LlamaShaped):
    """ngram-simple: when the last ``size_n`` tokens (ending in ``id_last``) occurred
    before, drafts what followed their most recent occurrence, up to ``size_m`` tokens
    (nothing if fewer than ``size_n`` are available). No state across requests."""

    OPTIONS = SIMPLE_OPTIONS

    def __init__(self, size_n: int = _SIMPLE["size_n"], size_m: int = _SIMPLE["size_m"]):
        super().__init__()
        self._set_options(size_n=size_n, size_m=size_m)
        self._impl = _core.NgramSimple(self.size_n, self.size_m)

    def __repr__(self) -> str:
        return f"<NgramSimple size_n={self.size_n} size_m={self.size_m}, {self.n_tokens} tokens>"


class NgramMapK(_LlamaShaped):
    """ngram-map-k (``k4v=False``) or ngram-map-k4v: a map of ``size_n``-gram keys to
    their occurrences, with llama.cpp's 2^18-slot index, acceptance ratchet and (k4v) up to
    four counted values per key, ``min_hits`` hits before drafting."""

    OPTIONS = MAP_OPTIONS

    def __init__(self, size_n: int = _MAP["size_n"], size_m: int = _MAP["size_m"], min_hits: int = _MAP["min_hits"],
                 k4v: bool = _MAP["k4v"]):
        super().__init__()
        self._set_options(size_n=size_n, size_m=size_m, min_hits=min_hits, k4v=k4v)
        self._impl = _core.NgramMap(self.size_n, self.size_m, self.min_hits, self.k4v)

    @property
    def n_keys(self) -> int:
        """Key records made so far."""
        return self._impl.n_keys

    def __repr__(self) -> str:
        kind = "k4v" if self.k4v else "k"
        return f"<NgramMapK {kind} size_n={self.size_n} size_m={self.size_m}, {self.n_tokens} tokens>"


def _check_table(table) -> NgramModTable:
    if table is None:
        return NgramModTable()
    if not isinstance(table, NgramModTable):
        raise TypeError(f"table must be an NgramModTable or None, got {type(table).__name__}")
    return table


class NgramMod(_LlamaShaped):
    """ngram-mod: chains ``n_match``-gram lookups in a shared hash table to draft
    ``n_min`` to ``n_max`` tokens (nothing when fewer than ``n_min`` are found); five
    drafts in a row with under a quarter accepted clear the table. ``table``: an
    ``NgramModTable`` to share, None for a private one (16 MiB). As in llama.cpp, ``n_min``
    may exceed ``n_max`` (nothing is ever drafted then); ``NgramModDrafter`` refuses that."""

    OPTIONS = MOD_OPTIONS

    def __init__(self, n_match: int = _MOD["n_match"], n_min: int = _MOD["n_min"], n_max: int = _MOD["n_max"],
                 table: NgramModTable | None = None):
        super().__init__()
        self._set_options(n_match=n_match, n_min=n_min, n_max=n_max)
        self.table = _check_table(table)
        self._impl = _core.NgramMod(self.table._impl, self.n_match, self.n_min, self.n_max)

    def __repr__(self) -> str:
        return f"<NgramMod n_match={self.n_match} n_min={self.n_min} n_max={self.n_max}, {self.n_tokens} tokens>"


# ---------------------------------------------------------------------------------
# the same drafters under the Drafter protocol


class NgramSimpleDrafter(CoreSequenceDrafter):
    """ngram-simple (see ``NgramSimple``) as a ``Drafter``: proposes what llama.cpp's
    ngram-simple drafts for the verified sequence, cut to ``n_draft``."""

    _SOURCE = Source.COPY
    OPTIONS = SIMPLE_OPTIONS

    def __init__(self, size_n: int = _SIMPLE["size_n"], size_m: int = _SIMPLE["size_m"], n_draft: int = N_DRAFT):
        super().__init__(n_draft)
        self._set_options(size_n=size_n, size_m=size_m)
        self._impl = _core.NgramSimpleSequence(self.size_n, self.size_m)


class NgramMapDrafter(CoreSequenceDrafter):
    """ngram-map-k / ngram-map-k4v (see ``NgramMapK``) as a ``Drafter``; the
    acceptance ratchet is fed with each proposal's accepted prefix."""

    _SOURCE = Source.COPY
    OPTIONS = MAP_OPTIONS

    def __init__(self, size_n: int = _MAP["size_n"], size_m: int = _MAP["size_m"], min_hits: int = _MAP["min_hits"],
                 k4v: bool = _MAP["k4v"], n_draft: int = N_DRAFT):
        super().__init__(n_draft)
        self._set_options(size_n=size_n, size_m=size_m, min_hits=min_hits, k4v=k4v)
        self._impl = _core.NgramMapSequence(self.size_n, self.size_m, self.min_hits, self.k4v)


class NgramModDrafter(CoreSequenceDrafter):
    """ngram-mod (see ``NgramMod``) as a ``Drafter``. ``table``: an ``NgramModTable``
    shared across requests (and drafters, and threads), None for a private one. Unlike
    llama.cpp, ``n_min`` above ``n_max`` is refused: such a drafter would never draft."""

    _SOURCE = Source.COPY
    OPTIONS = MOD_OPTIONS
    ORDERED = (("n_min", "n_max"),)

    def __init__(self, n_match: int = _MOD["n_match"], n_min: int = _MOD["n_min"], n_max: int = _MOD["n_max"],
                 table: NgramModTable | None = None, n_draft: int = N_DRAFT):
        super().__init__(n_draft)
        self._set_options(n_match=n_match, n_min=n_min, n_max=n_max)
        self.table = _check_table(table)
        self._impl = _core.NgramModSequence(self.table._impl, self.n_match, self.n_min, self.n_max)
