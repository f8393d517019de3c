"""A Drafter inside someone else's decoding loop.

llama-cpp-python's draft-model interface and transformers' candidate generators hand the
drafter the whole sequence at every step (the verified tokens, plus the model's newest
one), while a ``Drafter`` wants the new tokens only. :class:`SequenceFollower` sits in
between: when the sequence extends the one it saw last, only the new tokens go to the
drafter (``accept``); otherwise (a new request, a rewind) the drafter restarts from the
sequence (``reset``, counted in ``resets``). The comparison is a memcmp of the previous
sequence, microseconds at 32k tokens; everything else is proportional to the new tokens.
It also scores the drafts handed out against the tokens that followed them.
"""

from __future__ import annotations

import numpy as np

from ngramcache._validate import as_tokens
from ngramcache._prefix import accepted_prefix
from ngramcache.drafters.base import Drafter, DraftStats

__all__ = ["SequenceFollower", "Following"]

_EMPTY = np.zeros(0, dtype=np.int32)


class SequenceFollower:
    """Keeps ``drafter`` in step with the sequences a foreign loop shows it.

    ``follow(ids)`` before drafting (and whenever the loop reports its verified tokens);
    ``handed_out(draft)`` after giving the loop a draft: once the sequence has moved past
    it, ``drafted`` grows by its length and ``accepted`` by the part that the verifier
    kept. ``forget()`` makes the next ``follow`` restart the drafter."""

    def __init__(self, drafter: Drafter):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
        self.drafter = drafter
        self.resets = 0  # times the sequence was not an extension of the previous one
        self.drafted = 0  # drafted tokens scored against what followed them
        self.accepted = 0
        self._seq = np.empty(1024, dtype=np.int32)
        self._n = 0
        self._draft = _EMPTY  # the draft handed out after the first _n tokens, not scored yet

    def __len__(self) -> int:
        """Tokens of the sequence the drafter has seen."""
        return self._n

    def follow(self, ids, name: str = "input_ids") -> np.ndarray:
        """Show the drafter the sequence ``ids`` (token ids, 1-D); returns them as int32."""
        ids = as_tokens(ids, name)
        n = self._n
        if n and ids.size >= n and np.array_equal(ids[:n], self._seq[:n]):
            if ids.size > n:
                if self._draft.size:
                    self.drafted += int(self._draft.size)
                    self.accepted += accepted_prefix(self._draft, ids[n:])
                    self._draft = _EMPTY
                self.drafter.accept(ids[n:])
        else:
            if n:
                self.resets += 1
            self._draft = _EMPTY
            self.drafter.reset(ids)
            n = 0
        if ids.size > self._seq.size:
            grown = np.empty(max(ids.size, 2 * self._seq.size), dtype=np.int32)
            grown[:n] = self._seq[:n]
            self._seq = grown
        self._seq[n : ids.size] = ids[n:]
        self._n = int(ids.size)
        return ids

    def handed_out(self, draft) -> None:
        """The draft just given to the loop after the current sequence."""
        self._draft = np.array(draft, dtype=np.int32).reshape(-1)

    def forget(self) -> None:
        """Forget the sequence: the next ``follow`` restarts the drafter."""
        self._n = 0
        self._draft = _EMPTY


class Following:
    """What an adapter around a :class:`SequenceFollower` (``self._follower``) shows: the
    ``drafter``, its ``stats``, and the follower's ``resets``, ``drafted`` and ``accepted``."""

    _follower: SequenceFollower

    @property
    def drafter(self) -> Drafter:
        """The wrapped drafter."""
        return self._follower.drafter

    @property
    def stats(self) -> DraftStats:
        """The wrapped drafter's counters."""
        return self._follower.drafter.stats

    @property
    def resets(self) -> int:
        """Times a sequence was not an extension of what the drafter had seen."""
        return self._follower.resets

    @property
    def drafted(self) -> int:
        """Drafted tokens handed out and verified since."""
        return self._follower.drafted

    @property
    def accepted(self) -> int:
        """Drafted tokens that verification kept."""
        return self._follower.accepted
