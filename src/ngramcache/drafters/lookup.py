"""llama.cpp's lookup decoding as a ``Drafter``, and the caches it reads (shared with
``CopyDrafter``, whose fallback it is). Both run in the compiled core."""

from __future__ import annotations

import os

from ngramcache import _core
from ngramcache._validate import NGRAM_MAX
from ngramcache.cache import NgramCache
from ngramcache.drafters.base import CoreSequenceDrafter, Source
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.options import Option, OptionError
from ngramcache.static_table import StaticTable

__all__ = ["LookupDrafter", "LookupCaches", "check_caches", "NGRAM_MIN", "NGRAM_MAX_OPTION"]

# The static part drafts with 2-gram keys only (llama.cpp's LLAMA_NGRAM_STATIC).
_STATIC_NGRAM = 2

NGRAM_MIN = Option("ngram_min", int, 1, "shortest n-gram looked up in the caches", lo=1, hi=NGRAM_MAX)
NGRAM_MAX_OPTION = Option("ngram_max", int, NGRAM_MAX, "longest n-gram looked up in the caches", lo=1, hi=NGRAM_MAX)


def check_caches(static, dynamic) -> None:
    """The dynamic and static caches of a lookup: an ``NgramCache`` or None, and an
    ``NgramCache``, a ``StaticTable`` of 2-grams or None. A static table of another
    n-gram size is refused here rather than at every proposal."""
    if dynamic is not None and not isinstance(dynamic, NgramCache):
        raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
    if static is not None and not isinstance(static, (NgramCache, StaticTable)):
        raise TypeError(f"static must be an NgramCache, a StaticTable or None, got {type(static).__name__}")
    if isinstance(static, StaticTable) and static.ngram_size != _STATIC_NGRAM:
        raise OptionError("static", f"must be a table of {_STATIC_NGRAM}-grams (llama.cpp's LLAMA_NGRAM_STATIC), "
                                    f"this one holds {static.ngram_size}-grams")


class LookupCaches:
    """The caches of llama.cpp's lookup, for a compiled drafter that drafts from them:
    ``context`` (the n-grams of the current sequence, which the core keeps current),
    ``dynamic`` (an ``NgramCache`` of earlier text, or None; replacing it tells the core)
    and ``static`` (an ``NgramCache``, a ``StaticTable`` of 2-grams, or None)."""

    def _init_caches(self, static, dynamic) -> None:
        check_caches(static, dynamic)
        self.static = static
        self._dynamic = dynamic
        #: the context cache: the n-grams of the current sequence, kept current with it
        self.context = NgramCache()

    def _core_caches(self) -> tuple:
        """The compiled handles of the context, dynamic and static caches, for the core's constructor."""
        return (self.context._impl, None if self._dynamic is None else self._dynamic._impl,
                None if self.static is None else self.static._impl)

    @property
    def dynamic(self) -> NgramCache | None:
        """The dynamic cache drafting reads after the context cache (or None)."""
        return self._dynamic

    @dynamic.setter
    def dynamic(self, cache: NgramCache | None) -> None:
        check_caches(None, cache)
        self._dynamic = cache
        self._impl.set_dynamic(None if cache is None else cache._impl)

    def save_dynamic(self, path: str | os.PathLike) -> NgramCache:
        """Merge the context cache into the dynamic cache (creating it if there was
        none) and write it to ``path`` in llama.cpp's format, like ``llama-lookup -lcd``.
        Returns the dynamic cache."""
        if self._dynamic is None:
            self.dynamic = NgramCache()
        self._dynamic.merge(self.context)
        self._dynamic.save(path)
        return self._dynamic

    def _describe(self, parts: list[str]) -> str:
        if self._dynamic is not None:
            parts.append("dynamic")
        if self.static is not None:
            parts.append("static")
        return f"<{type(self).__name__} {' '.join(parts)}, {self.tokens.size} tokens>"


class LookupDrafter(LookupCaches, CoreSequenceDrafter):
    """llama.cpp's lookup decoding as a ``Drafter``.

    Drafts from the context cache (n-grams of the current sequence, kept current
    incrementally), then the ``dynamic`` cache (an ``NgramCache``, e.g. loaded from a
    ``-lcd`` file), then the ``static`` table (an ``NgramCache`` or a ``StaticTable`` of
    2-grams), exactly as ``common_ngram_cache_draft``. Per step the work is proportional
    to the tokens accepted, never to the length of the sequence. It runs in the compiled
    core, so ``ngramcache.replays.replay_drafter`` replays it entirely in C++.

    Its proposals are of source ``Source.LOOKUP``, with the proposal's length as their
    confidence.
    """

    _SOURCE = Source.LOOKUP
    OPTIONS = (NGRAM_MIN, NGRAM_MAX_OPTION)
    ORDERED = (("ngram_min", "ngram_max"),)

    def __init__(self, static=None, dynamic: NgramCache | None = None, n_draft: int = N_DRAFT,
                 ngram_min: int = NGRAM_MIN.default, ngram_max: int = NGRAM_MAX_OPTION.default):
        super().__init__(n_draft)
        self._set_options(ngram_min=ngram_min, ngram_max=ngram_max)
        self._init_caches(static, dynamic)
        self._impl = _core.LookupDrafter(*self._core_caches(), self.ngram_min, self.ngram_max)

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence: the context cache is rebuilt from ``prompt_tokens``."""
        super().reset(prompt_tokens)

    def __repr__(self) -> str:
        return self._describe([f"n_draft={self.n_draft}"])
