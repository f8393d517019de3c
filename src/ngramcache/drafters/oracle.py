"""A drafter that knows the answer: the ceiling of drafting, for benchmarks."""

from __future__ import annotations

import numpy as np

from ngramcache._validate import as_tokens
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.base import Proposal, SequenceDrafter, Source

__all__ = ["OracleDrafter"]


class OracleDrafter(SequenceDrafter):
    """Proposes the true continuation (taken from a reference run): the ceiling any
    drafter can reach with the same verification costs. For benchmarks. Once the
    verified text departs from the continuation it proposes nothing."""

    def __init__(self, continuation, n_draft: int = N_DRAFT):
        super().__init__(n_draft)
        self.continuation = as_tokens(continuation, "continuation")
        self._n_prompt = 0
        self._departed = False

    def reset(self, prompt_tokens) -> None:
        """Start a new sequence; the continuation follows ``prompt_tokens``."""
        super().reset(prompt_tokens)

    def _reset_index(self) -> None:
        self._n_prompt = self.tokens.size
        self._departed = False

    def _appended(self, n_new: int) -> None:
        if self._departed:
            return
        seq = self.tokens
        start = seq.size - n_new - self._n_prompt
        new = seq[seq.size - n_new :]
        self._departed = not np.array_equal(new, self.continuation[start : start + n_new])

    def _candidates(self, n: int) -> Proposal:
        if self._departed:
            return Proposal(np.zeros(0, dtype=np.int32), 0, Source.LOOKUP)
        start = self.tokens.size - self._n_prompt
        out = self.continuation[start : start + n]
        return Proposal(out, int(out.size), Source.LOOKUP)

    def __repr__(self) -> str:
        return f"<OracleDrafter n_draft={self.n_draft}, {self.continuation.size} tokens of continuation>"
