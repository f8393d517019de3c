"""llama.cpp's lookup drafting (context -> dynamic -> static)."""

from __future__ import annotations

import numpy as np

from . import _core
from ._validate import as_tokens
from .cache import NgramCache, _check_sizes

# The output buffer is allocated up front; a cycle in the caches can make a draft as long as
# n_draft, so an absurd n_draft is a mistake to report, not memory to reserve.
MAX_DRAFT = 1 << 20


def draft(tokens, n_draft: int, context: NgramCache, dynamic: NgramCache | None = None,
          static=None, ngram_min: int = 1, ngram_max: int = 4) -> np.ndarray:
    """Draft up to ``n_draft`` tokens to follow ``tokens``.

    ``tokens`` is the whole sequence so far; its last element is the newest token
    (llama.cpp's ``inp`` with ``draft = [inp.back()]``). Returns only the drafted
    continuation, 0 to ``n_draft`` int32 tokens. The context cache is tried with lax
    thresholds, then the dynamic cache with strict ones, then the static cache; longer
    n-grams first; the static cache re-ranks candidates; drafting stops at the first
    step where nothing passes. Exactly ``common_ngram_cache_draft``, except that ties
    go to the candidate first seen latest and arithmetic is 64-bit.
    """
    if not isinstance(n_draft, (int, np.integer)) or isinstance(n_draft, bool):
        raise ValueError(f"n_draft must be an integer, got {type(n_draft).__name__}")
    if n_draft < 0:
        raise ValueError(f"n_draft must be >= 0, got {n_draft}")
    if n_draft > MAX_DRAFT:
        raise ValueError(f"n_draft must be <= {MAX_DRAFT}, got {n_draft}")
    _check_sizes(ngram_min, ngram_max)
    if not isinstance(context, _core.NgramCache):
        raise TypeError(f"context must be an NgramCache, got {type(context).__name__}")
    if dynamic is not None and not isinstance(dynamic, _core.NgramCache):
        raise TypeError(f"dynamic must be an NgramCache or None, got {type(dynamic).__name__}")
    # Drafting reads only the newest 4 tokens (the longest key): validating and passing
    # just those keeps a draft step O(1) in the context length.
    if hasattr(tokens, "__len__") and not isinstance(tokens, (str, bytes)) and len(tokens) > 4:
        try:
            tokens = tokens[-4:]
        except TypeError:  # a sequence without slicing (deque): validate it whole
            pass
    arr = as_tokens(tokens)
    return _core._draft(arr, int(n_draft), context, dynamic, static, ngram_min, ngram_max)
