"""The copy drafter: the continuation of the longest earlier copy of the newest tokens,
else llama.cpp's lookup."""

from __future__ import annotations


from ngramcache import _core
from ngramcache.cache import NgramCache
from ngramcache.drafters.base import CoreSequenceDrafter
from ngramcache.drafters.lookup import NGRAM_MAX_OPTION, NGRAM_MIN, LookupCaches
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.options import Option

__all__ = ["CopyDrafter"]

MIN_MATCH = Option("min_match", int, 2, "tokens that must repeat before a copy is proposed", lo=1)
MAX_MATCH = Option("max_match", int, 32, "longest match compared when choosing among earlier copies", lo=1)
MAX_CANDIDATES = Option("max_candidates", int, 8, "newest earlier places compared", lo=1)


class CopyDrafter(LookupCaches, CoreSequenceDrafter):
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
    current with the sequence), then ``dynamic``, then ``static`` (a ``StaticTable`` of
    2-grams or an ``NgramCache``), exactly as ``LookupDrafter``. Index, matching and
    fallback run in the compiled core, so ``ngramcache.replays.replay_drafter`` replays
    this drafter entirely in C++.

    Each proposal says whether it is a copy (its confidence: the match length) or a lookup.
    """

    OPTIONS = (NGRAM_MIN, NGRAM_MAX_OPTION, MIN_MATCH, MAX_MATCH, MAX_CANDIDATES)
    ORDERED = (("ngram_min", "ngram_max"), ("min_match", "max_match"))

    def __init__(self, static=None, dynamic: NgramCache | None = None, n_draft: int = N_DRAFT,
                 ngram_min: int = NGRAM_MIN.default, ngram_max: int = NGRAM_MAX_OPTION.default,
                 min_match: int = MIN_MATCH.default,
                 max_match: int = MAX_MATCH.default, max_candidates: int = MAX_CANDIDATES.default):
        super().__init__(n_draft)
        self._set_options(ngram_min=ngram_min, ngram_max=ngram_max, min_match=min_match, max_match=max_match,
                          max_candidates=max_candidates)
        self._init_caches(static, dynamic)
        self._impl = _core.CopyDrafter(*self._core_caches(), self.ngram_min, self.ngram_max, self.min_match,
                                       self.max_match, self.max_candidates)

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence: the copy index and the context cache are rebuilt from
        ``prompt_tokens``."""
        super().reset(prompt_tokens)

    @property
    def _index(self) -> dict[tuple, list[int]]:
        # every indexed position (the last token of a min_match-gram with a successor) by
        # its gram, oldest first: for tests and inspection
        return self._impl.index()

    def __repr__(self) -> str:
        return self._describe([f"n_draft={self.n_draft}", f"min_match={self.min_match}"])
