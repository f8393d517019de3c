"""llama.cpp's lookup drafting (context -> dynamic -> static)."""

from __future__ import annotations

import numpy as np

from ngramcache import _core
from ngramcache._validate import NGRAM_MAX, check_int, check_ngram_sizes, tail_tokens
from ngramcache.cache import NgramCache
from ngramcache.defaults import MAX_DRAFT  # the output is allocated up front, n_draft long at most
from ngramcache.static_table import StaticTable


def draft(tokens, n_draft: int, context: NgramCache, dynamic: NgramCache | None = None,
          static=None, ngram_min: int = 1, ngram_max: int = 4) -> np.ndarray:
    """Draft up to ``n_draft`` tokens to follow ``tokens``.

    ``tokens`` is the whole sequence so far; its last element is the newest token
    (llama.cpp's ``inp`` with ``draft = [inp.back()]``). Returns only the drafted
    continuation, 0 to ``n_draft`` int32 tokens. The context cache is tried with lax
    thresholds, then the dynamic cache with strict ones, then the static cache; longer
    n-grams first; the static cache re-ranks candidates; drafting stops at the first
    step where nothing passes. Exactly ``common_ngram_cache_draft`` (ties included: the
    first tied token in libstdc++'s iteration order of the part, docs/parity.md), except
    that scores are computed exactly (no overflow) and an n-gram longer than the sequence
    is not found.
    """
    n_draft = check_int("n_draft", n_draft, 0)
    if n_draft > MAX_DRAFT:  # its own check, so the usual message says ">= 0" alone
        check_int("n_draft", n_draft, hi=MAX_DRAFT)
    ngram_min, ngram_max = check_ngram_sizes(ngram_min, ngram_max)
    if not isinstance(context, NgramCache):
        raise TypeError(f"context must be an NgramCache, got {type(context).__name__}")
    if dynamic is not None and not isinstance(dynamic, NgramCache):
        raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
    if static is not None and not isinstance(static, (StaticTable, NgramCache)):
        raise TypeError(f"static must be an NgramCache, a StaticTable or None, got {type(static).__name__}")
    # Drafting reads only the newest 4 tokens (the longest key): validating and passing
    # just those keeps a draft step O(1) in the context length.
    return draft_checked(tail_tokens(tokens, NGRAM_MAX), n_draft, context, dynamic, static, ngram_min, ngram_max)


def draft_checked(tokens: np.ndarray, n_draft: int, context: NgramCache, dynamic: NgramCache | None,
                  static, ngram_min: int, ngram_max: int) -> np.ndarray:
    """``draft`` for callers that validated everything already: ``tokens`` a 1-D int32
    array of ids >= 0, the rest as ``draft`` checks them. Drafters check their settings
    once when made and their tokens once when they arrive, so their steps call this and
    skip the per-call checks (about 1 us, a tenth of a drafting step)."""
    return _core.draft(tokens[-NGRAM_MAX:], n_draft, context._impl, None if dynamic is None else dynamic._impl,
                       None if static is None else static._impl, ngram_min, ngram_max)
