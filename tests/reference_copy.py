"""The copy drafter written in plain Python over ``LookupDrafter``: a dict of every
min_match-gram's positions, matched in Python, llama.cpp's lookup as the fallback. The
slow oracle the compiled ``CopyDrafter`` must agree with at every step."""

from __future__ import annotations

import numpy as np

from ngramcache._validate import check_int
from ngramcache.drafters.base import Proposal, Source
from ngramcache.drafters.lookup import LookupDrafter


class ReferenceCopyDrafter(LookupDrafter):
    """``ngramcache.CopyDrafter``'s behaviour: the same constructor, the same proposals,
    confidences and sources."""

    def __init__(self, static=None, dynamic=None, n_draft: int = 16, ngram_min: int = 1, ngram_max: int = 4,
                 min_match: int = 2, max_match: int = 32, max_candidates: int = 8):
        super().__init__(static=static, dynamic=dynamic, n_draft=n_draft, ngram_min=ngram_min,
                         ngram_max=ngram_max)
        min_match = check_int("min_match", min_match, 1)
        max_match = check_int("max_match", max_match, 1)
        if min_match > max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.max_candidates = check_int("max_candidates", max_candidates, 1)
        self._index: dict[tuple, list[int]] = {}
        self._indexed = 0  # positions < _indexed are in the index
        self.last_confidence = 0
        self.last_source = 0

    def _reset_index(self) -> None:
        super()._reset_index()
        self._index = {}
        self._indexed = 0
        self._index_new()

    def _appended(self, n_new: int) -> None:
        super()._appended(n_new)
        self._index_new()

    def _index_new(self) -> None:
        # every position i (the end of a min_match-gram) that has a successor
        seq = self.tokens
        m = self.min_match
        end = seq.size - 1  # the newest token has no successor yet
        i = max(self._indexed, m - 1)
        if i < end:
            toks = seq[max(0, i - m + 1) : end].tolist()
            off = max(0, i - m + 1)
            for j in range(i, end):
                self._index.setdefault(tuple(toks[j - m + 1 - off : j + 1 - off]), []).append(j)
            self._indexed = end

    def _candidates(self, n: int) -> Proposal:
        p = self._copy_or_lookup(n)
        self.last_confidence, self.last_source = p.confidence, p.source
        return p

    def _copy_or_lookup(self, n: int) -> Proposal:
        seq = self.tokens
        last = seq.size - 1
        m = self.min_match
        if last + 1 >= m:
            lst = self._index.get(tuple(seq[last - m + 1 : last + 1].tolist()))
            if lst:
                best_pos, best_len = -1, 0
                for pos in reversed(lst[-self.max_candidates :]):
                    length = m
                    limit = min(self.max_match, pos + 1)
                    while length < limit and seq[pos - length] == seq[last - length]:
                        length += 1
                    if length > best_len:
                        best_pos, best_len = pos, length
                cand = seq[best_pos + 1 : min(best_pos + 1 + n, last + 1)]
                if cand.size:
                    return Proposal(cand.copy(), best_len, Source.COPY)
        return super()._candidates(n)
