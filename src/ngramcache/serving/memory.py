"""What the drafters learn across requests (:class:`Memory`) and its file (``NGSRVMEM``,
docs/format.md)."""

from __future__ import annotations

import collections
import hashlib
import os
import struct

import numpy as np

from ngramcache._state_file import StateFormat
from ngramcache._validate import as_tokens, check_int
from ngramcache.cache import NgramCache
from ngramcache.drafters.llama_ngram import MOD_TABLE_SIZE, NgramModDrafter, NgramModTable
from ngramcache.drafters.suffix import SuffixStore

__all__ = ["Memory", "vocab_fingerprint", "MEMORY_FORMAT"]

#: vocabulary size, vocabulary fingerprint, requests kept, their tokens, ngram-mod slots
MEMORY_FORMAT = StateFormat(b"NGSRVMEM", 1, "<I32sQQQ", "a server memory")


def vocab_fingerprint(backend) -> bytes:
    """SHA-256 of every token's bytes: memory saved with one vocabulary is refused by
    another (its token ids would mean other text)."""
    h = hashlib.sha256()
    for t in range(backend.n_vocab):
        p = backend.piece(t)
        h.update(struct.pack("<I", len(p)))
        h.update(p)
    return h.digest()


class Memory:
    """What the drafters learn across requests, bounded by ``max_tokens`` tokens of
    history (prompt + response of each request; the oldest requests are forgotten
    first, and the dynamic cache is rebuilt from what is kept).

    ``dynamic``: the n-gram counts of the history (llama.cpp's dynamic cache) for
    ``copy`` and ``lookup``; ``suffix``: a ``SuffixStore`` of the history for
    ``suffix``; ``mod``: an ``NgramModTable`` (fixed size) for ``mod``. Not thread-safe
    on its own: the engine's worker is its only user.
    """

    def __init__(self, max_tokens: int = 1_000_000, mod_size: int = MOD_TABLE_SIZE, ngram_min: int = 1,
                 ngram_max: int = 4):
        self.max_tokens = check_int("max_tokens", max_tokens, 1)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.dynamic = NgramCache()
        self.suffix = SuffixStore(max_tokens=self.max_tokens)
        self.mod = NgramModTable(mod_size)
        self._history: collections.deque[np.ndarray] = collections.deque()
        self._n_tokens = 0
        self.learned = 0  # requests learned since start or load

    @property
    def n_tokens(self) -> int:
        """Tokens of history kept."""
        return self._n_tokens

    @property
    def n_requests(self) -> int:
        """Requests kept."""
        return len(self._history)

    @property
    def nbytes(self) -> int:
        """Bytes held: the caches, the store, the table and the history."""
        return int(self.dynamic.nbytes + self.suffix.nbytes + self.mod.nbytes + 4 * self._n_tokens)

    def shared_state(self) -> dict:
        """The state held, by kind of ``ngramcache.drafters.registry``: the dynamic cache,
        the suffix store, the ngram-mod table."""
        from ngramcache.drafters import registry

        return {registry.DYNAMIC: self.dynamic, registry.SUFFIX_STORE: self.suffix, registry.MOD_TABLE: self.mod}

    def drafter_options(self, drafter: str) -> dict:
        """The shared state drafter ``drafter`` reads, as its constructor's keywords (its
        registry spec says which)."""
        from ngramcache.drafters import registry

        return registry.spec(drafter).shared_kwargs(self.shared_state())

    def learn(self, tokens, mod_learned: bool = False) -> None:
        """Remember one request (its prompt and response). ``mod_learned``: the request
        was drafted with ngram-mod on this table, which learned it already."""
        toks = as_tokens(tokens, "tokens").copy()
        if toks.size == 0:
            return
        if toks.size > self.max_tokens:
            toks = toks[-self.max_tokens:]
        self._history.append(toks)
        self._n_tokens += int(toks.size)
        self.suffix.add(toks)
        if not mod_learned:
            NgramModDrafter(table=self.mod).reset(toks)
        if self._n_tokens > self.max_tokens:
            # forget down to 3/4 of the budget, so that the rebuild is paid once per
            # quarter of the budget learned, not once per request
            while self._history and self._n_tokens > self.max_tokens * 3 // 4:
                self._n_tokens -= int(self._history.popleft().size)
            self._rebuild_dynamic()
        else:
            self.dynamic.update(toks, self.ngram_min, self.ngram_max)
        self.learned += 1

    def _rebuild_dynamic(self) -> None:
        self.dynamic.clear()
        for toks in self._history:
            self.dynamic.update(toks, self.ngram_min, self.ngram_max)

    def clear(self) -> None:
        """Forget everything."""
        self._history.clear()
        self._n_tokens = 0
        self.dynamic.clear()
        self.suffix.clear()
        self.mod.reset()

    def save(self, path: str | os.PathLike, n_vocab: int, fingerprint: bytes) -> None:
        """Write the memory to ``path`` atomically: a save that is interrupted leaves the
        previous file whole. The vocabulary (size and fingerprint) is recorded so that
        another model refuses the file; the layout is in docs/format.md."""
        lengths = np.array([t.size for t in self._history], dtype="<u4")
        tokens = np.concatenate(list(self._history)).astype("<i4") if self._history else np.zeros(0, "<i4")
        slots = self.mod.entries().astype("<i4")
        MEMORY_FORMAT.write(path, (n_vocab, fingerprint, lengths.size, tokens.size, slots.size),
                            (lengths, tokens, slots))

    @classmethod
    def load(cls, path: str | os.PathLike, n_vocab: int, fingerprint: bytes, max_tokens: int = 1_000_000,
             ngram_min: int = 1, ngram_max: int = 4) -> "Memory":
        """The memory saved at ``path``. A damaged, truncated or foreign file raises
        ``CacheFormatError`` ("damaged or not a server memory file"), one saved with
        another vocabulary ``VocabularyMismatchError`` ("made for another vocabulary")."""
        name = os.fspath(path)
        (nv, fp, n_req, n_tok, n_slots), payload = MEMORY_FORMAT.read(name, lambda f: 4 * (f[2] + f[3] + f[4]))
        MEMORY_FORMAT.check_vocabulary(name, (nv, fp), (n_vocab, fingerprint))
        if n_slots == 0:
            raise MEMORY_FORMAT.damaged(name, "the ngram-mod table has no slots")
        lengths = np.frombuffer(payload, dtype="<u4", count=n_req).astype(np.int64)
        tokens = np.frombuffer(payload, dtype="<i4", count=n_tok, offset=4 * n_req).astype(np.int32)
        slots = np.frombuffer(payload, dtype="<i4", count=n_slots, offset=4 * (n_req + n_tok)).astype(np.int32)
        if int(lengths.sum()) != n_tok:
            raise MEMORY_FORMAT.damaged(name, f"request lengths add up to {int(lengths.sum())} tokens, not {n_tok}")
        if n_tok and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
            raise MEMORY_FORMAT.damaged(name, "token ids outside the vocabulary")
        if int(slots.min()) < -1 or int(slots.max()) >= n_vocab:
            raise MEMORY_FORMAT.damaged(name, "ngram-mod slots hold ids outside the vocabulary")
        mem = cls(max_tokens=max_tokens, mod_size=int(n_slots), ngram_min=ngram_min, ngram_max=ngram_max)
        mem.mod.set_entries(slots)
        ends = np.cumsum(lengths)
        for end, n in zip(ends, lengths):
            toks = tokens[end - n : end]
            mem._history.append(toks)
            mem._n_tokens += int(n)
            mem.suffix.add(toks)
        while mem._history and mem._n_tokens > mem.max_tokens:
            mem._n_tokens -= int(mem._history.popleft().size)
        mem._rebuild_dynamic()
        return mem

    def __repr__(self) -> str:
        return f"<Memory {self.n_requests} requests, {self._n_tokens} tokens, {self.nbytes} bytes>"
