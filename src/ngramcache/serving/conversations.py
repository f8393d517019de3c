"""The drafting gate's state per conversation.

A chat's next request repeats its whole history: the previous prompt and the answer, then the
new message. How well drafts did in the earlier turns (the copy of a function the user is
editing is accepted turn after turn; a conversation about fresh ideas rejects nearly every
draft) is the best guide to the next turn from its first step, so the server keeps each
conversation's ``Gate`` and hands it to the request that continues it. A request
continues a conversation when the text it was given (its prompt and answer) is a prefix of
the new prompt, up to a few tokens that a chat template may render differently the second
time (the end of the answer).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

import numpy as np

from ngramcache.decoding.gate import Gate

__all__ = ["ConversationGates"]

#: tokens at the end of a turn's text that may differ when the next prompt renders it
#: (a template that trims the answer, or closes the turn with other tokens)
TAIL_SLACK = 8


class ConversationGates:
    """The gates of the ``capacity`` most recent conversations, each under the text it has
    seen (prompt and answer) and a key (the drafter and its draft length: a gate is built
    for one drafter's sources and one length)."""

    def __init__(self, capacity: int = 64):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._gates: OrderedDict[int, tuple[Hashable, np.ndarray, Gate]] = OrderedDict()
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._gates)

    def find(self, prompt: np.ndarray, key: Hashable) -> Gate | None:
        """The gate of the conversation ``prompt`` continues (the longest one), removed
        from the store until :meth:`keep` puts it back; None for a new conversation."""
        best, best_len = None, 0
        for gid, (k, seen, _) in self._gates.items():
            if k != key:
                continue
            need = max(1, seen.size - TAIL_SLACK)
            if need > best_len and prompt.size >= need and np.array_equal(prompt[:need], seen[:need]):
                best, best_len = gid, need
        if best is None:
            return None
        return self._gates.pop(best)[2]

    def keep(self, seen: np.ndarray, key: Hashable, gate: Gate) -> None:
        """Keep ``gate`` for the conversation whose text so far is ``seen``."""
        self._gates[self._next_id] = (key, np.asarray(seen, dtype=np.int32).copy(), gate)
        self._next_id += 1
        while len(self._gates) > self.capacity:
            self._gates.popitem(last=False)
